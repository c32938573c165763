# ruff: noqa: F821, F722  (Tensor["M", "K", ...] dims are strings, not names)
"""What each rank runs in the torch.distributed tests (started with the spawn method, gloo on
localhost). Each scenario returns plain data; the test process asserts on it."""

# No `from __future__ import annotations`: the kernels' annotations are evaluated at definition.
import datetime
import os
import time
import traceback

import numpy as np

import tessera as ts
from tessera import Tensor, ops
from tessera.distributed import zigzag_piece

SHAPES = {"M": 16, "D": 32, "F": 64}


def _kernels():
    @ts.kernel
    def mlp(
        X: Tensor["M", "D", ts.f32], W1: Tensor["D", "F", ts.f32], b1: Tensor["F", ts.f32], W2: Tensor["F", "D", ts.f32]
    ) -> Tensor["M", "D", ts.f32]:
        return ops.matmul(ops.gelu(ops.matmul(X, W1) + b1), W2)

    @ts.kernel
    def attention(
        Q: Tensor["B", "H", "S", "E", ts.f32],
        K: Tensor["B", "G", "S", "E", ts.f32],
        V: Tensor["B", "G", "S", "E", ts.f32],
    ) -> Tensor["B", "H", "S", "E", ts.f32]:
        return ops.flash_attention(Q, K, V, causal=True)

    @ts.kernel
    def three(
        X: Tensor["M", "F", ts.f32],
        A: Tensor["F", "D", ts.f32],
        B: Tensor["F", "D", ts.f32],
        C: Tensor["F", "D", ts.f32],
    ):
        return ops.matmul(X, A), ops.matmul(X, B), ops.matmul(X, C)

    return mlp, attention, three


def _arrays(rng, kernel, shapes):
    return [rng.standard_normal(tuple(shapes[d] for d in t.dims)).astype(np.float32) * 0.5 for _, t in kernel.params]


def scenario_mlp(rank: int, world: int) -> dict:
    mlp, _, _ = _kernels()
    sharded = ts.shard(mlp, ts.Mesh({"tp": world}), {"W1": ts.Split("F"), "b1": ts.Split("F"), "W2": ts.Split("F")})
    arrays = _arrays(np.random.default_rng(0), mlp, SHAPES)  # the same on every rank
    k = ts.compile(sharded, target="cpu")
    out = k(*sharded.local_arrays(arrays, rank))
    ref = mlp.reference(*arrays)
    collectives = k.stats["collectives"]
    import torch

    as_torch = k(*[torch.from_numpy(a) for a in sharded.local_arrays(arrays, rank)])  # torch in, torch out
    return {
        "err": float(np.abs(out - ref).max()),
        "torch_err": float(np.abs(as_torch.numpy() - ref).max()) if isinstance(as_torch, torch.Tensor) else None,
        "collectives": collectives,
        "graph": k.inspect_ir("graph"),
    }


def scenario_residual(rank: int, world: int) -> dict:
    """A residual after the row-parallel matmul: the all-reduce runs between two of the kernels."""

    @ts.kernel
    def block(X: Tensor["M", "D", ts.f32], W1: Tensor["D", "F", ts.f32], W2: Tensor["F", "D", ts.f32]):
        return ops.relu(X + ops.matmul(ops.gelu(ops.matmul(X, W1)), W2))

    sharded = ts.shard(block, ts.Mesh({"tp": world}), {"W1": ts.Split("F"), "W2": ts.Split("F")})
    arrays = _arrays(np.random.default_rng(7), block, SHAPES)
    k = ts.compile(sharded, target="cpu")
    out = k(*sharded.local_arrays(arrays, rank))
    inner = [c.after for c in k.collectives if c.output < 0]
    return {
        "err": float(np.abs(out - block.reference(*arrays)).max()),
        "inner": inner,
        "issued": k.stats["collectives"],
    }


def scenario_attention(rank: int, world: int) -> dict:
    _, attention, _ = _kernels()
    shapes = {"B": 1, "H": 2 * world, "G": world, "S": 24, "E": 16}
    sharded = ts.shard(attention, ts.Mesh({"tp": world}), {n: ts.Split(1) for n in ("Q", "K", "V")})
    arrays = _arrays(np.random.default_rng(1), attention, shapes)
    k = ts.compile(sharded, target="cpu")
    out = k(*sharded.local_arrays(arrays, rank))  # heads gathered back (the output is replicated)
    return {"err": float(np.abs(out - attention.reference(*arrays)).max()), "shape": list(out.shape)}


def scenario_sequence_parallel(rank: int, world: int) -> dict:
    """Megatron sequence parallelism in one kernel: the rows of X are split; the norm runs on each
    rank's rows, they are all-gathered for the column-parallel matmul, and the row-parallel partial
    sum is reduce-scattered onto the residual's rows."""

    @ts.kernel
    def block(
        X: Tensor["S", "D", ts.f32], g: Tensor["D", ts.f32], W1: Tensor["D", "F", ts.f32], W2: Tensor["F", "D", ts.f32]
    ) -> Tensor["S", "D", ts.f32]:
        return X + ops.matmul(ops.gelu(ops.matmul(ops.rms_norm(X, g), W1)), W2)

    specs = {"X": ts.Split("S"), "W1": ts.Split("F"), "W2": ts.Split("F")}
    shapes = {"S": 32, "D": 32, "F": 64}
    arrays = _arrays(np.random.default_rng(8), block, shapes)
    ref = block.reference(*arrays)
    rows = ts.shard(block, ts.Mesh({"tp": world}), specs, outputs=ts.Split("S"))
    k = ts.compile(rows, target="cpu")
    out = k(*rows.local_arrays(arrays, rank))
    import torch

    as_torch = k(*[torch.from_numpy(a) for a in rows.local_arrays(arrays, rank)])
    whole = ts.shard(block, ts.Mesh({"tp": world}), specs)  # the result's rows gathered at the output
    k_whole = ts.compile(whole, target="cpu")
    out_whole = k_whole(*whole.local_arrays(arrays, rank))
    return {
        "err": float(np.abs(out - np.split(ref, world, axis=0)[rank]).max()),
        "torch_err": float(np.abs(as_torch.numpy() - np.split(ref, world, axis=0)[rank]).max()),
        "issued": k.stats["collectives"],
        "kinds": [(c.kind, c.output) for c in k.collectives],
        "sched": k.inspect_ir("sched"),
        "whole_err": float(np.abs(out_whole - ref).max()),
        "whole_shape": list(out_whole.shape),
    }


def scenario_sum_read_twice(rank: int, world: int) -> dict:
    """A partial sum that is both an output and read by a residual: summed once between the kernels
    (on a copy) and once at the output, neither summing the other's result again."""

    @ts.kernel
    def two(X: Tensor["M", "D", ts.f32], W1: Tensor["D", "F", ts.f32], W2: Tensor["F", "D", ts.f32]):
        h = ops.matmul(ops.relu(ops.matmul(X, W1)), W2)
        return h, X + h

    sharded = ts.shard(two, ts.Mesh({"tp": world}), {"W1": ts.Split("F"), "W2": ts.Split("F")})
    arrays = _arrays(np.random.default_rng(13), two, SHAPES)
    k = ts.compile(sharded, target="cpu")
    h, r = k(*sharded.local_arrays(arrays, rank))
    ref_h, ref_r = two.reference(*arrays)
    return {
        "err": max(float(np.abs(h - ref_h).max()), float(np.abs(r - ref_r).max())),
        "kinds": [(c.kind, c.output) for c in k.collectives],
    }


def scenario_every_split(rank: int, world: int) -> dict:
    """A transformer MLP block under every sharding ts.shard accepts (15: X whole, split on its rows
    or on D; the weights whole, split on F or on D; the result whole or split on S or D): each runs
    and matches numpy (or is refused with a ShardingError naming the op)."""
    import itertools

    from tessera_tvm.graph.sharding import ShardingError

    @ts.kernel
    def block(
        X: Tensor["S", "D", ts.f32], g: Tensor["D", ts.f32], W1: Tensor["D", "F", ts.f32], W2: Tensor["F", "D", ts.f32]
    ) -> Tensor["S", "D", ts.f32]:
        return X + ops.matmul(ops.gelu(ops.matmul(ops.rms_norm(X, g), W1)), W2)

    shapes = {"S": 16, "D": 32, "F": 64}
    arrays = _arrays(np.random.default_rng(14), block, shapes)
    ref = block.reference(*arrays)
    by_d = {"X": ts.Split("D"), "g": ts.Split("D"), "W1": ts.Split("D"), "W2": ts.Split("D")}
    inputs = [by_d] + [
        {**({"X": ts.Split("S")} if rows else {}), **({"W1": ts.Split("F"), "W2": ts.Split("F")} if cols else {})}
        for rows, cols in itertools.product([False, True], repeat=2)
    ]
    results = []
    for specs, out_dim in itertools.product(inputs, [None, "S", "D"]):
        what = f"{sorted((n, s.dim) for n, s in specs.items())} -> {out_dim}"
        try:
            sharded = ts.shard(
                block, ts.Mesh({"tp": world}), specs, outputs=None if out_dim is None else ts.Split(out_dim)
            )
            k = ts.compile(sharded, target="cpu")
            out = k(*sharded.local_arrays(arrays, rank))
        except ShardingError as exc:
            results.append((what, "refused", str(exc)))
            continue
        want = (
            ref
            if out_dim is None
            else np.split(ref, world, axis=0 if out_dim == "S" else 1)[sharded.mesh.coords(rank)["tp"]]
        )
        err = float(np.abs(out - want).max()) if out.shape == want.shape else float("inf")
        results.append((what, "ran", err, [c.kind for c in k.collectives]))
    return {"results": results}


def scenario_sequence_attention(rank: int, world: int) -> dict:
    """The query sequence split, keys and values gathered; and a softmax over a split row."""

    @ts.kernel
    def attend(
        Q: Tensor["B", "H", "S", "E", ts.f32],
        K: Tensor["B", "H", "T", "E", ts.f32],
        V: Tensor["B", "H", "T", "E", ts.f32],
    ) -> Tensor["B", "H", "S", "E", ts.f32]:
        return ops.flash_attention(Q, K, V)

    @ts.kernel
    def scores(x: Tensor["M", "N", ts.f32], w: Tensor["N", "K", ts.f32]) -> Tensor["M", "K", ts.f32]:
        return ops.softmax(ops.matmul(x, w), axis=-1)

    mesh = ts.Mesh({"tp": world})
    shapes = {"B": 1, "H": 2, "S": 16 * world, "T": 8 * world, "E": 16}
    arrays = _arrays(np.random.default_rng(9), attend, shapes)
    sharded = ts.shard(attend, mesh, {"Q": ts.Split("S"), "K": ts.Split("T"), "V": ts.Split("T")})
    out = ts.compile(sharded, target="cpu")(*sharded.local_arrays(arrays, rank))
    soft_arrays = _arrays(np.random.default_rng(10), scores, {"M": 8, "N": 16, "K": 32})
    soft = ts.shard(scores, mesh, {"w": ts.Split("K")})
    soft_out = ts.compile(soft, target="cpu")(*soft.local_arrays(soft_arrays, rank))
    return {
        "err": float(np.abs(out - attend.reference(*arrays)).max()),
        "shape": list(out.shape),
        "softmax_err": float(np.abs(soft_out - scores.reference(*soft_arrays)).max()),
    }


def scenario_causal_sequence_attention(rank: int, world: int) -> dict:
    """Causal attention with the query sequence split (grouped-query, 4 query heads on 2 key
    heads): keys and values all-gathered, each rank reading them up to its last query. Left split
    on the sequence, and gathered whole."""

    @ts.kernel
    def causal(
        Q: Tensor["B", "H", "S", "E", ts.f32],
        K: Tensor["B", "G", "S", "E", ts.f32],
        V: Tensor["B", "G", "S", "E", ts.f32],
    ) -> Tensor["B", "H", "S", "E", ts.f32]:
        return ops.flash_attention(Q, K, V, causal=True)

    mesh = ts.Mesh({"sp": world})
    shapes = {"B": 1, "H": 4, "G": 2, "S": 24 * world, "E": 16}
    arrays = _arrays(np.random.default_rng(21), causal, shapes)
    ref = causal.reference(*arrays)
    split = {n: ts.Split("S") for n in ("Q", "K", "V")}
    kept = ts.shard(causal, mesh, split, outputs=ts.Split("S"))
    k = ts.compile(kept, target="cpu")
    out = k(*kept.local_arrays(arrays, rank))
    whole = ts.shard(causal, mesh, split)
    whole_out = ts.compile(whole, target="cpu")(*whole.local_arrays(arrays, rank))

    @ts.kernel
    def padded(
        Q: Tensor["B", "H", "S", "E", ts.f32],
        K: Tensor["B", "G", "S", "E", ts.f32],
        V: Tensor["B", "G", "S", "E", ts.f32],
        M: Tensor["B", 1, 1, "S", ts.f32],
    ) -> Tensor["B", "H", "S", "E", ts.f32]:
        return ops.flash_attention(Q, K, V, causal=True, bias=M)  # a padding mask: gathered, then its prefix

    mask = np.zeros((1, 1, 1, shapes["S"]), np.float32)
    mask[..., 5:9] = -np.inf
    masked = ts.shard(padded, mesh, {**split, "M": ts.Split("S")})
    masked_out = ts.compile(masked, target="cpu")(*masked.local_arrays([*arrays, mask], rank))
    return {
        "err": float(np.abs(out - np.split(ref, world, axis=2)[rank]).max()),
        "whole_err": float(np.abs(whole_out - ref).max()),
        "masked_err": float(np.abs(masked_out - padded.reference(*arrays, mask)).max()),
        "kinds": [(c.kind, c.pieces) for c in k.collectives],
        "rank": k.rank,
        "sched": k.inspect_ir("sched"),
    }


def _attention_block(causal: bool):
    """X + attention(X, K, V, with a padding mask M) W: the attention's result read by the next
    kernel, under a sequence split."""

    @ts.kernel
    def block(
        X: Tensor["B", "H", "S", "E", ts.f32],
        K: Tensor["B", "H", "S", "E", ts.f32],
        V: Tensor["B", "H", "S", "E", ts.f32],
        M: Tensor["B", 1, 1, "S", ts.f32],
        W: Tensor["E", "E", ts.f32],
    ) -> Tensor["B", "H", "S", "E", ts.f32]:
        return X + ops.matmul(ops.flash_attention(X, K, V, causal=causal, bias=M), W)

    return block


def _block_arrays(block, shapes, seed: int) -> list:
    """X, K, V (from ``seed``), a padding mask with keys 3 .. 6 masked (in rank 0's first piece and
    beyond) and W (from ``seed + 1``) for :func:`_attention_block`."""
    x, kk, v = _arrays(np.random.default_rng(seed), block, {**shapes, 1: 1})[:3]
    mask = np.zeros((1, 1, 1, shapes["S"]), np.float32)
    mask[..., 3:7] = -np.inf
    w = np.random.default_rng(seed + 1).standard_normal((16, 16)).astype(np.float32) * 0.2
    return [x, kk, v, mask, w]


def scenario_zigzag_attention(rank: int, world: int) -> dict:
    """Causal attention with the sequence split load-balanced (zigzag): rank c holds pieces c and
    2n - 1 - c of 2n, and computes each half of its queries against the keys up to its last query.
    Alone (left split, and gathered whole), inside a block whose next kernel reads the joined
    halves, and with a padding mask."""
    _, causal, _ = _kernels()  # causal grouped-query attention

    block = _attention_block(causal=True)

    mesh = ts.Mesh({"cp": world})
    shapes = {"B": 1, "H": 4, "G": 2, "S": 16 * world, "E": 16}
    arrays = _arrays(np.random.default_rng(23), causal, shapes)
    ref = causal.reference(*arrays)
    zig = ts.Split("S", zigzag=True)
    kept = ts.shard(causal, mesh, dict.fromkeys("QKV", zig), outputs=zig)
    k = ts.compile(kept, target="cpu")
    out = k(*kept.local_arrays(arrays, rank))
    mine = zigzag_piece(ref, 2, world, rank, True)  # this rank's two pieces of the whole result
    whole = ts.shard(causal, mesh, dict.fromkeys("QKV", zig))
    whole_out = ts.compile(whole, target="cpu")(*whole.local_arrays(arrays, rank))

    x, kk, v, mask, w = _block_arrays(block, shapes, 24)
    sharded_block = ts.shard(block, mesh, {"X": zig, "K": zig, "V": zig, "M": zig})
    block_out = ts.compile(sharded_block, target="cpu")(*sharded_block.local_arrays([x, kk, v, mask, w], rank))
    mesh_err = None
    if world == 4:  # a 2 x 2 mesh: the batch over "dp", the sequence zigzag over "cp"
        two = {"B": 2, "H": 4, "G": 2, "S": 32, "E": 16}
        both = _arrays(np.random.default_rng(26), causal, two)
        split = [ts.Split("B", "dp"), ts.Split("S", "cp", zigzag=True)]
        on_mesh = ts.shard(causal, ts.Mesh({"dp": 2, "cp": 2}), dict.fromkeys("QKV", split))
        mesh_out = ts.compile(on_mesh, target="cpu")(*on_mesh.local_arrays(both, rank))
        mesh_err = float(np.abs(mesh_out - causal.reference(*both)).max())
    return {
        "mesh_err": mesh_err,
        "err": float(np.abs(out - mine).max()),
        "shape": list(out.shape),
        "whole_err": float(np.abs(whole_out - ref).max()),
        "block_err": float(np.abs(block_out - block.reference(x, kk, v, mask, w)).max()),
        "kinds": [(c.kind, c.pieces) for c in k.collectives],
        "sched": k.inspect_ir("sched"),
    }


def scenario_ulysses_attention(rank: int, world: int) -> dict:
    """attention="all_to_all" (DeepSpeed-Ulysses): Q, K and V split on the sequence are re-split on
    the heads, each rank attends over the whole sequence for its heads, and the result is split on
    the sequence again. Causal grouped-query attention (one graph for every rank), left split and
    gathered whole; a block with a padding mask, a projection and a residual; a zigzag split; and
    heads that do not divide over the ranks, refused by name."""
    _, causal, _ = _kernels()  # causal grouped-query attention

    block = _attention_block(causal=False)

    mesh = ts.Mesh({"sp": world})
    seq = ts.Split("S")
    shapes = {"B": 1, "H": 2 * world, "G": world, "S": 16 * world, "E": 16}
    arrays = _arrays(np.random.default_rng(31), causal, shapes)
    ref = causal.reference(*arrays)
    kept = ts.shard(causal, mesh, dict.fromkeys("QKV", seq), outputs=seq, attention="all_to_all")
    k = ts.compile(kept, target="cpu")
    out = k(*kept.local_arrays(arrays, rank))
    whole = ts.shard(causal, mesh, dict.fromkeys("QKV", seq), attention="all_to_all")
    whole_out = ts.compile(whole, target="cpu")(*whole.local_arrays(arrays, rank))

    x, kk, v, mask, w = _block_arrays(block, shapes, 32)
    sharded_block = ts.shard(block, mesh, {"X": seq, "K": seq, "V": seq, "M": seq}, attention="all_to_all")
    block_k = ts.compile(sharded_block, target="cpu")
    block_out = block_k(*sharded_block.local_arrays([x, kk, v, mask, w], rank))

    zig = ts.Split("S", zigzag=True)
    four = {**shapes, "H": 4 * world, "G": 2 * world}  # 2n zigzag pieces of the heads too
    zz_arrays = _arrays(np.random.default_rng(34), causal, four)
    zz = ts.shard(causal, mesh, dict.fromkeys("QKV", zig), outputs=zig, attention="all_to_all")
    zz_out = ts.compile(zz, target="cpu")(*zz.local_arrays(zz_arrays, rank))
    zz_want = zigzag_piece(causal.reference(*zz_arrays), 2, world, rank, True)
    zz_whole = ts.shard(causal, mesh, dict.fromkeys("QKV", zig), attention="all_to_all")  # heads gathered
    zz_whole_k = ts.compile(zz_whole, target="cpu")
    zz_whole_out = zz_whole_k(*zz_whole.local_arrays(zz_arrays, rank))

    @ts.kernel
    def two_kv_heads(
        Q: Tensor["B", 8, "S", "E", ts.f32], K: Tensor["B", 2, "S", "E", ts.f32], V: Tensor["B", 2, "S", "E", ts.f32]
    ) -> Tensor["B", 8, "S", "E", ts.f32]:
        return ops.flash_attention(Q, K, V, causal=True)

    # two key/value heads over n (or 2n zigzag) pieces: each repeated on each rank before its all-to-all
    # (in a row: query heads 0-3 read key/value head 0, as without the split)
    rng = np.random.default_rng(37)
    mqa = [rng.standard_normal((1, h, 16 * world, 16)).astype(np.float32) for h in (8, 2, 2)]
    mqa_ref = two_kv_heads.reference(*mqa)
    few_kv = {}
    for split in (seq, zig):
        sharded_mqa = ts.shard(two_kv_heads, mesh, dict.fromkeys("QKV", split), outputs=split, attention="all_to_all")
        mqa_k = ts.compile(sharded_mqa, target="cpu")
        got = mqa_k(*sharded_mqa.local_arrays(mqa, rank))
        want = zigzag_piece(mqa_ref, 2, world, rank, split.zigzag)
        few_kv["zigzag" if split.zigzag else "contiguous"] = {
            "err": float(np.abs(got - want).max()),
            "kinds": [(c.kind, c.pieces) for c in mqa_k.collectives if c.kind in ("repeat", "all_to_all")],
            "sched": mqa_k.inspect_ir("sched"),
        }

    mesh_err = mesh_kinds = None
    if world == 4:  # a 2 x 2 mesh: the batch over "dp", the sequence over "sp", re-split on the heads
        two = {"B": 2, "H": 4, "G": 2, "S": 32, "E": 16}
        both = _arrays(np.random.default_rng(36), causal, two)
        split = [ts.Split("B", "dp"), ts.Split("S", "sp")]
        on_mesh = ts.shard(causal, ts.Mesh({"dp": 2, "sp": 2}), dict.fromkeys("QKV", split), attention="all_to_all")
        mesh_k = ts.compile(on_mesh, target="cpu")
        mesh_out = mesh_k(*on_mesh.local_arrays(both, rank))
        mesh_err = float(np.abs(mesh_out - causal.reference(*both)).max())
        mesh_kinds = [(c.kind, c.axis, c.dim) for c in mesh_k.collectives]
    refused = None
    odd = {**shapes, "H": 3 * world, "G": 3}  # 3 key/value heads over the ranks
    try:  # the CPU binds the heads per call: the all-to-all refuses them before sending anything
        ts.compile(whole, target="cpu")(*whole.local_arrays(_arrays(np.random.default_rng(35), causal, odd), rank))
    except Exception as exc:  # noqa: BLE001 - the test asserts on its words
        refused = f"{type(exc).__name__}: {exc}"
    return {
        "err": float(np.abs(out - zigzag_piece(ref, 2, world, rank, False)).max()),
        "shape": list(out.shape),
        "whole_err": float(np.abs(whole_out - ref).max()),
        "block_err": float(np.abs(block_out - block.reference(x, kk, v, mask, w)).max()),
        "zigzag_err": float(np.abs(zz_out - zz_want).max()),
        "zigzag_whole_err": float(np.abs(zz_whole_out - causal.reference(*zz_arrays)).max()),
        "whole_kinds": [(c.kind, c.dim) for c in zz_whole_k.collectives],
        "mesh_err": mesh_err,
        "mesh_kinds": mesh_kinds,
        "few_kv": few_kv,
        "kinds": [(c.kind, c.dim, c.from_dim) for c in k.collectives],
        "block_kinds": [(c.kind, c.value_name) for c in block_k.collectives],
        "refused": refused,
        "sched": k.inspect_ir("sched"),
    }


def scenario_resplit(rank: int, world: int) -> dict:
    """A result split on its rows, wanted split on its columns: one all-to-all (contiguous, and zigzag,
    where the columns are cut into zigzag pieces too)."""

    @ts.kernel
    def norm_rows(x: Tensor["M", "N", ts.f32], w: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
        return ops.rms_norm(x, w)

    mesh = ts.Mesh({"tp": world})
    arrays = _arrays(np.random.default_rng(27), norm_rows, {"M": 8 * world, "N": 16 * world})
    ref = norm_rows.reference(*arrays)
    out = {}
    for name, rows in (("contiguous", ts.Split("M")), ("zigzag", ts.Split("M", zigzag=True))):
        sharded = ts.shard(norm_rows, mesh, {"x": rows}, outputs=ts.Split("N"))
        k = ts.compile(sharded, target="cpu")
        got = k(*sharded.local_arrays(arrays, rank))
        want = zigzag_piece(ref, 1, world, rank, name == "zigzag")
        out[name] = (float(np.abs(got - want).max()), [c.kind for c in k.collectives], k.stats["collectives"])
    return out


def scenario_gpu_sequence_parallel(rank: int, world: int) -> dict:
    """The sequence-parallel block on the GPU (hopper): the values between the kernels stay torch
    tensors on the device, and the collectives run through NCCL."""
    import torch

    @ts.kernel
    def block(
        X: Tensor["S", "D", ts.bf16],
        g: Tensor["D", ts.bf16],
        W1: Tensor["D", "F", ts.bf16],
        W2: Tensor["F", "D", ts.bf16],
    ) -> Tensor["S", "D", ts.bf16]:
        return X + ops.matmul(ops.gelu(ops.matmul(ops.rms_norm(X, g), W1)), W2)

    specs = {"X": ts.Split("S"), "W1": ts.Split("F"), "W2": ts.Split("F")}
    shapes = {"S": 128 * world, "D": 128, "F": 256}
    rng = np.random.default_rng(11)
    arrays = [
        (rng.standard_normal(tuple(shapes[d] for d in t.dims)) * 0.1).astype(ts.bf16.numpy) for _, t in block.params
    ]
    ref = ts.compile(block, target="cpu")(*arrays).astype(np.float32)
    sharded = ts.shard(block, ts.Mesh({"tp": world}), specs, outputs=ts.Split("S"))
    k = ts.compile(sharded, target="hopper", shapes=shapes)  # the global shapes; each rank compiles its part
    local = [
        torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16).cuda() for a in sharded.local_arrays(arrays, rank)
    ]
    out = k(*local)
    issued = k.stats["collectives"]
    whole = ts.shard(block, ts.Mesh({"tp": world}), specs)  # rows gathered at the output
    k_whole = ts.compile(whole, target="hopper", shapes=shapes)
    pending = k_whole(*local, wait=False)  # the gather on the communication stream
    other = torch.randn(256, 256, device="cuda") @ torch.randn(256, 256, device="cuda")  # queued meanwhile
    gathered = pending.result()
    return {
        "err": float((out.float().cpu().numpy() - np.split(ref, world, axis=0)[rank]).__abs__().max()),
        "cuda": bool(out.is_cuda) and bool(gathered.is_cuda),
        "issued": issued,
        "whole_err": float((gathered.float().cpu().numpy() - ref).__abs__().max()),
        "whole_shape": list(gathered.shape),
        "other": bool(torch.isfinite(other).all()),
    }


def scenario_gpu_zigzag_attention(rank: int, world: int) -> dict:
    """Causal attention split zigzag on the GPU (hopper, bf16): the halves, the keys' prefixes and the
    join on torch CUDA tensors, the keys gathered through NCCL. One GPU: one rank holding both pieces."""
    import torch

    @ts.kernel
    def causal(
        Q: Tensor["B", "H", "S", "E", ts.bf16],
        K: Tensor["B", "H", "S", "E", ts.bf16],
        V: Tensor["B", "H", "S", "E", ts.bf16],
    ) -> Tensor["B", "H", "S", "E", ts.bf16]:
        return ops.flash_attention(Q, K, V, causal=True)

    shapes = {"B": 1, "H": 4, "S": 256 * world, "E": 64}
    rng = np.random.default_rng(12)
    qkv = [torch.from_numpy(rng.standard_normal((1, 4, shapes["S"], 64)).astype(np.float32)) for _ in range(3)]
    qkv = [t.to(torch.bfloat16).cuda() for t in qkv]
    ref = torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=True)
    zig = ts.Split("S", zigzag=True)
    sharded = ts.shard(causal, ts.Mesh({"cp": world}), dict.fromkeys("QKV", zig), outputs=zig)
    k = ts.compile(sharded, target="hopper", shapes=shapes)
    out = k(*[zigzag_piece(t, 2, world, rank, True).contiguous() for t in qkv])
    want = zigzag_piece(ref, 2, world, rank, True)
    return {
        "err": float((out.float() - want.float()).abs().max()),
        "cuda": bool(out.is_cuda),
        "kinds": [c.kind for c in k.collectives],
    }


def scenario_gpu_ulysses_attention(rank: int, world: int) -> dict:
    """attention="all_to_all" on the GPU (hopper, bf16): Q, K, V and the result all-to-all'd as torch
    CUDA tensors through NCCL."""
    import torch

    @ts.kernel
    def causal(
        Q: Tensor["B", "H", "S", "E", ts.bf16],
        K: Tensor["B", "H", "S", "E", ts.bf16],
        V: Tensor["B", "H", "S", "E", ts.bf16],
    ) -> Tensor["B", "H", "S", "E", ts.bf16]:
        return ops.flash_attention(Q, K, V, causal=True)

    shapes = {"B": 1, "H": 4 * world, "S": 256 * world, "E": 64}
    rng = np.random.default_rng(13)
    qkv = [torch.from_numpy(rng.standard_normal((1, 4 * world, shapes["S"], 64)).astype(np.float32)) for _ in range(3)]
    qkv = [t.to(torch.bfloat16).cuda() for t in qkv]
    ref = torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=True)
    seq = ts.Split("S")
    sharded = ts.shard(causal, ts.Mesh({"sp": world}), dict.fromkeys("QKV", seq), outputs=seq, attention="all_to_all")
    k = ts.compile(sharded, target="hopper", shapes=shapes)
    out = k(*[zigzag_piece(t, 2, world, rank, False).contiguous() for t in qkv])
    want = zigzag_piece(ref, 2, world, rank, False)
    return {
        "err": float((out.float() - want.float()).abs().max()),
        "cuda": bool(out.is_cuda),
        "kinds": [c.kind for c in k.collectives],
    }


def scenario_buckets(rank: int, world: int) -> dict:
    _, _, three = _kernels()
    arrays = _arrays(np.random.default_rng(2), three, SHAPES)
    refs = three.reference(*arrays)
    counts = {}
    for mb in (16.0, 1e-6):  # all three in one bucket; one bucket each
        sharded = ts.shard(
            three, ts.Mesh({"tp": world}), {n: ts.Split("F") for n in ("X", "A", "B", "C")}, bucket_mb=mb
        )
        k = ts.compile(sharded, target="cpu")
        outs = k(*sharded.local_arrays(arrays, rank))
        counts[str(mb)] = k.stats["collectives"]
        counts[f"err{mb}"] = max(float(np.abs(o - r).max()) for o, r in zip(outs, refs, strict=True))
    return counts


def scenario_overlap(rank: int, world: int) -> dict:
    mlp, _, _ = _kernels()
    sharded = ts.shard(mlp, ts.Mesh({"tp": world}), {"W1": ts.Split("F"), "b1": ts.Split("F"), "W2": ts.Split("F")})
    arrays = _arrays(np.random.default_rng(3), mlp, SHAPES)
    k = ts.compile(sharded, target="cpu")
    local = sharded.local_arrays(arrays, rank)
    k(*local)  # warm: compiled and bound
    if rank != 0:
        time.sleep(1.0)  # rank 0's collective waits for this rank
    start = time.perf_counter()
    pending = k(*local, wait=False)
    returned = time.perf_counter() - start
    in_flight = not pending.done()
    computed = 0
    other = ts.compile(mlp, target="cpu")  # independent work on this rank while the collective is pending
    while time.perf_counter() - start < 0.5:
        other(*arrays)
        computed += 1
    out = pending.result()
    return {
        "returned_s": returned,
        "in_flight": in_flight,
        "computed": computed,
        "total_s": time.perf_counter() - start,
        "err": float(np.abs(out - mlp.reference(*arrays)).max()),
    }


def scenario_mesh_2d(rank: int, world: int) -> dict:
    mlp, _, _ = _kernels()
    mesh = ts.Mesh({"dp": 2, "tp": world // 2})
    specs = {"X": ts.Split("M", "dp"), "W1": ts.Split("F", "tp"), "b1": ts.Split("F", "tp"), "W2": ts.Split("F", "tp")}
    sharded = ts.shard(mlp, mesh, specs, outputs=ts.Split("M", "dp"))  # rows stay split over dp
    arrays = _arrays(np.random.default_rng(4), mlp, SHAPES)
    k = ts.compile(sharded, target="cpu")
    out = k(*sharded.local_arrays(arrays, rank))
    rows = np.split(mlp.reference(*arrays), 2, axis=0)[mesh.coords(rank)["dp"]]
    return {"err": float(np.abs(out - rows).max()), "shape": list(out.shape), "collectives": k.stats["collectives"]}


def _mlp_with_timeout(world: int, timeout: float, seed: int):
    """The tensor-parallel MLP with a collective timeout, compiled, and its whole arguments."""
    mlp, _, _ = _kernels()
    specs = {"W1": ts.Split("F"), "b1": ts.Split("F"), "W2": ts.Split("F")}
    sharded = ts.shard(mlp, ts.Mesh({"tp": world}), specs, timeout=timeout)
    return sharded, ts.compile(sharded, target="cpu"), _arrays(np.random.default_rng(seed), mlp, SHAPES)


def scenario_timeout(rank: int, world: int) -> dict:
    sharded, k, arrays = _mlp_with_timeout(world, 2.0, 5)
    if rank != 0:  # hung: never enters the collective (the last scenario: it then stays alive,
        return {"skipped": True}  # waiting in run() for the test's release, while rank 0 waits)
    start = time.perf_counter()
    try:
        k(*sharded.local_arrays(arrays, rank))
    except ts.CollectiveError as exc:
        return {"error": str(exc), "seconds": time.perf_counter() - start}
    return {"error": None}


def scenario_hung_last(rank: int, world: int) -> dict:
    """The last rank hangs; every other rank names it in its error."""
    sharded, k, arrays = _mlp_with_timeout(world, 2.0, 12)
    if rank == world - 1:  # hung, as in scenario_timeout
        return {"skipped": True}
    try:
        k(*sharded.local_arrays(arrays, rank))
    except ts.CollectiveError as exc:
        return {"error": str(exc)}
    return {"error": None}


def scenario_killed(rank: int, world: int) -> dict:
    sharded, k, arrays = _mlp_with_timeout(world, 5.0, 6)
    if rank != 0:
        os._exit(3)  # a dead rank
    time.sleep(0.5)
    start = time.perf_counter()
    try:
        k(*sharded.local_arrays(arrays, rank))
    except ts.CollectiveError as exc:
        return {"error": str(exc), "seconds": time.perf_counter() - start}
    return {"error": None}


def run(rank: int, world: int, port: int, scenarios: list[str], results, backend: str = "gloo", released=None) -> None:
    """A rank: join the process group, run the scenarios, report {scenario: data or an exception}, and
    stay until ``released`` is set (rank 0 holds the process group's store: a rank that is still
    naming the hung ranks of a failed collective reads it)."""
    import torch.distributed as dist

    os.environ.setdefault("TESSERA_REPRO_DIR", "off")
    if backend == "nccl":  # one GPU per rank, chosen before NCCL makes its communicator
        import torch

        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    out = {}
    for name in scenarios:
        try:
            out[name] = globals()[f"scenario_{name}"](rank, world)
        except Exception:  # reported to the test process
            out[name] = {"exception": traceback.format_exc()}
    results.put((rank, out))
    if released is not None:
        released.wait(120)
    if not any(n in ("timeout", "killed", "hung_last") for n in scenarios):
        dist.destroy_process_group()
