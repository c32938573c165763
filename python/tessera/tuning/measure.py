"""Measuring on the target, in this process: the benches that run and time one target's kernels
(:class:`CpuBench` for CPU kernels through ctypes, :class:`CudaBench` for CUDA kernels timed by CUDA
events; :data:`BENCHES` maps a codegen kind to its bench), the check that a candidate's result agrees
with the default schedule's, and the measuring loop that times every compiled candidate of a fused
kernel and chooses the best.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import tessera_tvm
from tessera_tvm import capture

from ..errors import AutotuneError
from ..schedule import TuningSummary
from .progress import _Progress
from .results import KernelTuning
from .space import _Plan
from .workers import _one_line


class CpuBench:
    """Runs CPU kernels in this process: numpy arrays, the shared library called through ctypes."""

    on_gpu = False  # a Ray worker that measures these kernels needs no GPU

    def __init__(self, spec, seed: int = 0):
        from ..compiler import _numpy_dtype

        rng = np.random.default_rng(seed)
        self.spec = spec
        self.arrays: dict[str, np.ndarray] = {}
        for p in spec.inputs():
            dtype = _numpy_dtype(p.dtype)
            if np.issubdtype(dtype, np.integer):
                data = rng.integers(-3, 4, size=p.shape)
            else:
                data = rng.uniform(-1.0, 1.0, size=p.shape)
            self.arrays[p.name] = np.ascontiguousarray(data.astype(dtype))
        (self.out,) = spec.outputs()

    @staticmethod
    def available(config) -> str | None:
        """None when CPU kernels of ``config`` can be timed here, else why not (a library must be built)."""
        if config.codegen_dict["compiler"] == "none":
            return "the config builds no library (codegen.compiler: none)"
        return None

    def prepare(self, lowered) -> tuple[Callable[[], Any], np.ndarray]:
        """A call of ``lowered`` on this bench's arrays, and the output of its first (warm-up) run."""
        from ..compiler import _numpy_dtype

        out = np.empty(self.out.shape, dtype=_numpy_dtype(self.out.dtype))
        out.fill(np.nan if np.issubdtype(out.dtype, np.floating) else 0)  # an unwritten output shows
        run = functools.partial(
            lowered, *[out if p.name == self.out.name else self.arrays[p.name] for p in self.spec.params()]
        )
        run()  # warm-up: page faults, first touch, the library's lazy binding
        return run, out.copy()

    @staticmethod
    def sample(run: Callable[[], Any], number: int) -> float:
        """Seconds per call, over ``number`` back-to-back calls."""
        start = time.perf_counter()
        for _ in range(number):
            run()
        return (time.perf_counter() - start) / number


class CudaBench:
    """Runs CUDA kernels where a GPU and the kernel's runtime library exist; CUDA events time them.

    Inputs and the output are torch tensors on torch's current CUDA device (where ``run_on_gpu``
    puts numpy arguments too), passed to ``lowered`` in the tile program's parameter order
    (``LoweredModule.__call__`` with a runtime library). Tested without a GPU by
    tests/frontend/test_autotune.py, which emulates the device, the launch and the events on the CPU.
    """

    on_gpu = True  # a Ray worker that measures these kernels holds a GPU (num_gpus=1)

    def __init__(self, spec, seed: int = 0):
        import torch

        from ..gpu import _default_device, torch_dtype

        self.device = _default_device()
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.spec = spec
        self.arrays = {}
        for p in spec.inputs():
            dtype = torch_dtype(p.dtype)
            if dtype.is_floating_point:
                data = torch.rand(p.shape, generator=gen, device=self.device, dtype=torch.float32) * 2 - 1
            else:  # as CpuBench: -3..3, wrapped into the dtype
                data = torch.randint(-3, 4, p.shape, generator=gen, device=self.device, dtype=torch.int64)
            self.arrays[p.name] = data.to(dtype)
        (self.out,) = spec.outputs()

    def prepare(self, lowered) -> tuple[Callable[[], Any], np.ndarray]:
        """A call of ``lowered`` on this bench's tensors, and the output of its first (warm-up) run
        (floats as float32, integers as they are), copied to the host."""
        import torch

        from ..gpu import torch_dtype

        if "runtime" not in lowered.artifacts:
            raise AutotuneError(f"{lowered.name} has no CUDA runtime library (was nvcc on PATH?)")
        dtype = torch_dtype(self.out.dtype)
        fill = float("nan") if dtype.is_floating_point else 0  # an unwritten output shows
        out = torch.full(self.out.shape, fill, device=self.device, dtype=torch.float32).to(dtype)
        run = functools.partial(
            lowered, *[out if p.name == self.out.name else self.arrays[p.name] for p in self.spec.params()]
        )
        run()
        torch.cuda.synchronize(self.device)
        host = torch.float32 if dtype.is_floating_point else dtype
        return run, out.to("cpu", host, copy=True).numpy()

    def sample(self, run: Callable[[], Any], number: int) -> float:
        """Seconds per call, over ``number`` back-to-back calls, by CUDA events around them."""
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            run()
        end.record()
        torch.cuda.synchronize(self.device)
        return start.elapsed_time(end) / 1e3 / number  # elapsed_time is in milliseconds

    @staticmethod
    def available(config) -> str | None:
        """None when CUDA kernels of ``config`` can be timed here, else why not."""
        from tessera_tvm.target.cuda import nvcc_available

        from ..gpu import gpu_available

        if not gpu_available():
            return "no NVIDIA GPU is visible to this process"
        if not nvcc_available():
            return "nvcc is not on PATH (the kernels would have no cubin to run)"
        return None


#: codegen kind -> the bench that times its kernels; a target missing here cannot be measured.
BENCHES: dict[str, type] = {"c": CpuBench, "cuda": CudaBench}


def _cannot_measure(config) -> str | None:
    kind = config.codegen_kind
    bench = BENCHES.get(kind)
    if bench is None:
        return f"no bench times {kind} kernels in this process"
    check = getattr(bench, "available", None)
    return check(config) if check is not None else None


def _agrees(out: np.ndarray, ref: np.ndarray, dtype: str) -> bool:
    """Same result up to accumulation order (different block_k sum in a different order)."""
    if np.issubdtype(out.dtype, np.integer):
        return bool(np.array_equal(out, ref))
    # fp32 outputs: a K-long fp32 sum reordered; 16-bit outputs: one rounding step of the output type.
    rtol = 1e-3 if dtype in ("float32", "float64") else 2e-2
    scale = float(np.nanmax(np.abs(ref))) if np.isfinite(ref).any() else 1.0
    return bool(np.allclose(out, ref, rtol=rtol, atol=rtol * max(1.0, scale), equal_nan=True))


# ---------------------------------------------------------------------------------------------
# Timing every compiled candidate
# ---------------------------------------------------------------------------------------------


#: One timed sample lasts at least this long (a tiny kernel is called several times per sample).
MIN_SAMPLE_S = 2e-3


def _load_candidate(job: Mapping[str, Any]):
    """A compiled candidate's build, found in the kernel cache where its compile left it, and its tile spec."""
    from ..compiler import tile_program

    with capture.disabled():  # a candidate's failure is a table row, not a crash
        tile, tile_spec = tile_program(job["name"], job["describe"], job["spec"], job["schedule"], job["config"])
        return tessera_tvm.lower(tile, job["config"]), tile_spec


def _calls_per_sample(bench, run: Callable[[], Any]) -> int:
    """Calls that make one sample last about :data:`MIN_SAMPLE_S` (a tiny kernel is called several times)."""
    once = bench.sample(run, 1)
    return max(1, min(1000, int(MIN_SAMPLE_S / max(once, 1e-7))))


class _Reference:
    """The result every candidate of a fused kernel must agree with: the default schedule's, or, when
    the default failed, the first candidate's that ran (candidates are checked in index order)."""

    def __init__(self):
        self.out: np.ndarray | None = None
        self.index: int | None = None

    def check(self, index: int, out: np.ndarray, dtype: str) -> str:
        """Why ``out`` (candidate ``index``'s result) is wrong; empty when it agrees."""
        if self.out is None:
            self.out, self.index = out, index
        return "" if _agrees(out, self.out, dtype) else f"wrong result: differs from #{self.index}'s"


def measure_candidate(job: Mapping[str, Any], repeats: int) -> dict[str, Any]:
    """Run one compiled candidate on this machine's device (in a Ray worker): its build from the kernel
    cache, run once (the result comes back to be checked), then ``repeats`` samples timed back to back.
    ``{"ok": True, "out", "dtype", "seconds"}`` (the fastest sample), or ``{"ok": False, "error"}``."""
    config = job["config"]
    bench_type = BENCHES[config.codegen_kind]
    why = bench_type.available(config)
    if why is not None:
        return {"ok": False, "error": f"cannot measure here: {why}"}
    try:
        lowered, tile_spec = _load_candidate(job)
        bench = bench_type(tile_spec)
        run, out = bench.prepare(lowered)
        number = _calls_per_sample(bench, run)
        seconds = min(bench.sample(run, number) for _ in range(repeats))
    except Exception as exc:  # a candidate that does not run is reported, not fatal
        return {"ok": False, "error": _one_line(exc)}
    return {"ok": True, "out": out, "dtype": tile_spec.outputs()[0].dtype, "seconds": seconds}


def _measure_all(plans: list[_Plan], config, bench_type, repeats: int, show: _Progress) -> None:
    """Time every compiled candidate here and choose the best of each plan.

    Each candidate is loaded, run once (its result checked against the default schedule's) and
    calibrated; then ``repeats`` rounds time every candidate once each, so load from other processes
    falls on all candidates alike. A candidate's time is its fastest sample: interference only adds.
    """
    for plan in plans:
        show.start(
            f"autotune: measuring {plan.name} ({len(plan.live)} candidates, {repeats} rounds)", len(plan.live) + repeats
        )
        bench = None
        reference = _Reference()
        ready: dict[int, tuple[Callable[[], Any], int]] = {}  # index -> (run, calls per sample)
        reasons: dict[int, str] = {}
        for c in plan.live:
            answer = plan.compiled.get(c.index, {"ok": False, "error": "not compiled"})
            if not answer["ok"]:
                reasons[c.index] = answer["error"]
                show.step()
                continue
            try:
                lowered, tile_spec = _load_candidate(plan.job(c, config))  # the worker's build
                bench = bench or bench_type(tile_spec)
                run, out = bench.prepare(lowered)
                wrong = reference.check(c.index, out, tile_spec.outputs()[0].dtype)
                if wrong:
                    reasons[c.index] = wrong
                else:
                    ready[c.index] = (run, _calls_per_sample(bench, run))
            except Exception as exc:  # a candidate that does not run is reported, not fatal
                reasons[c.index] = _one_line(exc)
            show.step()
        samples: dict[int, list[float]] = {i: [] for i in ready}
        for _ in range(repeats):
            for index, (run, number) in ready.items():
                samples[index].append(bench.sample(run, number))
            show.step()
        show.finish()
        _choose(plan, config, {i: min(s) for i, s in samples.items()}, reasons)


def _choose(plan: _Plan, config, seconds: dict[int, float], reasons: dict[int, str]) -> None:
    """Every live candidate of ``plan`` marked measured (its time in ``seconds``) or failed (why, in
    ``reasons``), and the fastest chosen: ``plan.tuning``. Raises when none was measured."""
    for c in plan.live:
        measured = c.index in seconds
        plan.candidates[c.index] = dataclasses.replace(
            c,
            status="measured" if measured else "failed",
            reason=reasons.get(c.index, ""),
            seconds=seconds[c.index] if measured else None,
            compile_seconds=plan.compiled.get(c.index, {}).get("seconds"),
        )
    measured = [c for c in plan.candidates if c.status == "measured"]
    if not measured:
        failures = "\n".join(
            f"    #{c.index} {c.overrides or 'default'}: {c.reason}" for c in plan.candidates if c.status == "failed"
        )
        raise AutotuneError(f"autotune {plan.name} on {config.name}: no candidate compiled and ran:\n{failures}")
    times = sorted(c.seconds for c in measured)
    best = min(measured, key=lambda c: c.seconds)
    default = plan.candidates[0]
    summary = TuningSummary(
        measured=len(measured),
        pruned=plan.count("pruned"),
        failed=plan.count("failed"),
        best_s=best.seconds,
        median_s=statistics.median(times),
        worst_s=times[-1],
        default_s=default.seconds if default.status == "measured" else None,
    )
    plan.tuning = KernelTuning(plan.name, plan.spec.family, plan.space, plan.candidates, best.index, summary, plan.key)
