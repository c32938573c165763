"""Measuring on the target, in this process: the bench that runs and times one target's kernels is
its backend runner's (``backend_for(config).runner.bench``: ``CpuBench`` for CPU kernels through
ctypes in ``tessera_tvm.target.cpu.runner``, ``CudaBench`` for CUDA kernels timed by CUDA events in
``tessera_tvm.target.cuda.runner``), the check that a candidate's result agrees
with the default schedule's, and the measuring loop that times every compiled candidate of a fused
kernel and chooses the best.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import tessera_tvm
from tessera_tvm import capture
from tessera_tvm.target.backend import backend_for, known_kinds
from tessera_tvm.target.cpu.runner import CpuBench as CpuBench  # noqa: F401  (re-exported: the old names)
from tessera_tvm.target.cuda.runner import CudaBench as CudaBench  # noqa: F401

from ..errors import AutotuneError
from ..schedule import TuningSummary
from .progress import _Progress
from .results import KernelTuning
from .space import _Plan
from .workers import _one_line


def bench_for(config) -> type | None:
    """The bench that times ``config``'s kernels: its backend runner's (None: none in this process)."""
    return backend_for(config).runner.bench


def _cannot_measure(config) -> str | None:
    return backend_for(config).runner.cannot_measure(config)


#: codegen kind -> the bench that times its kernels, as the backends' runners give them (the old
#: table's name; the measuring asks the runner of the config's backend).
BENCHES: dict[str, type] = {
    kind: bench for kind in known_kinds() if (bench := backend_for(kind).runner.bench) is not None
}


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
    bench_type = bench_for(config)
    why = _cannot_measure(config)
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
