"""The sharded kernels of #20 on 1 vs 2 gloo ranks, one CPU thread per rank.

    python bench/distributed.py [--tokens 512] [--hidden 1024] [--out bench/RESULTS.md]

Two kernels, each as the plain kernel on 1 rank and as ``ts.shard`` of it on 2:

- ``mlp``: gelu(X W1 + b1) W2 tensor-parallel (W1/b1 column-parallel, W2 row-parallel: one
  all-reduce of the [tokens, hidden] output);
- ``sp``: X + gelu(rms_norm(X) W1) W2 sequence-parallel (X split on its rows: an all-gather of the
  normed rows before W1 and a reduce-scatter of the partial sum onto X's rows, both between the
  kernels; the result stays split on the rows);
- ``cp``: causal self-attention context-parallel (Q, K, V split on the sequence: K and V
  all-gathered, each rank reading them up to its last query; the result stays split). With
  contiguous pieces the last rank does 3/4 of the work on 2 ranks, and sets the pace;
- ``zz``: the same attention with the sequence split zigzag (``ts.Split("M", zigzag=True)``: rank
  c holds pieces c and 2n - 1 - c of 2n), so both ranks do half of the work;
- ``a2a``: the same attention with ``attention="all_to_all"`` (DeepSpeed-Ulysses: Q, K and V
  all-to-all'd onto the heads, the whole sequence attended for half of the heads on each rank, the
  result all-to-all'd back onto the sequence), also half of the work each;
- ``a2aw``: the same, with the result wanted whole: its heads all-gathered (no all-to-all back).

Each rank is pinned to one thread (``TESSERA_NUM_THREADS=1``), so 2 ranks have twice the compute
of 1. The figures are medians of timed calls after a warm-up, on the slowest rank; the communication
share is the time a call spends in its collectives (``stats["comm_seconds"]``) divided by the call's
time, on that rank; the copies of the kinds that move no data (a zigzag split's halves, the keys'
prefixes, the join: ``stats["copy_seconds"]``) are named after it.
"""

# No `from __future__ import annotations`: the kernel in _rank has its annotations evaluated there.
import argparse
import datetime
import multiprocessing
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

REPEATS = 15


def _rank(rank: int, world: int, port: int, model: str, tokens: int, hidden: int, results) -> None:
    os.environ["TESSERA_NUM_THREADS"] = "1"
    os.environ["OMP_NUM_THREADS"] = "1"
    import numpy as np
    import torch.distributed as dist

    import tessera as ts
    from tessera import Tensor, ops
    from tessera.distributed import zigzag_piece

    @ts.kernel
    def mlp(
        X: Tensor["M", "D", ts.f32], W1: Tensor["D", "F", ts.f32], b1: Tensor["F", ts.f32], W2: Tensor["F", "D", ts.f32]
    ) -> Tensor["M", "D", ts.f32]:
        return ops.matmul(ops.gelu(ops.matmul(X, W1) + b1), W2)

    @ts.kernel
    def sp(
        X: Tensor["M", "D", ts.f32], g: Tensor["D", ts.f32], W1: Tensor["D", "F", ts.f32], W2: Tensor["F", "D", ts.f32]
    ) -> Tensor["M", "D", ts.f32]:
        return X + ops.matmul(ops.gelu(ops.matmul(ops.rms_norm(X, g), W1)), W2)

    @ts.kernel
    def cp(
        Q: Tensor["B", "H", "M", "E", ts.f32],
        K: Tensor["B", "H", "M", "E", ts.f32],
        V: Tensor["B", "H", "M", "E", ts.f32],
    ) -> Tensor["B", "H", "M", "E", ts.f32]:
        return ops.flash_attention(Q, K, V, causal=True)

    kernel = {"mlp": mlp, "sp": sp, "cp": cp, "zz": cp, "a2a": cp, "a2aw": cp}[model]
    shapes = _shapes(model, tokens, hidden)
    rng = np.random.default_rng(0)
    arrays = [
        (rng.standard_normal(tuple(shapes[d] for d in t.dims)) * 0.05).astype(np.float32) for _, t in kernel.params
    ]
    ref = kernel.reference(*arrays)
    if world == 1:
        k = ts.compile(kernel, target="cpu", shapes=shapes)
        local, comm, copies = arrays, None, []
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        specs = {"W1": ts.Split("F"), "W2": ts.Split("F")}
        if model == "mlp":
            sharded = ts.shard(mlp, ts.Mesh({"tp": world}), {**specs, "b1": ts.Split("F")})
        elif model == "cp":
            sharded = ts.shard(cp, ts.Mesh({"sp": world}), {n: ts.Split("M") for n in "QKV"}, outputs=ts.Split("M"))
            ref = np.split(ref, world, axis=2)[rank]
        elif model == "zz":
            zig = ts.Split("M", zigzag=True)
            sharded = ts.shard(cp, ts.Mesh({"sp": world}), dict.fromkeys("QKV", zig), outputs=zig)
            ref = zigzag_piece(ref, 2, world, rank, True)  # this rank's two pieces
        elif model == "a2a":
            seq = ts.Split("M")
            sharded = ts.shard(
                cp, ts.Mesh({"sp": world}), dict.fromkeys("QKV", seq), outputs=seq, attention="all_to_all"
            )
            ref = np.split(ref, world, axis=2)[rank]
        elif model == "a2aw":  # the result whole on every rank
            sharded = ts.shard(cp, ts.Mesh({"sp": world}), dict.fromkeys("QKV", ts.Split("M")), attention="all_to_all")
        else:
            sharded = ts.shard(sp, ts.Mesh({"tp": world}), {**specs, "X": ts.Split("M")}, outputs=ts.Split("M"))
            ref = np.split(ref, world, axis=0)[rank]
        k = ts.compile(sharded, target="cpu", shapes=shapes)
        local, comm, copies = sharded.local_arrays(arrays, rank), [], []
    out = k(*local)
    err = float(np.abs(out - ref).max())
    times = []
    for _ in range(REPEATS):
        if world > 1:
            dist.barrier()
        start = time.perf_counter()
        k(*local)
        times.append(time.perf_counter() - start)
        if comm is not None:
            comm.append(k.stats["comm_seconds"])
            copies.append(k.stats.get("copy_seconds", 0.0))
    if world > 1:
        dist.destroy_process_group()
    median = statistics.median
    results.put((rank, median(times), median(comm) if comm else 0.0, median(copies) if copies else 0.0, err))


def _shapes(model: str, tokens: int, hidden: int) -> dict[str, int]:
    if model in ("cp", "zz", "a2a", "a2aw"):  # a longer sequence than the MLP's tokens, heads of 64
        return {"B": 1, "H": hidden // 64, "M": 2 * tokens, "E": 64}
    return {"M": tokens, "D": hidden, "F": 4 * hidden}


def _flops(model: str, tokens: int, hidden: int) -> float:
    s = _shapes(model, tokens, hidden)
    if model in ("cp", "zz", "a2a", "a2aw"):  # two matmuls over the visible half of the scores
        return 2 * 2 * s["B"] * s["H"] * s["M"] * s["M"] * s["E"] / 2
    return 2 * 2 * s["M"] * s["D"] * s["F"]


def _run(world: int, model: str, tokens: int, hidden: int) -> tuple:
    """The slowest rank's (median time, communication seconds, copy seconds, error), and each rank's time."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_rank, args=(r, world, port, model, tokens, hidden, results)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict((r, (t, c, cp, e)) for r, t, c, cp, e in (results.get(timeout=900) for _ in range(world)))
    for p in procs:
        p.join()
    slowest = max(got, key=lambda r: got[r][0])
    return (*got[slowest], [got[r][0] for r in sorted(got)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--out", default=None, help="append the table to this file (e.g. bench/RESULTS.md)")
    parser.add_argument(
        "--only", default="mlp,sp,cp,zz,a2a,a2aw", help="kernels, comma-separated (mlp, sp, cp, zz, a2a, a2aw)"
    )
    args = parser.parse_args()
    rows, per_rank = [], []
    models = (
        ("mlp", "tensor-parallel MLP"),
        ("sp", "sequence-parallel block"),
        ("cp", "context-parallel attention"),
        ("zz", "context-parallel attention, zigzag"),
        ("a2a", "context-parallel attention, all-to-all (Ulysses)"),
        ("a2aw", "all-to-all attention, result whole"),
    )
    unknown = set(args.only.split(",")) - {m for m, _ in models}
    if unknown:
        parser.error(f"--only: unknown kernel(s) {', '.join(sorted(unknown))}; expected mlp, sp, cp, zz, a2a or a2aw")
    for model, what in models:
        if model not in args.only.split(","):
            continue
        flops = _flops(model, args.tokens, args.hidden)
        t1, _, _, e1, _ = _run(1, model, args.tokens, args.hidden)
        t2, c2, cp2, e2, each = _run(2, model, args.tokens, args.hidden)
        copied = f" (+{100 * cp2 / t2:.0f}% local copies)" if cp2 >= 0.005 * t2 else ""
        per_rank.append(f"{what}: " + ", ".join(f"rank {r} {t * 1e3:.2f} ms" for r, t in enumerate(each)))
        rows += [
            f"| {what} | 1 rank (plain kernel) | {t1 * 1e3:.2f} ms | {flops / t1 / 1e9:.1f} GFLOP/s | 1.00x | - | "
            f"{e1:.1e} |",
            f"| {what} | 2 ranks (ts.shard) | {t2 * 1e3:.2f} ms | {flops / t2 / 1e9:.1f} GFLOP/s | "
            f"{t1 / t2:.2f}x | {100 * c2 / t2:.0f}%{copied} | {e2:.1e} |",
        ]
    cpu = platform.processor() or platform.machine()
    text = "\n".join(
        [
            f"\n## Sharded kernels on torch.distributed (gloo), {datetime.date.today()}",
            "",
            f"Machine: {os.cpu_count()} cores ({cpu}); command: `python bench/distributed.py --tokens {args.tokens} "
            f"--hidden {args.hidden} --only {args.only}`. X [{args.tokens}, {args.hidden}], F = 4 x hidden, f32. Tensor-parallel MLP: "
            "gelu(X W1 + b1) W2, W1/b1/W2 split on F (one all-reduce at the output). Sequence-parallel block: "
            "X + gelu(rms_norm(X) W1) W2, X split on its rows and W1/W2 on F (an all-gather and a reduce-scatter "
            "between the kernels, the result left split). Context-parallel attention: causal, "
            f"{_shapes('cp', args.tokens, args.hidden)}, Q/K/V split on M (K and V all-gathered, each rank reading "
            "them up to its last query; the result left split); zigzag: the sequence cut into 4 pieces, rank c "
            "holding pieces c and 3 - c; all-to-all (Ulysses): Q/K/V re-split on the heads, each rank attending "
            "over the whole sequence for half of them, the result re-split on M (result whole: its heads "
            "all-gathered). One thread per rank; median of "
            f"{REPEATS} calls; the slowest rank's time; GFLOP/s counts the two matmuls (attention: the visible "
            "half of the scores).",
            "",
            "| kernel | run | time | throughput | speed-up | communication share | max error vs numpy |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            "Each rank's time on 2 ranks: " + "; ".join(per_rank) + ".",
            "",
        ]
    )
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
