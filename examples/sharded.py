# ruff: noqa: F821, F722  (Tensor["M", "K", ...] dims are strings, not names)
"""A transformer MLP block sharded over the ranks of torchrun, two ways, and causal attention split
on the sequence.

    torchrun --nproc-per-node 2 examples/sharded.py [--tokens 64] [--hidden 128]

- tensor parallel: the weights split on F (column- then row-parallel), X whole on every rank: one
  all-reduce of the partial sum, between the second matmul and the residual add;
- sequence parallel: X split on its rows too: the normed rows are all-gathered before the first
  matmul and the partial sum is reduce-scattered onto X's rows, both between the kernels, and the
  result stays split on the rows;
- context parallel: causal self-attention with Q, K and V split on the sequence: the keys and values
  are all-gathered, and each rank reads them up to its last query (its own graph);
- context parallel, zigzag: the same split load-balanced (``ts.Split("S", zigzag=True)``): the
  sequence is cut into 2n pieces and rank c holds pieces c and 2n - 1 - c, so every rank computes
  the same share of the causal attention;
- context parallel, all-to-all (DeepSpeed-Ulysses, ``attention="all_to_all"``): Q, K and V are
  re-split onto the heads, every rank attends over the whole sequence for its heads, and the result
  is re-split onto the sequence (one graph for every rank; the heads must divide over the ranks).

Each rank makes the same inputs (one seed), passes its shards, and checks its result against numpy.
Rank 0 prints the collectives of each and the Schedule IR lines that name them.
"""

# No `from __future__ import annotations`: the kernel's annotations are evaluated at definition.
import argparse
import os
import sys

import numpy as np

import tessera as ts
from tessera import Tensor, ops
from tessera.distributed import zigzag_piece


@ts.kernel
def block(
    X: Tensor["S", "D", ts.f32], g: Tensor["D", ts.f32], W1: Tensor["D", "F", ts.f32], W2: Tensor["F", "D", ts.f32]
) -> Tensor["S", "D", ts.f32]:
    return X + ops.matmul(ops.gelu(ops.matmul(ops.rms_norm(X, g), W1)), W2)


@ts.kernel
def causal_attention(
    Q: Tensor["B", "H", "S", "E", ts.f32], K: Tensor["B", "H", "S", "E", ts.f32], V: Tensor["B", "H", "S", "E", ts.f32]
) -> Tensor["B", "H", "S", "E", ts.f32]:
    return ops.flash_attention(Q, K, V, causal=True)


def _inputs(kernel, shapes: dict, seed: int) -> list:
    rng = np.random.default_rng(seed)  # the same inputs on every rank
    return [(rng.standard_normal([shapes[d] for d in t.dims]) * 0.1).astype(np.float32) for _, t in kernel.params]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    args = parser.parse_args()
    if "RANK" not in os.environ:
        print("run it under torchrun: torchrun --nproc-per-node 2 examples/sharded.py", file=sys.stderr)
        return 2
    import torch.distributed as dist

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE and the rendezvous address
    rank, world = dist.get_rank(), dist.get_world_size()
    arrays = _inputs(block, {"S": args.tokens, "D": args.hidden, "F": 4 * args.hidden}, 0)
    expected = block.reference(*arrays)
    qkv = _inputs(causal_attention, {"B": 1, "H": 4, "S": args.tokens, "E": args.hidden // 4}, 1)
    mesh = ts.Mesh({"tp": world})
    weights = {"W1": ts.Split("F"), "W2": ts.Split("F")}
    zig = ts.Split("S", zigzag=True)
    zigzag = ts.shard(causal_attention, mesh, dict.fromkeys("QKV", zig), outputs=zig)
    runs = {
        "tensor parallel": (ts.shard(block, mesh, weights), arrays, expected),
        "sequence parallel": (
            ts.shard(block, mesh, {**weights, "X": ts.Split("S")}, outputs=ts.Split("S")),
            arrays,
            np.split(expected, world, axis=0)[rank],
        ),
        "context parallel": (
            ts.shard(causal_attention, mesh, {n: ts.Split("S") for n in "QKV"}, outputs=ts.Split("S")),
            qkv,
            np.split(causal_attention.reference(*qkv), world, axis=2)[rank],
        ),
        "context parallel, zigzag": (zigzag, qkv, zigzag_piece(causal_attention.reference(*qkv), 2, world, rank, True)),
        "context parallel, all-to-all": (
            ts.shard(
                causal_attention,
                mesh,
                dict.fromkeys("QKV", ts.Split("S")),
                outputs=ts.Split("S"),
                attention="all_to_all",
            ),
            qkv,
            np.split(causal_attention.reference(*qkv), world, axis=2)[rank],
        ),
    }
    failed = 0
    for name, (sharded, arrays, want) in runs.items():
        k = ts.compile(sharded, target="cpu")
        out = k(*sharded.local_arrays(arrays, rank))
        err = float(np.abs(out - want).max())
        ok = err < 1e-4
        failed += not ok
        lines = [f"rank {rank}: {name}: result {list(out.shape)}, max error {err:.1e} {'ok' if ok else 'WRONG'}"]
        if rank == 0:
            lines += [f"    {x}" for x in k.inspect_ir("sched").splitlines() if x.startswith("sched.collective")]
        sys.stdout.write("".join(f"{x}\n" for x in lines))  # one write: the ranks share the terminal
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
