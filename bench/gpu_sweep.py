"""Schedule sweep on a lent GPU (not part of the bench's figures): GEMM bf16 8192^3 and flash
attention forward bf16 (B=1 H=32 S=4096, head dim 64/128, causal and not) under a few schedules
each, against torch in the same process. It compiles every case first in a pool of processes (one
nvcc per core, filling the kernel cache), then times them one after another, so the device's time
goes to measuring. Usage: python bench/gpu_sweep.py [--out FILE] [--jobs N]"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

GEMM_N = 8192
ATTN = {"B": 1, "H": 32, "S": 4096}
GEMM_SCHEDULES = [
    {},  # the config's defaults
    {"swizzle": 10},
    {"block_n": 256, "threads": 256},
    {"block_n": 256, "threads": 256, "swizzle": 10},
    {"block_n": 256, "threads": 256, "stages": 4, "swizzle": 10},
    {"block_m": 256, "block_n": 128, "threads": 256, "swizzle": 10},
    {"block_m": 256, "block_n": 128, "threads": 256, "stages": 4, "swizzle": 10},
    {"threads": 256, "stages": 4, "swizzle": 10},
]
ATTN_SCHEDULES = [
    {},
    {"block_m": 128, "block_n": 128, "threads": 256},
    {"block_m": 128, "block_n": 64, "threads": 256},
    {"block_m": 128, "block_n": 128, "threads": 128},
    {"block_m": 128, "block_n": 64, "threads": 128},
    {"block_m": 64, "block_n": 128, "threads": 128},
    {"block_m": 128, "block_n": 128, "threads": 256, "stages": 1},
    # FlashAttention-3's overlap of softmax with the previous block's P V (asynchronous wgmma)
    {"block_m": 128, "block_n": 128, "threads": 256, "overlap": True},
    {"block_m": 128, "block_n": 128, "threads": 256, "stages": 3, "overlap": True},
    {"block_m": 128, "block_n": 64, "threads": 256, "overlap": True},
    {"block_m": 128, "block_n": 176, "threads": 256, "overlap": True},
]


def cases():
    for schedule in GEMM_SCHEDULES:
        yield ("gemm", None, False, schedule)
    for head_dim in (64, 128):
        for causal in (False, True):
            for schedule in ATTN_SCHEDULES:
                yield ("attention", head_dim, causal, schedule)


def compile_case(case):
    import bench
    import tessera as ts

    kind, head_dim, causal, schedule = case
    if kind == "gemm":
        return ts.compile(
            bench.gemm_bf16, target="hopper", shapes={"M": GEMM_N, "N": GEMM_N, "K": GEMM_N}, schedule=schedule
        )
    kernel = bench._attention_kernel(causal)
    return ts.compile(kernel, target="hopper", shapes={**ATTN, "D": head_dim}, schedule=schedule)


def _warm(case):
    try:
        compile_case(case)
        return None
    except Exception as exc:  # noqa: BLE001 - reported again, with its traceback, when timed
        return f"{type(exc).__name__}: {exc}"[:200]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None)
    parser.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    all_cases = list(cases())
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for case, err in zip(all_cases, pool.map(_warm, all_cases), strict=True):
            if err:
                print(f"compile failed: {case}: {err}", flush=True)
    import torch

    import bench

    lines = []

    def emit(text):
        print(text, flush=True)
        lines.append(text)

    emit(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    torch.manual_seed(0)
    peers = {}
    for case in all_cases:
        kind, head_dim, causal, schedule = case
        try:
            compiled = compile_case(case)
            if kind == "gemm":
                a, b = (torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device="cuda") for _ in range(2))
                run, out = bench._launcher(compiled, a, b)

                def peer(a=a, b=b):
                    return torch.matmul(a, b)

                flops = 2 * GEMM_N**3
                name = f"gemm 8192^3 {schedule or 'default'}"
            else:
                q, k, v = (
                    torch.randn(ATTN["B"], ATTN["H"], ATTN["S"], head_dim, dtype=torch.bfloat16, device="cuda")
                    for _ in range(3)
                )
                run, out = bench._launcher(compiled, q, k, v)

                def peer(q=q, k=k, v=v, causal=causal):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

                flops = 4 * ATTN["B"] * ATTN["H"] * ATTN["S"] ** 2 * head_dim / (2 if causal else 1)
                name = f"attn S4096 D{head_dim}{' causal' if causal else ''} {schedule or 'default'}"
            run()
            ref = peer()
            err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
            t = bench.gpu_time(run, 30)
            key = (kind, head_dim, causal)
            if key not in peers:
                peers[key] = bench.gpu_time(peer, 30)
            t_peer = peers[key]
            emit(
                f"{name:<80} {flops / t / 1e12:6.0f} TFLOP/s  peer {flops / t_peer / 1e12:6.0f}  {t_peer / t:5.2f}x  err {err:.0e}"
            )
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            emit(f"{case}: failed: {type(exc).__name__}: {str(exc)[:200]}")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
