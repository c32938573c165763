# ruff: noqa: F821, B023  (shape names in Tensor[...] are not Python names; lambdas run inside their loop)
"""Tessera benchmark: CPU kernels and compile time against peers measured in the same run.

    python bench/bench.py [--quick] [--out bench/RESULTS.md]

Every figure is the median of several runs and is reported with a ratio against a peer measured in
the same process (``ratio`` > 1: Tessera is faster); CPU kernels and their peers are measured
interleaved (``interleaved_medians``). Writes a Markdown table to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from timing import interleaved_medians, median_time  # noqa: E402, F401  (bench/timing.py)

import tessera as ts  # noqa: E402
from tessera import Tensor, ops  # noqa: E402

ROWS: list[tuple[str, str, str, str, str, str]] = []  # section, case, tessera, peer, ratio, of peak
#: G(FL)OP/s: "f32" / "bf16" / "int8" / "amx_bf16" / "amx_int8" the CPU on the bench's threads, "gpu_bf16" the GPU.
PEAK: dict[str, float] = {}


def row(section, case, ours, peer, ratio, of_peak="-"):
    ROWS.append((section, case, ours, peer, ratio, of_peak))
    print(f"{section:<10} {case:<44} {ours:>16} {peer:>26} {ratio:>8} {of_peak:>8}", flush=True)


def measure_peak(threads: int) -> None:
    """The CPU's arithmetic peak on ``threads`` threads (bench/peak.cpp: an FMA-bound f32 loop and a
    loop of AVX512-BF16 dot products), as rows and in PEAK for the "of peak" column. Our machines
    differ (DESIGN.md §3.2): a GFLOP/s figure means little alone, its fraction of peak carries over."""
    import subprocess

    from tessera_tvm.target.toolchain import require_tool

    exe = Path(tempfile.mkdtemp(prefix="tessera-peak-")) / "peak"
    source = ROOT / "bench" / "peak.cpp"
    try:
        subprocess.run(
            [require_tool("g++"), "-O2", "-march=native", "-std=c++17", "-pthread", str(source), "-o", str(exe)],
            check=True,
            capture_output=True,
            text=True,
        )
        out = subprocess.run([str(exe), str(threads), "0.5"], check=True, capture_output=True, text=True).stdout
    except (subprocess.CalledProcessError, OSError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        row("peak", f"{source.name} failed", type(exc).__name__, detail.strip().splitlines()[-1][:60], "-")
        return
    for line in out.splitlines():
        kind, value = line.split()
        if float(value) > 0:
            PEAK[kind] = float(value)
    what = {
        "f32": ("f32 FMA loop", "-"),
        "bf16": ("bf16 dot-product loop (vdpbf16ps)", "no AVX512-BF16"),
        "int8": ("int8 dot-product loop (vpdpbusd)", "no AVX512-VNNI"),
        "amx_bf16": ("bf16 tile loop (AMX tdpbf16ps)", "no AMX-BF16"),
        "amx_int8": ("int8 tile loop (AMX tdpbssd)", "no AMX-INT8"),
    }
    for kind, (label, absent) in what.items():
        unit = "GOP/s" if kind.endswith("int8") else "GFLOP/s"
        figure = f"{PEAK[kind]:.1f} {unit}" if kind in PEAK else absent
        row("peak", f"{label}, {threads} thread(s)", figure, "-", "-", "100%" if kind in PEAK else "-")


def _gemm_vs_torch(dtype: str, kernel, a, b, check, peer, quick: bool, label: str = "") -> None:
    """A cpu row: ``kernel`` on square ``a`` x ``b`` against ``peer`` (torch's call), with ``check`` of
    its result in the case's name and the fraction of the best peak loop of ``dtype`` (AMX's where
    the CPU has it: the unit the kernel then runs on); ``label`` follows the size in the name."""
    n = a.shape[0]
    k = ts.compile(kernel, target="cpu", shapes={"M": n, "N": n, "K": n})
    note = check(k(a, b))
    times = interleaved_medians({"tessera": lambda: k(a, b), "torch": peer}, 3 if quick else 5)
    t, tt = times["tessera"], times["torch"]
    unit = "GOP/s" if dtype == "int8" else "GFLOP/s"
    peer_name = "torch._int_mm" if dtype == "int8" else "torch"
    row(
        "cpu",
        f"gemm {dtype} {n}^3{label} vs {peer_name} ({note})",
        f"{2 * n**3 / t / 1e9:.1f} {unit}",
        f"{2 * n**3 / tt / 1e9:.1f} {unit}",
        f"{tt / t:.2f}x",
        of_peak(2 * n**3 / t / 1e9, f"amx_{dtype}" if f"amx_{dtype}" in PEAK else dtype),
    )


def of_peak(gflops: float, kind: str = "f32") -> str:
    """``gflops`` as a percentage of the measured peak of ``kind`` ("-" when it was not measured)."""
    return f"{100 * gflops / PEAK[kind]:.0f}%" if kind in PEAK else "-"


def numpy_threads() -> int:
    """The threads numpy and torch get: OMP_NUM_THREADS where set (as for Tessera's kernels), else
    what BLAS runs on, else every core."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return int(os.environ["OMP_NUM_THREADS"])
    try:
        from threadpoolctl import threadpool_info

        return max(i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas")
    except Exception:  # noqa: BLE001 - threadpoolctl is optional
        return os.cpu_count() or 1


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A torch tensor as numpy; bfloat16 as ml_dtypes.bfloat16 (torch's .numpy() refuses it)."""
    return t.float().numpy().astype(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()


@functools.cache
def cpu_has_avx512_bf16() -> bool:
    """Whether this CPU has AVX512-BF16 (g++ -march=native): the bf16 model rows run only there, where
    Tessera's bf16 GEMM uses its dot products (elsewhere it widens to f32 and says little)."""
    from tessera_tvm.target.cpu.build import instruction_sets

    return "avx512bf16" in instruction_sets(("-march=native",))


# ------------------------------------------------------------------------------------------- kernels


@ts.kernel
def matmul(A: Tensor["M", "K", ts.f32], B: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.matmul(A, B)


@ts.kernel
def matmul_bf16(A: Tensor["M", "K", ts.bf16], B: Tensor["K", "N", ts.bf16]) -> Tensor["M", "N", ts.bf16]:
    return ops.matmul(A, B)


@ts.kernel
def matmul_int8(A: Tensor["M", "K", ts.int8], B: Tensor["K", "N", ts.int8]) -> Tensor["M", "N", ts.int32]:
    return ops.matmul(A, B)


@ts.kernel
def matmul_int8_at(A: Tensor["K", "M", ts.int8], B: Tensor["K", "N", ts.int8]) -> Tensor["M", "N", ts.int32]:
    return ops.matmul(A, B, transpose_a=True)


@ts.kernel
def softmax(x: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.softmax(x, axis=-1)


@ts.kernel
def layer_norm(x: Tensor["M", "N", ts.f32], w: Tensor["N", ts.f32], b: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.layer_norm(x, w, b, eps=1e-5)


@ts.kernel
def attention(
    Q: Tensor["B", "H", "S", "D", ts.f32], K: Tensor["B", "H", "S", "D", ts.f32], V: Tensor["B", "H", "S", "D", ts.f32]
) -> Tensor["B", "H", "S", "D", ts.f32]:
    return ops.flash_attention(Q, K, V, causal=False)


@ts.kernel
def masked_attention(
    Q: Tensor["B", "H", "S", "D", ts.f32],
    K: Tensor["B", "H", "S", "D", ts.f32],
    V: Tensor["B", "H", "S", "D", ts.f32],
    M: Tensor["B", "G", "R", "S", ts.f32],
) -> Tensor["B", "H", "S", "D", ts.f32]:
    return ops.flash_attention(Q, K, V, bias=M)


@ts.kernel
def causal_attention(
    Q: Tensor["B", "H", "S", "D", ts.f32], K: Tensor["B", "H", "S", "D", ts.f32], V: Tensor["B", "H", "S", "D", ts.f32]
) -> Tensor["B", "H", "S", "D", ts.f32]:
    return ops.flash_attention(Q, K, V, causal=True)


@ts.kernel
def linear_bias(
    x: Tensor["M", "K", ts.f32], w: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]
) -> Tensor["M", "N", ts.f32]:
    return ops.matmul(x, w) + b


@ts.kernel
def linear_gelu(
    x: Tensor["M", "K", ts.f32], w: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]
) -> Tensor["M", "N", ts.f32]:
    return ops.gelu(ops.matmul(x, w) + b)


@ts.kernel
def linear_gelu_tanh(
    x: Tensor["M", "K", ts.f32], w: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]
) -> Tensor["M", "N", ts.f32]:
    return ops.gelu(ops.matmul(x, w) + b, approximate="tanh")


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_layer_norm(x, w, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * w + b


def np_attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) / np.float32(np.sqrt(q.shape[-1]))
    return np_softmax(s) @ v


# ------------------------------------------------------------------------------------------- sections


def per_call(fn, calls: int = 2000, rounds: int = 5) -> float:
    """Seconds per call of ``fn``: the best of ``rounds`` loops of ``calls`` calls (tiny kernels)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def call_overhead(rng) -> None:
    """A 16^3 GEMM, where the call is all there is: ts.compile's call vs its tvm-ffi library's entry
    (CompiledKernel.build_module, preallocated DLPack tensors) vs numpy."""
    import tvm_ffi

    a, b = (rng.standard_normal((16, 16), dtype=np.float32) for _ in range(2))
    k = ts.compile(matmul, target="cpu", shapes={"M": 16, "N": 16, "K": 16})
    entry = tvm_ffi.load_module(str(k.build_module()))["matmul"]
    out = np.empty((16, 16), np.float32)
    tensors = [tvm_ffi.from_dlpack(x) for x in (a, b, out)]
    entry(*tensors)
    assert np.allclose(out, k(a, b)) and np.allclose(out, a @ b, atol=1e-4)
    t_call, t_entry, t_numpy = per_call(lambda: k(a, b)), per_call(lambda: entry(*tensors)), per_call(lambda: a @ b)
    row("cpu", "call gemm 16^3: k(a, b) vs tvm-ffi entry", f"{t_call * 1e6:.1f} us", f"{t_entry * 1e6:.1f} us", "-")
    with ts.metrics(Path(tempfile.mkdtemp(prefix="tessera-metrics-")) / "calls.jsonl"):  # a row per call
        t_metrics = per_call(lambda: k(a, b), calls=500)
    row("cpu", "call gemm 16^3: with metrics on vs off", f"{t_metrics * 1e6:.1f} us", f"{t_call * 1e6:.1f} us", "-")
    row("cpu", "call gemm 16^3: tvm-ffi entry vs numpy", f"{t_entry * 1e6:.1f} us", f"{t_numpy * 1e6:.1f} us", "-")


def epilogue_cost(rng, quick: bool) -> None:
    """What a GELU epilogue adds to a GEMM + bias (the GPT-2 block's first MLP linear, 128 x 256 x
    1024): the CPU tile programs compute erf, tanh and exp inline so that g++ vectorises the
    epilogue (#16's goal: under 15% over the bias alone)."""
    shapes = {"M": 128, "K": 256, "N": 1024}
    x = rng.standard_normal((128, 256), dtype=np.float32)
    w = rng.standard_normal((256, 1024), dtype=np.float32) / 16
    b = rng.standard_normal(1024, dtype=np.float32)
    y = (x @ w + b).astype(np.float64)
    expected = {
        "bias": y,
        "gelu erf": 0.5 * y * (1 + torch.erf(torch.from_numpy(y / np.sqrt(2))).numpy()),
        "gelu tanh": 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3))),
    }
    kernels = {
        name: ts.compile(kernel, target="cpu", shapes=shapes)
        for name, kernel in (("bias", linear_bias), ("gelu erf", linear_gelu), ("gelu tanh", linear_gelu_tanh))
    }
    errors = {name: float(np.abs(k(x, w, b) - expected[name]).max()) for name, k in kernels.items()}
    times = interleaved_medians({name: (lambda k=k: k(x, w, b)) for name, k in kernels.items()}, 7 if quick else 15)
    for name in ("gelu erf", "gelu tanh"):
        row(
            "cpu",
            f"gemm+bias+{name} vs gemm+bias, 128x256x1024 (err {errors[name]:.0e})",
            f"{times[name] * 1e6:.0f} us",
            f"{times['bias'] * 1e6:.0f} us",
            f"+{100 * (times[name] / times['bias'] - 1):.0f}%",
        )


def bench_cpu(quick: bool) -> None:
    rng = np.random.default_rng(0)
    for n in (512, 1024, 2048):
        reps = 3 if n == 2048 else (5 if quick else 9)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        k = ts.compile(matmul, target="cpu", shapes={"M": n, "N": n, "K": n})
        out = k(a, b)
        err = float(np.abs(out - a @ b).max() / np.abs(a @ b).max())
        flops = 2 * n**3
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        times = interleaved_medians(
            {"tessera": lambda: k(a, b), "numpy": lambda: a @ b, "torch": lambda: torch.matmul(ta, tb)}, reps
        )
        t, tn, tt = times["tessera"], times["numpy"], times["torch"]
        ours, peak = f"{flops / t / 1e9:.1f} GFLOP/s", of_peak(flops / t / 1e9)
        row(
            "cpu",
            f"gemm f32 {n}^3 vs numpy (rel err {err:.0e})",
            ours,
            f"{flops / tn / 1e9:.1f} GFLOP/s",
            f"{tn / t:.2f}x",
            peak,
        )
        row("cpu", f"gemm f32 {n}^3 vs torch", ours, f"{flops / tt / 1e9:.1f} GFLOP/s", f"{tt / t:.2f}x", peak)

    call_overhead(rng)
    epilogue_cost(rng, quick)

    # Issue #39's goal (>= 1.0x torch.matmul): both use the CPU's bf16 units where it has them
    # (Tessera: bf16 k-pairs and vdpbf16ps, and AMX tiles where the CPU has them: tessera/cpu_gemm.h,
    # cpu_amx.h), "of peak" against the best unit's loop.
    for n in (512, 1024, 2048):
        a = rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
        b = rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
        exact = a.astype(np.float32) @ b.astype(np.float32)
        ta, tb = (torch.from_numpy(x.astype(np.float32)).bfloat16() for x in (a, b))

        def check(out, exact=exact):
            return f"rel err {float(np.abs(out.astype(np.float32) - exact).max() / np.abs(exact).max()):.0e}"

        _gemm_vs_torch("bf16", matmul_bf16, a, b, check, functools.partial(torch.matmul, ta, tb), quick)

    # int8 x int8 -> int32 (not a goal of the issue): k-quads and vpdpbusd where the CPU has
    # AVX512-VNNI, AMX tiles where it has them (tessera/cpu_int8.h), against torch._int_mm (oneDNN).
    for n in (512, 1024, 2048):
        a = rng.integers(-128, 128, size=(n, n), dtype=np.int8)
        b = rng.integers(-128, 128, size=(n, n), dtype=np.int8)
        exact = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)

        def check(out, exact=exact):
            return "exact" if np.array_equal(out, exact) else "WRONG"

        peer = functools.partial(torch._int_mm, torch.from_numpy(a), torch.from_numpy(b))
        _gemm_vs_torch("int8", matmul_int8, a, b, check, peer, quick)
        if n == 1024:  # A given transposed ([K, M]): each row block copied row-major once first
            at = np.ascontiguousarray(a.T)
            peer = functools.partial(torch._int_mm, torch.from_numpy(at).t(), torch.from_numpy(b))
            _gemm_vs_torch("int8", matmul_int8_at, at, b, check, peer, quick, label=", A transposed")

    x = rng.standard_normal((4096, 4096), dtype=np.float32)
    w = rng.standard_normal(4096, dtype=np.float32)
    bias = rng.standard_normal(4096, dtype=np.float32)
    tx, tw, tbias = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(bias)
    reps = 3 if quick else 5
    k = ts.compile(softmax, target="cpu", shapes={"M": 4096, "N": 4096})
    assert np.allclose(k(x), np_softmax(x), atol=1e-5)
    times = interleaved_medians(
        {"tessera": lambda: k(x), "numpy": lambda: np_softmax(x), "torch": lambda: torch.softmax(tx, dim=-1)}, reps
    )
    t, tn, tt = times["tessera"], times["numpy"], times["torch"]
    row("cpu", "softmax f32 4096x4096 vs numpy", f"{t * 1e3:.1f} ms", f"{tn * 1e3:.1f} ms", f"{tn / t:.2f}x")
    row("cpu", "softmax f32 4096x4096 vs torch", f"{t * 1e3:.1f} ms", f"{tt * 1e3:.1f} ms", f"{tt / t:.2f}x")
    k = ts.compile(layer_norm, target="cpu", shapes={"M": 4096, "N": 4096})
    assert np.allclose(k(x, w, bias), np_layer_norm(x, w, bias), atol=1e-3)
    times = interleaved_medians(
        {
            "tessera": lambda: k(x, w, bias),
            "numpy": lambda: np_layer_norm(x, w, bias),
            "torch": lambda: torch.nn.functional.layer_norm(tx, (4096,), tw, tbias, 1e-5),
        },
        reps,
    )
    t, tn, tt = times["tessera"], times["numpy"], times["torch"]
    row("cpu", "layer_norm f32 4096x4096 vs numpy", f"{t * 1e3:.1f} ms", f"{tn * 1e3:.1f} ms", f"{tn / t:.2f}x")
    row("cpu", "layer_norm f32 4096x4096 vs torch", f"{t * 1e3:.1f} ms", f"{tt * 1e3:.1f} ms", f"{tt / t:.2f}x")

    for s in (1024, 2048):
        shape = (1, 8, s, 64)
        q, kk, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
        tq, tk, tv = (torch.from_numpy(t_) for t_ in (q, kk, v))
        k = ts.compile(attention, target="cpu", shapes={"B": 1, "H": 8, "S": s, "D": 64})
        err = float(np.abs(k(q, kk, v) - np_attention(q, kk, v)).max())
        reps = 3
        flops = 4 * 8 * s * s * 64
        times = interleaved_medians(
            {
                "tessera": lambda: k(q, kk, v),
                "numpy": lambda: np_attention(q, kk, v),
                "torch": lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv),
            },
            reps,
        )
        t, tn, tt = times["tessera"], times["numpy"], times["torch"]
        ours, peak = f"{flops / t / 1e9:.1f} GFLOP/s", of_peak(flops / t / 1e9)
        row(
            "cpu",
            f"attention B1 H8 S{s} D64 vs numpy (err {err:.0e})",
            ours,
            f"{flops / tn / 1e9:.1f} GFLOP/s",
            f"{tn / t:.2f}x",
            peak,
        )
        row(
            "cpu",
            f"attention B1 H8 S{s} D64 vs torch SDPA",
            ours,
            f"{flops / tt / 1e9:.1f} GFLOP/s",
            f"{tt / t:.2f}x",
            peak,
        )

    # Beyond the goals: causal attention (half the work; the mask only on the diagonal blocks).
    s = 2048
    q, kk, v = (rng.standard_normal((1, 8, s, 64), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(t_) for t_ in (q, kk, v))
    k = ts.compile(causal_attention, target="cpu", shapes={"B": 1, "H": 8, "S": s, "D": 64})
    expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True).numpy()
    err = float(np.abs(k(q, kk, v) - expected).max())
    times = interleaved_medians(
        {
            "tessera": lambda: k(q, kk, v),
            "torch": lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True),
        },
        3,
    )
    flops = 2 * 8 * s * s * 64  # half of the full attention's
    t, tt = times["tessera"], times["torch"]
    row(
        "cpu",
        f"attention causal S{s} D64 vs torch SDPA (err {err:.0e})",
        f"{flops / t / 1e9:.1f} GFLOP/s",
        f"{flops / tt / 1e9:.1f} GFLOP/s",
        f"{tt / t:.2f}x",
        of_peak(flops / t / 1e9),
    )

    # An additive bias (torch SDPA's float attn_mask): a padding mask [1, 1, 1, S] (the last eighth of
    # the keys -inf) and an ALiBi-like bias over heads and positions [1, 8, S, S].
    for what, mask_shape in (("padding mask [1,1,1,S]", (1, 1, 1, s)), ("ALiBi bias [1,8,S,S]", (1, 8, s, s))):
        m = (rng.standard_normal(mask_shape) * 0.5).astype(np.float32)
        m[..., s - s // 8 :] = -np.inf
        tm = torch.from_numpy(m)
        bound = {"B": 1, "H": 8, "S": s, "D": 64, "G": mask_shape[1], "R": mask_shape[2]}
        k = ts.compile(masked_attention, target="cpu", shapes=bound)
        expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm).numpy()
        err = float(np.abs(k(q, kk, v, m) - expected).max())
        times = interleaved_medians(
            {
                "tessera": lambda k=k, m=m: k(q, kk, v, m),
                "torch": lambda tm=tm: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm),
            },
            3,
        )
        flops = 4 * 8 * s * s * 64
        t, tt = times["tessera"], times["torch"]
        row(
            "cpu",
            f"attention S{s} D64 with a {what} vs torch SDPA (err {err:.0e})",
            f"{flops / t / 1e9:.1f} GFLOP/s",
            f"{flops / tt / 1e9:.1f} GFLOP/s",
            f"{tt / t:.2f}x",
            of_peak(flops / t / 1e9),
        )


EXAMPLES = ["linear", "flash_attention", "layer_norm", "softmax"]


# target -> (what Tessera writes, the TVM target tilelang.lower needs, the toolchain that builds it)
COMPILE_TARGETS = {
    "cpu": ("C", "c", "g++"),
    "hopper": ("CUDA", {"kind": "cuda", "arch": "sm_90a"}, "nvcc"),
}


def bench_threads(quick: bool) -> None:
    """Issue #39 item 4: a Tessera GEMM (f32 1024^3) called right after numpy or torch work in the same
    process, against the same call alone. numpy's BLAS and torch's pool may keep their threads spinning
    on the cores Tessera's OpenMP threads need. Goal: within 10% of the call alone. Measured twice:
    numpy's OpenBLAS on the kernels' threads (what loading a CPU kernel sets up,
    src/target/cpu/blas_threads.py) and on its own threads (``TESSERA_SHARE_BLAS_THREADS=0``); and
    numpy's own GEMM both ways."""
    from tessera_tvm.target.cpu import blas_threads

    rng = np.random.default_rng(0)
    n = 1024
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    k = ts.compile(matmul, target="cpu", shapes={"M": n, "N": n, "K": n})
    k(a, b)
    small = rng.standard_normal((256, 256), dtype=np.float32)
    ts_small = torch.from_numpy(small)
    before = {
        "alone": lambda: time.sleep(0.2),  # the earlier rounds' threads have stopped spinning
        "after numpy matmuls": lambda: [small @ small for _ in range(4)],
        "after torch matmuls": lambda: [torch.matmul(ts_small, ts_small) for _ in range(4)],
    }
    samples = 9 if quick else 25
    flops = 2 * n**3
    ways = {"numpy's BLAS on the kernels' threads": True, "numpy's BLAS on its own threads": False}
    for way, shared in ways.items():
        (blas_threads.share_blas_threads if shared else blas_threads.stop_sharing_blas_threads)()
        time.sleep(0.3)  # the other way's threads stop spinning (OpenBLAS's spin for ~0.1 s)
        times: dict[str, list[float]] = {name: [] for name in before}
        for _ in range(samples):  # interleaved: each round times the kernel once after each kind of work
            for name, work in before.items():
                work()
                start = time.perf_counter()
                k(a, b)
                times[name].append(time.perf_counter() - start)
        alone = float(np.median(times["alone"]))
        for name in before:
            t = float(np.median(times[name]))
            row(
                "threads",
                f"gemm f32 {n}^3 {name}, {way} (median of {samples})",
                f"{t * 1e3:.2f} ms",
                f"{alone * 1e3:.2f} ms alone",
                f"{alone / t:.2f}x",
                of_peak(flops / t / 1e9),
            )
    # numpy's own GEMM on the kernels' threads against its own threads (ratio > 1: faster shared), in
    # interleaved rounds: switch, wait for the other way's threads to stop spinning, warm, time a call.
    for m in (256, 1024):
        x = rng.standard_normal((m, m), dtype=np.float32)
        times = {True: [], False: []}
        for _ in range(samples):
            for shared in (True, False):
                (blas_threads.share_blas_threads if shared else blas_threads.stop_sharing_blas_threads)()
                time.sleep(0.3)
                for _ in range(3):
                    x @ x
                start = time.perf_counter()
                x @ x
                times[shared].append(time.perf_counter() - start)
        shared, own = (float(np.median(times[way])) for way in (True, False))
        row(
            "threads",
            f"numpy gemm f32 {m}^3: BLAS on the kernels' threads vs on its own (median of {samples})",
            f"{2 * m**3 / shared / 1e9:.1f} GFLOP/s",
            f"{2 * m**3 / own / 1e9:.1f} GFLOP/s",
            f"{own / shared:.2f}x",
            "-",
        )
    blas_threads.share_blas_threads()


def bench_compile(quick: bool) -> None:
    """Cold compiles are kernel-cache misses in a cache whose precompiled C prelude is built (what a
    user's second kernel meets); the prelude's one-off build is its own row."""
    import shutil

    import tilelang

    import tessera_tvm
    from tessera_tvm._tvm import tvm
    from tessera_tvm.target.cpu import precompiled_prelude
    from tessera_tvm.target.cuda import nvcc_available
    from tessera_tvm.target.toolchain import require_tool

    reps = 2 if quick else 3
    cache_root = Path(tempfile.mkdtemp(prefix="tessera-bench-cache-"))
    saved = {name: os.environ.pop(name, None) for name in ("TESSERA_CACHE_DIR", "TESSERA_DISABLE_CACHE")}
    os.environ["TESSERA_CACHE_DIR"] = str(cache_root)

    def forget_kernels() -> None:  # empty the kernel cache, keep the prelude
        for entry in cache_root.iterdir():
            if entry.name != "pch":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    flags = tessera_tvm.load_config("cpu").codegen_dict["flags"]
    start = time.perf_counter()
    built = precompiled_prelude(require_tool("g++"), flags) is not None
    row(
        "compile",
        "g++: TileLang's C prelude precompiled (once)",
        f"{(time.perf_counter() - start) * 1e3:.0f} ms" if built else "not built (no GCC)",
        "-",
        "-",
    )
    try:
        for name in EXAMPLES:
            module = importlib.import_module(name)
            kern = getattr(module, name)
            shapes = dict(module.SHAPES)
            for target, (language, tvm_target, toolchain) in COMPILE_TARGETS.items():

                def compile_(build, cold=True, kern=kern, shapes=shapes, target=target):
                    ts.compiler.clear_cache()
                    if cold:
                        forget_kernels()
                    return ts.compile(kern, target=target, shapes=shapes, build=build)

                t_src = median_time(lambda: compile_(False), reps, warmup=0)
                tiles = [d.tile for d in compile_(False).device_kernels]

                def tl_lower(tiles=tiles, tvm_target=tvm_target):
                    with tvm.target.Target(tvm_target) as context:  # TileLang's lowering needs a target context
                        for tile in tiles:
                            tilelang.lower(tile, target=context)

                try:
                    t_tl = median_time(tl_lower, reps, warmup=0)
                    peer, ratio = f"{t_tl * 1e3:.0f} ms (tilelang.lower)", f"{t_tl / t_src:.2f}x"
                except Exception as exc:  # noqa: BLE001 - reported in the table
                    peer, ratio = f"tilelang.lower fails: {str(exc).strip().splitlines()[-1][:48]}", "-"
                row("compile", f"{name}: graph->{language} source ({target})", f"{t_src * 1e3:.0f} ms", peer, ratio)
                if toolchain == "nvcc" and not nvcc_available():
                    row("compile", f"{name}: {toolchain} (separately)", "skipped: nvcc not on PATH", "-", "-")
                    continue
                t_all = median_time(lambda: compile_(True), reps, warmup=0)
                row(
                    "compile",
                    f"{name}: {toolchain} toolchain (separately)",
                    f"{(t_all - t_src) * 1e3:.0f} ms",
                    "-",
                    "-",
                )
                t_hit = median_time(lambda: compile_(True, cold=False), reps, warmup=0)
                row(
                    "compile",
                    f"{name}: repeated compile, disk cache hit ({target})",
                    f"{t_hit * 1e3:.0f} ms",
                    f"{t_all * 1e3:.0f} ms (cold, with {toolchain})",
                    f"{t_all / t_hit:.1f}x",
                )
    finally:
        os.environ.pop("TESSERA_CACHE_DIR")
        os.environ.update({name: value for name, value in saved.items() if value is not None})
        shutil.rmtree(cache_root, ignore_errors=True)


@ts.kernel
def gemm_bf16(A: Tensor["M", "K", ts.bf16], B: Tensor["K", "N", ts.bf16]) -> Tensor["M", "N", ts.bf16]:
    return ops.matmul(A, B)


def _attention_kernel(causal: bool):
    @ts.kernel
    def flash_attention_bf16(
        Q: Tensor["B", "H", "S", "D", ts.bf16],
        K: Tensor["B", "H", "S", "D", ts.bf16],
        V: Tensor["B", "H", "S", "D", ts.bf16],
    ) -> Tensor["B", "H", "S", "D", ts.bf16]:
        return ops.flash_attention(Q, K, V, causal=causal)

    return flash_attention_bf16


def gpu_time(fn, repeats: int = 20, warmup: int = 3) -> float:
    """Median seconds of ``fn`` on the GPU, timed with CUDA events around each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _launcher(compiled, *tensors):
    """The compiled kernel's one device kernel, called on preallocated tensors (no Python orchestration)."""
    (dk,) = compiled.device_kernels
    (out_arg,) = dk.spec.outputs()
    out = torch.empty(out_arg.shape, dtype=tensors[0].dtype, device=tensors[0].device)
    launch = dk.lowered.cuda_kernel()
    return lambda: launch(*tensors, out), out


def bench_gpu(quick: bool, target: str) -> None:
    if not torch.cuda.is_available():
        row("gpu", "skipped: no NVIDIA GPU", "-", "-", "-")
        return
    torch.manual_seed(0)
    reps = 10 if quick else 30
    # The GPU's measured bf16 peak for the "of peak" column: the best of torch.matmul (cuBLAS) on a
    # few large square GEMMs. Vendors quote a higher dense figure (989 TFLOP/s for an H100 SXM) that
    # no GEMM reaches; this is what this card does here.
    best = 0.0
    for n in (8192, 12288, 16384):
        a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        t = gpu_time(lambda a=a: torch.matmul(a, a), 10)
        best = max(best, 2 * n**3 / t / 1e9)
        del a
    PEAK["gpu_bf16"] = best
    row(
        "peak",
        f"gpu bf16: best torch.matmul ({torch.cuda.get_device_name(0)})",
        f"{best / 1e3:.0f} TFLOP/s",
        "-",
        "-",
        "100%",
    )
    for n in (4096, 8192):
        a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        try:
            k = ts.compile(gemm_bf16, target=target, shapes={"M": n, "N": n, "K": n})
            run, out = _launcher(k, a, b)
            run()
            ref = torch.matmul(a, b)
            err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
            t, t_peer = gpu_time(run, reps), gpu_time(lambda: torch.matmul(a, b), reps)
        except Exception as exc:  # noqa: BLE001 - one failing case is reported, the rest still run
            traceback.print_exc()
            row("gpu", f"gemm bf16 {n}^3 ({target}) failed", type(exc).__name__, str(exc)[:60], "-")
            continue
        tflops = 2 * n**3 / 1e12
        row(
            "gpu",
            f"gemm bf16 {n}^3 ({target}) vs torch.matmul (rel err {err:.0e})",
            f"{tflops / t:.0f} TFLOP/s",
            f"{tflops / t_peer:.0f} TFLOP/s",
            f"{t_peer / t:.2f}x",
            of_peak(tflops / t * 1e3, "gpu_bf16"),
        )
    batch, heads = 1, 32
    lengths = (1024, 4096) if quick else (1024, 4096, 8192)
    for head_dim in (64, 128):
        for causal in (False, True):
            kernel = _attention_kernel(causal)
            # overlap=True (Hopper's asynchronous wgmma, off by default until measured): at S=4096 as well
            variants = [(seq, {}) for seq in lengths]
            if target == "hopper":
                variants.insert(lengths.index(4096) + 1, (4096, {"overlap": True}))
            for seq, schedule in variants:
                q, k_, v = (
                    torch.randn(batch, heads, seq, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(3)
                )
                name = f"attention fwd bf16 S{seq} D{head_dim}{' causal' if causal else ''} ({target})"
                name += " overlap" if schedule else ""
                try:
                    compiled = ts.compile(
                        kernel,
                        target=target,
                        shapes={"B": batch, "H": heads, "S": seq, "D": head_dim},
                        schedule=schedule or None,
                    )
                    run, out = _launcher(compiled, q, k_, v)

                    def sdpa(q=q, k_=k_, v=v, causal=causal):
                        return torch.nn.functional.scaled_dot_product_attention(q, k_, v, is_causal=causal)

                    run()
                    ref = sdpa()
                    err = float((out.float() - ref.float()).abs().max())
                    t, t_peer = gpu_time(run, reps), gpu_time(sdpa, reps)
                except Exception as exc:  # noqa: BLE001
                    traceback.print_exc()
                    row("gpu", f"{name} failed", type(exc).__name__, str(exc)[:60], "-")
                    continue
                tflops = 4 * batch * heads * seq * seq * head_dim / (2 if causal else 1) / 1e12
                row(
                    "gpu",
                    f"{name} vs SDPA (err {err:.0e})",
                    f"{tflops / t:.0f} TFLOP/s",
                    f"{tflops / t_peer:.0f} TFLOP/s",
                    f"{t_peer / t:.2f}x",
                    of_peak(tflops / t * 1e3, "gpu_bf16"),
                )


# -------------------------------------------------------------------------------------------- models


def bench_models(quick: bool) -> None:
    """Whole PyTorch models (examples/torch_models.py) imported with TVM's frontend at its defaults,
    offloaded to Tessera and run in the Relax VM (exported with export_options), vs torch eager and
    torch.compile on the same inputs and threads, with the build's seconds. The case names carry the
    offload report's counts."""
    import torch_models

    from tessera_tvm.relax import build

    torch.manual_seed(0)
    gpt2 = torch_models.Gpt2Block(256, 4, 1024)
    cases = {  # name: (model, input, the input's dynamic axis or None)
        "GPT-2 block (B=1 S=128 D=256 H=4)": (gpt2, torch.randn(1, 128, 256), None),
        # exported with a dynamic sequence length (S=2..1024), run at 128: kernels bind S per call
        "GPT-2 block, dynamic S (B=1 S=128 D=256 H=4)": (gpt2, torch.randn(1, 128, 256), 1),
        "LLaMA block (B=1 S=128 D=256 H=8/4)": (
            torch_models.LlamaBlock(256, 8, 4, 688, 128),
            torch.randn(1, 128, 256),
            None,
        ),
        "MLP (B=64, 784-1024-1024-10)": (torch_models.Mlp((784, 1024, 1024, 10)), torch.randn(64, 784), None),
        # the same MLP in bf16 (weights and input), vs torch's bf16 eager and torch.compile
        "MLP bf16 (B=64, 784-1024-1024-10)": (
            torch_models.Mlp((784, 1024, 1024, 10)).to(torch.bfloat16),
            torch.randn(64, 784).to(torch.bfloat16),
            None,
        ),
        "ResNet basic block (B=1 C=64 56x56)": (torch_models.BasicBlock(64), torch.randn(1, 64, 56, 56), None),
        "ResNet-18 (B=1 224x224)": (torch_models.ResNet18(), torch.randn(1, 3, 224, 224), None),
        "MobileNetV2 inverted residual (B=1 C=32 x6 56x56)": (
            torch_models.InvertedResidual(32),
            torch.randn(1, 32, 56, 56),
            None,
        ),
    }
    for name, (model, x, axis) in cases.items():
        model = model.eval()
        if x.dtype == torch.bfloat16 and not cpu_has_avx512_bf16():
            row("models", name, "skipped", "this CPU has no AVX512-BF16", "-")
            continue
        try:
            start = time.perf_counter()
            built = build(torch_models.import_model(model, x, dynamic_axis=axis), "cpu")
            (got,) = built.run("main", to_numpy(x))
            seconds = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 - a row that says why
            row("models", name, "failed", f"{type(exc).__name__}: {str(exc)[:60]}", "-")
            continue
        with torch.no_grad():
            expected = model(x).float().numpy()  # bf16: torch's bf16 eager output, compared in f32
        got = got.astype(np.float32)
        report = built.report
        counts = f"{len(report.offloaded)} offloaded, {len(report.not_offloaded)} left"
        _versus_torch("models", f"{name} ({counts})", model, (x,), built, seconds, got, expected, quick)


def _with_threads(threads: int) -> None:
    """Tessera's kernels (read at every launch) and torch on ``threads`` threads."""
    os.environ["TESSERA_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def bench_conv(quick: bool) -> None:
    """ResNet-18's 3x3 stride-1 convolutions (batch 1) as the planner runs them (Winograd F(4x4, 3x3)
    above 7x7) against the direct program and torch's conv2d, at 1 and 2 threads, interleaved; then
    the bench's ResNet basic block and ResNet-18 built as the planner chooses against the same models
    built with every convolution pinned to the direct program (what the planner chose before it had
    Winograd), and torch eager. GFLOP/s count a convolution's 2*O*C*9*OH*OW multiply-adds: Winograd
    computes a quarter of them, so its figure (and its fraction of the FMA peak) is the rate of the
    work it replaces."""
    import torch_models

    import tessera_tvm
    from tessera_tvm import planner, tvm
    from tessera_tvm.relax import build
    from tessera_tvm.tile import Conv2dSpec, build_tile_program

    threads_before = os.environ.get("TESSERA_NUM_THREADS")
    rng = np.random.default_rng(0)
    for channels, size in ((64, 56), (128, 28), (256, 14), (512, 7)):
        spec = Conv2dSpec(1, channels, size, size, channels, 3, 3, padding=(1, 1, 1, 1))
        x = rng.standard_normal((1, channels, size, size), dtype=np.float32)
        w = (rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
        xt, wt = torch.from_numpy(x), torch.from_numpy(w)
        expected = torch.nn.functional.conv2d(xt.double(), wt.double(), padding=1).numpy()
        chosen = planner.schedule_for(spec, "cpu").conv_algorithm
        calls, errors = {}, {}
        for algorithm in dict.fromkeys((chosen, "winograd", "direct")):
            schedule = planner.schedule_for(spec, "cpu", {"conv_algorithm": algorithm})
            kernel = tessera_tvm.lower(build_tile_program(spec, schedule, "c"), "cpu")
            out = np.zeros(spec.shape_out, np.float32)
            kernel(x, w, out)
            errors[algorithm] = float(np.abs(out - expected).max())
            calls[algorithm] = lambda kernel=kernel, out=out: kernel(x, w, out)
        calls["torch"] = lambda: torch.nn.functional.conv2d(xt, wt, padding=1)
        flops = 2 * channels * channels * 9 * size * size
        for threads in (1, 2):
            _with_threads(threads)
            times = interleaved_medians(calls, 5 if quick else 11)
            case = f"conv 3x3 C={channels} {size}x{size}, {threads} thread(s): winograd"
            for peer in ("direct", "torch"):
                row(
                    "conv",
                    f"{case} vs {peer} (planner: {chosen}; err {errors['winograd']:.0e}, direct {errors['direct']:.0e})",
                    f"{flops / times['winograd'] / 1e9:.0f} GFLOP/s",
                    f"{flops / times[peer] / 1e9:.0f} GFLOP/s",
                    f"{times[peer] / times['winograd']:.2f}x",
                    of_peak(flops / times["winograd"] / 1e9) if threads == numpy_threads() else "-",
                )
    pinned = Path(tempfile.mkdtemp(prefix="tessera-bench-")) / "cpu_direct.yaml"
    cpu = (ROOT / "configs" / "cpu.yaml").read_text()
    pinned.write_text(cpu.replace("\nschedule:\n", "\nschedule:\n  conv2d: {conv_algorithm: direct}\n", 1))
    torch.manual_seed(0)
    models = {
        "ResNet basic block (B=1 C=64 56x56)": (torch_models.BasicBlock(64), torch.randn(1, 64, 56, 56)),
        "ResNet-18 (B=1 224x224)": (torch_models.ResNet18(), torch.randn(1, 3, 224, 224)),
    }
    for name, (model, x) in models.items():
        model = model.eval()
        module = torch_models.import_model(model, x)
        built = {"planner": build(module, "cpu"), "direct": build(module, str(pinned))}
        args = [tvm.runtime.tensor(to_numpy(x))]
        vms = {way: b.vm()["main"] for way, b in built.items()}
        with torch.no_grad():
            expected = model(x).numpy()
            errors = {way: float(np.abs(b.run("main", to_numpy(x))[0] - expected).max()) for way, b in built.items()}
            calls = {way: (lambda vm=vm: vm(*args)) for way, vm in vms.items()}
            calls["torch eager"] = lambda: model(x)
            for threads in (1, 2):
                _with_threads(threads)
                times = interleaved_medians(calls, 5 if quick else 11)
                for peer in ("direct", "torch eager"):
                    row(
                        "conv",
                        f"{name}, {threads} thread(s): planner vs {peer} "
                        f"(err {errors['planner']:.0e}, direct {errors['direct']:.0e})",
                        f"{times['planner'] * 1e3:.2f} ms",
                        f"{times[peer] * 1e3:.2f} ms",
                        f"{times[peer] / times['planner']:.2f}x",
                    )
    if threads_before is None:
        os.environ.pop("TESSERA_NUM_THREADS", None)
    else:
        os.environ["TESSERA_NUM_THREADS"] = threads_before
    torch.set_num_threads(numpy_threads())


def bench_packed_weight(quick: bool) -> None:
    """A GPT-2 MLP linear (128 tokens, 768 -> 3072, its constant [3072, 768] weight read transposed,
    + bias) offloaded with the weight packed ahead (the default) against the same linear packing its
    weight at every call (``pack_weights=False``), at 1 thread and the bench's threads
    (``TESSERA_NUM_THREADS``, which the kernels read at each launch), timed interleaved in the VM."""
    from tessera_tvm import tvm
    from tessera_tvm.relax import build

    relax = tvm.relax
    tokens, d_in, d_out = 128, 768, 3072
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((d_out, d_in)) * 0.03).astype(np.float32)
    bias = rng.standard_normal(d_out).astype(np.float32)
    x = rng.standard_normal((tokens, d_in)).astype(np.float32)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorStructInfo((tokens, d_in), "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            w_t = bb.emit(relax.op.permute_dims(relax.const(weight)))
            out = bb.emit_output(relax.op.add(bb.emit(relax.op.matmul(xv, w_t)), relax.const(bias)))
        bb.emit_func_output(out)
    mod = bb.get()
    expected = x.astype(np.float64) @ weight.T.astype(np.float64) + bias
    calls, errors = {}, []
    for packed in (True, False):
        built = build(mod, "cpu", pack_weights=packed)
        assert [o.packed_weight for o in built.report.offloaded] == [packed], built.report
        vm, args = built.vm()["main"], [tvm.runtime.tensor(x)]
        errors.append(float(np.abs(vm(*args).numpy() - expected).max()))
        calls["packed ahead" if packed else "packed per call"] = functools.partial(vm, *args)
    flops = 2 * tokens * d_in * d_out
    previous = os.environ.get("TESSERA_NUM_THREADS")
    try:
        for threads in sorted({1, numpy_threads()}):
            os.environ["TESSERA_NUM_THREADS"] = str(threads)
            times = interleaved_medians(calls, 7 if quick else 15)
            row(
                "models",
                f"linear {tokens}x{d_in}->{d_out} f32, weight packed ahead vs per call, {threads} thread(s) "
                f"(err {max(errors):.0e})",
                f"{flops / times['packed ahead'] / 1e9:.1f} GFLOP/s",
                f"{flops / times['packed per call'] / 1e9:.1f} GFLOP/s",
                f"{times['packed per call'] / times['packed ahead']:.2f}x",
                of_peak(flops / times["packed ahead"] / 1e9) if threads == numpy_threads() else "-",
            )
    finally:
        if previous is None:
            os.environ.pop("TESSERA_NUM_THREADS", None)
        else:
            os.environ["TESSERA_NUM_THREADS"] = previous


def _versus_torch(section, name, model, inputs, built, seconds, got, expected, quick: bool) -> None:
    """Rows of ``built`` (its VM's ``main``) against torch eager and torch.compile (inductor, default
    mode) on ``inputs``, timed interleaved; with the build's seconds (import to first result) and
    torch.compile's first call."""
    from tessera_tvm import tvm

    vm, args = built.vm()["main"], [tvm.runtime.tensor(to_numpy(t)) for t in inputs]
    compiled = torch.compile(model)
    with torch.no_grad():
        start = time.perf_counter()
        compiled(*inputs)
        compile_seconds = time.perf_counter() - start
        times = interleaved_medians(
            {"tessera": lambda: vm(*args), "eager": lambda: model(*inputs), "compile": lambda: compiled(*inputs)},
            5 if quick else 11,
        )
    error = float(np.abs(got - expected).max())
    for peer in ("eager", "compile"):
        row(
            section,
            f"{name} vs torch {peer} (err {error:.0e}; built in {seconds:.0f} s, torch.compile {compile_seconds:.0f} s)",
            f"{times['tessera'] * 1e3:.2f} ms",
            f"{times[peer] * 1e3:.2f} ms",
            f"{times[peer] / times['tessera']:.2f}x",
        )


def bench_hf(quick: bool) -> None:
    """Hugging Face transformers models built from configs (random weights, examples/hf_model.py),
    imported at the frontend's defaults and offloaded, vs torch eager and torch.compile (inductor,
    default mode) on the same inputs and threads; with Tessera's build time (import to first result,
    kernel cache empty for this run's new kernels) and torch.compile's first call."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        row("hf", "transformers models", "skipped", "transformers is not installed (pip install -e .[test])", "-")
        return
    import hf_model

    sizes = dict(hidden=256, ffn=688, layers=2, heads=8, vocab=1024, positions=256)
    models = {
        "GPT-2 (2 layers, D=256, gelu_new)": "gpt2",
        "LLaMA (2 layers, D=256, GQA 8/4)": "llama",
        "Qwen2 (2 layers, D=256, GQA 8/4)": "qwen2",
        # transformers' grouped experts: a dynamic-M GEMM per expert (tessera_tvm/frontend_fixes.py)
        "Mixtral (2 layers, D=256, 8 experts, top 2)": "mixtral",
        "BERT (2 layers, D=256)": "bert",
        # ALiBi (BLOOM's baddbmm, MPT's masked_fill) and Falcon's multi-query SDPA: one attention kernel each
        "BLOOM (2 layers, D=256, ALiBi)": "bloom",
        "MPT (2 layers, D=256, ALiBi)": "mpt",
        "Falcon (2 layers, D=256, multi-query)": "falcon",
        "ViT (2 layers, D=256, 224x224 in 16x16 patches)": "vit",
        # in bf16 (.to(torch.bfloat16)), vs torch's bf16 eager and torch.compile
        "GPT-2 bf16 (2 layers, D=256, gelu_new)": "gpt2 bf16",
        "LLaMA bf16 (2 layers, D=256, GQA 8/4)": "llama bf16",
    }
    for name, kind in models.items():
        kind, _, dtype = kind.partition(" ")
        if dtype == "bf16" and not cpu_has_avx512_bf16():
            row("hf", name, "skipped", "this CPU has no AVX512-BF16", "-")
            continue
        if kind == "vit":
            model = hf_model.make_model(kind, **sizes, image_size=224, patch_size=16)
            ids = hf_model.vit_inputs(model, batch=1)
        else:
            model = hf_model.make_model(kind, **sizes)
            ids = (torch.randint(0, 1024, (1, 128)),)
        if dtype == "bf16":
            model = model.to(torch.bfloat16)
        try:
            built, got, expected, seconds = hf_model.build_and_compare(model, ids)
        except Exception as exc:  # noqa: BLE001 - a row that says why
            row("hf", name, "failed", f"{type(exc).__name__}: {str(exc)[:60]}", "-")
            continue
        _versus_torch("hf", name, model, ids, built, seconds, got, expected, quick)
    for name, kind in {"LLaMA": "llama", "GPT-2": "gpt2"}.items():
        _hf_decode_row(
            hf_model, f"{name} decode step (2 layers, D=256, 1 token on 128 cached of 256)", kind, sizes, quick
        )


def _hf_decode_row(hf_model, name: str, kind: str, sizes: dict, quick: bool) -> None:
    """One decode step (examples/hf_model.py's StaticCacheStep: the KV cache as fixed-size tensors)
    built at the frontend's defaults, vs the same step in torch eager and torch.compile."""
    from tessera_tvm.relax import build  # first: it makes TileLang's TVM the process's `tvm`

    # isort: split
    from tvm.relax.frontend.torch import from_exported_program

    try:
        step, inputs, _ = hf_model.decode_step(
            hf_model.make_model(kind, **sizes), torch.randint(0, 1024, (1, 128)), max_len=256
        )
        start = time.perf_counter()
        built = build(from_exported_program(torch.export.export(step, inputs), keep_params_as_input=False), "cpu")
        got = built.run("main", *(t.numpy() for t in inputs))[0]
        seconds = time.perf_counter() - start
        with torch.no_grad():
            expected = step(*inputs)[0].numpy()
    except Exception as exc:  # noqa: BLE001 - a row that says why
        row("hf", name, "failed", f"{type(exc).__name__}: {str(exc)[:60]}", "-")
        return
    _versus_torch("hf", name, step, inputs, built, seconds, got, expected, quick)


def _gpu_model_cases(quick: bool) -> dict:
    """{name: (model, inputs)} of the gpu-models section: the transformer models of the models and hf
    sections (CNNs stay with TVM on the GPU: Tessera has no CUDA convolution yet), in bf16 where the
    input is a float tensor."""
    import hf_model
    import torch_models

    torch.manual_seed(0)
    cases = {
        "GPT-2 block (B=1 S=128 D=256 H=4)": (torch_models.Gpt2Block(256, 4, 1024), (torch.randn(1, 128, 256),)),
        "LLaMA block (B=1 S=128 D=256 H=8/4)": (
            torch_models.LlamaBlock(256, 8, 4, 688, 128),
            (torch.randn(1, 128, 256),),
        ),
    }
    sizes = dict(hidden=256, ffn=688, layers=2, heads=8, vocab=1024, positions=256)
    for kind in ("llama", "bert") if quick else ("gpt2", "llama", "qwen2", "bert"):
        cases[f"HF {kind} (2 layers, D=256)"] = (
            hf_model.make_model(kind, **sizes),
            (torch.randint(0, 1024, (1, 128)),),
        )
    return cases


#: The largest max-abs error, relative to the largest value, of a bf16 model's output on the GPU
#: against torch that the gpu-models section calls right (the transformers measured 4e-3 to 8e-3).
GPU_MODEL_TOLERANCE = 5e-2


def bench_gpu_models(quick: bool, target: str) -> None:
    """Issue #39 item 9: whole models in bf16 on the GPU, imported as the models section imports them,
    built for ``target`` (Tessera's kernels for what it offloads, TVM's GPU schedules for the rest),
    run in the Relax VM on ``tvm.cuda()``, against torch eager and ``torch.compile`` (inductor, default
    mode) on CUDA with the same inputs; each timed with CUDA events. Run on a lent GPU by
    ``bash bench/device_run.sh models`` (bench/README.md)."""
    if not torch.cuda.is_available():
        row("gpu-models", "skipped: no NVIDIA GPU", "-", "-", "-")
        return
    from tvm.relax.frontend.torch import from_exported_program

    from tessera_tvm import tvm
    from tessera_tvm.relax import build

    reps = 10 if quick else 30
    for name, (model, inputs) in _gpu_model_cases(quick).items():
        model = model.eval().to(torch.bfloat16)
        inputs = tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in inputs)
        try:
            start = time.perf_counter()
            exported = torch.export.export(model, inputs)
            built = build(from_exported_program(exported, keep_params_as_input=False), target)
            vm = built.vm(tvm.cuda())["main"]
            args = [tvm.runtime.from_dlpack(t.cuda()) for t in inputs]
            got = vm(*args)
            got = torch.from_dlpack(got if hasattr(got, "shape") else got[0])  # a tensor, or a tuple of one
            seconds = time.perf_counter() - start
            cuda_model, cuda_inputs = model.cuda(), tuple(t.cuda() for t in inputs)
            compiled = torch.compile(cuda_model)
            with torch.no_grad():
                expected = cuda_model(*cuda_inputs)
                expected = expected[0] if isinstance(expected, tuple) else expected
                start = time.perf_counter()
                compiled(*cuda_inputs)
                torch.cuda.synchronize()
                compile_seconds = time.perf_counter() - start
                times = {
                    "tessera": gpu_time(lambda: vm(*args), reps),
                    "eager": gpu_time(lambda: cuda_model(*cuda_inputs), reps),
                    "compile": gpu_time(lambda: compiled(*cuda_inputs), reps),
                }
            error = float((got.float() - expected.float()).abs().max() / expected.float().abs().max())
        except Exception as exc:  # noqa: BLE001 - a row that says why; the other models still run
            traceback.print_exc()
            row("gpu-models", f"{name} ({target}) failed", type(exc).__name__, str(exc)[:60], "-")
            continue
        counts = f"{len(built.report.offloaded)} offloaded, {len(built.report.not_offloaded)} left"
        # bf16 end to end: a few 1e-3 is rounding; more is a wrong answer, and its speed means nothing
        wrong = "WRONG ANSWER, " if not error <= GPU_MODEL_TOLERANCE else ""
        for peer in ("eager", "compile"):
            row(
                "gpu-models",
                f"{name} bf16 ({target}; {counts}) vs torch {peer} ({wrong}rel err {error:.0e}; built in {seconds:.0f} s, "
                f"torch.compile {compile_seconds:.0f} s)",
                f"{times['tessera'] * 1e3:.3f} ms",
                f"{times[peer] * 1e3:.3f} ms",
                f"{times[peer] / times['tessera']:.2f}x",
            )


def bench_upstream(quick: bool) -> None:
    """The models on upstream apache-tvm (bench/upstream_models.py in the apache-tvm venv that
    ``./tessera.sh apache-tvm-run`` makes): with Tessera offload vs upstream alone (LLVM, its
    default pipeline) vs torch eager. Goal (#17): >= 2x upstream alone and >= torch eager."""
    import json
    import subprocess

    from tessera_tvm.upstream.toolchain import clean_environment

    env = clean_environment()  # this process imported TileLang, whose variables would reach apache-tvm
    command = ["bash", str(ROOT / "tessera.sh"), "apache-tvm-run", "bench/upstream_models.py"]
    done = subprocess.run(
        [*command, *(["--quick"] if quick else [])], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not results:
        detail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        row("upstream", "apache-tvm venv failed", f"exit {done.returncode}", detail[:60], "-")
        return
    for r in results:
        t = r["times"]
        counts = f"{r['offloaded']} offloaded, {r['left']} left; err {r['errors']['tessera']:.0e}"
        row(
            "upstream",
            f"{r['model']}: apache-tvm {r['tvm']} + Tessera vs apache-tvm alone (llvm) ({counts})",
            f"{t['tessera'] * 1e3:.2f} ms",
            f"{t['alone'] * 1e3:.2f} ms",
            f"{t['alone'] / t['tessera']:.1f}x",
        )
        row(
            "upstream",
            f"{r['model']}: apache-tvm + Tessera vs torch eager",
            f"{t['tessera'] * 1e3:.2f} ms",
            f"{t['torch'] * 1e3:.2f} ms",
            f"{t['torch'] / t['tessera']:.2f}x",
        )


#: CPU features that change which kernels run fast (matrix units, bf16 dot products, AVX-512).
_FEATURES = ("amx_tile", "amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx512f", "avx2")


def machine() -> str:
    """nproc, the CPU's model name, family and model numbers (a virtual machine's model name may be
    only "AMD EPYC": the family tells Zen 4 (25) from Zen 5 (26)), its matrix-relevant features."""
    from tessera_tvm.capture import cpu_info

    fields = cpu_info()
    model = fields.get("model name", "unknown")
    if "cpu family" in fields:
        model += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    flags = set(fields.get("flags", "").split())
    features = ", ".join(f for f in _FEATURES if f in flags) or "no AVX2"
    return f"{os.cpu_count()} cores (nproc), {model} [{features}], {platform.machine()}, Python {platform.python_version()}"


def _dated_sections(path: Path) -> str:
    """The sections after the bench's own table in ``path`` (each a ``## `` heading: the sharded
    kernels' runs, the GPU runs, measurements written by hand), which a new table must not erase."""
    if not path.exists():
        return ""
    text = path.read_text()
    at = text.find("\n## ")
    return text[at + 1 :] if at >= 0 else ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    parser.add_argument(
        "--only",
        default="cpu,threads,conv,models,hf,upstream,compile,gpu,gpu-models",
        help="sections, comma-separated",
    )
    parser.add_argument("--gpu-target", default="hopper", help="config of the gpu section (hopper or ampere)")
    args = parser.parse_args(argv)
    threads = numpy_threads()
    torch.set_num_threads(threads)
    start = time.perf_counter()
    print(f"{'section':<10} {'case':<44} {'tessera':>16} {'peer':>26} {'ratio':>8} {'of peak':>8}")
    sections = args.only.split(",")
    if "cpu" in sections:
        measure_peak(threads)
    if "cpu" in sections:
        bench_cpu(args.quick)
    if "threads" in sections:
        bench_threads(args.quick)
    if "conv" in sections:
        bench_conv(args.quick)
    if "models" in sections:
        bench_packed_weight(args.quick)
        bench_models(args.quick)
    if "hf" in sections:
        bench_hf(args.quick)
    if "upstream" in sections:
        bench_upstream(args.quick)
    if "compile" in sections:
        bench_compile(args.quick)
    if "gpu" in sections:
        bench_gpu(args.quick, args.gpu_target)
    if "gpu-models" in sections:
        bench_gpu_models(args.quick, args.gpu_target)
    total = time.perf_counter() - start
    lines = [
        "# Tessera benchmark results",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}; numpy/torch threads: {threads}",
        f"- command: `python {' '.join(['bench/bench.py', *(argv if argv is not None else sys.argv[1:])])}`",
        f"- total time: {total:.0f} s; each figure the median of several runs; ratio > 1: Tessera faster; "
        "of peak: Tessera's GFLOP/s over the peak rows (bench/peak.cpp on the same threads)",
        "",
        "| section | case | tessera | peer | ratio | tessera of peak |",
        "|---|---|---|---|---|---|",
        *(f"| {' | '.join(r)} |" for r in ROWS),
        "",
    ]
    out = Path(args.out)
    kept = _dated_sections(out)
    out.write_text("\n".join(lines) + ("\n" + kept if kept else ""))
    print(f"written {args.out} ({total:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
