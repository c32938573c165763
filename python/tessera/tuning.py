"""Autotuning: the fastest schedule of every fused kernel, searched over the target config's space.

    result = ts.autotune(linear, target="cpu", shapes={"M": 512, "N": 512, "K": 512})
    print(result)                   # per fused kernel: every candidate, its time or why it was dropped
    result.best                     # {fused kernel: Schedule}, each with its ``sched.autotune`` line
    result.schedule                 # the winning overrides: ts.compile(..., schedule=result.schedule)
    k = ts.compile(linear, target="cpu", shapes=..., autotune=True)   # tunes first (or reads the cache)

Per fused kernel of the Graph IR, tuned separately (each is a separate device kernel):

1. Candidates: the config's default schedule, then the cartesian product of the config's
   ``autotune:`` lists (or ``space=``). Fields the user fixed (``schedule=``, ``@ts.schedule``) stay fixed.
2. Pruning, before anything is compiled: every candidate goes through :func:`choose_schedule`, the
   resource model (shared memory, CPU local arrays, threads, the MMA shape). Rejected candidates are
   listed with the reason (``shared memory 264 KiB > 227 KiB``); candidates that build the same tile
   program (equal in the fields :func:`tessera_tvm.tile.program_fields` says it reads: no ``block_k``
   outside GEMMs, no ``threads`` on the CPU; blocks clamped to a small problem) are measured once.
   When every candidate of a kernel is pruned, :class:`AutotuneError` lists the reasons and nothing
   has been compiled.
3. Compiling, in parallel worker processes: fresh interpreters (``subprocess``, not ``fork``: a
   forked TVM/torch process may hold locks of threads that do not exist in the child; not
   ``multiprocessing`` spawn either, which re-runs the user's ``__main__`` script in every worker).
   A candidate that fails to compile, kills its worker, or compiles longer than ``compile_timeout``
   (its worker and compilers are killed, a fresh worker takes the next one) is reported as failed
   and the rest go on; ``workers=0`` compiles in this process, with no time limit. Workers leave
   their builds in the persistent kernel cache, where the measuring process and the final
   ``ts.compile`` find them.
4. Measuring, in this process, after the compiles (timings never overlap them): every candidate is
   run once and its result compared with the default schedule's (one that disagrees is reported as
   failed, never chosen); then ``repeats`` rounds time each candidate once in turn, so load from
   other processes falls on all of them alike. A candidate's time is its fastest sample.
5. The result of each fused kernel is cached under ``$TESSERA_CACHE_DIR/autotune`` per (fused kernel
   spec with its shapes, fixed fields, space, surviving candidates, config fingerprint, versions of
   Tessera/TileLang/TVM/compiler, machine, repeats, compile_timeout); a hit compiles and measures nothing.

Measuring needs the kernels to run here: CPU configs always; CUDA configs where a GPU and a CUDA
runtime library exist (see :data:`BENCHES`). Elsewhere ``measure=False`` lists the candidates that
pass the resource model without compiling any.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import os
import pickle
import platform
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import tessera_tvm
from tessera_tvm.cache import KernelCache, versions
from tessera_tvm.config import AUTOTUNE_KEYS
from tessera_tvm.graph import kernel_spec
from tessera_tvm.tile import program_fields

from .errors import AutotuneError, ScheduleError, ShapeError, user_location
from .kernel import Kernel
from .schedule import OVERRIDABLE, Schedule, TuningSummary, _ms, choose_schedule, split_overrides

__all__ = ["AutotuneResult", "BENCHES", "Candidate", "KernelTuning", "autotune"]

_FORMAT = 2  # of the tuning cache's records (2: fastest sample, not the median)

#: The statuses a candidate ends in.
STATUSES = {
    "measured": "compiled and timed",
    "pruned": "rejected by the resource model; not compiled",
    "same": "the same schedule as an earlier candidate; measured once",
    "skipped": "left out by max_candidates",
    "failed": "failed to compile or run, or disagreed with the default schedule's result",
    "planned": "passes the resource model (measure=False: not compiled)",
}


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One point of the search space for one fused kernel, and what became of it."""

    index: int
    fields: tuple[tuple[str, int], ...]  # the space's values (empty: the config's default schedule)
    status: str  # a key of STATUSES
    reason: str = ""  # why pruned/failed/same/skipped
    schedule: Schedule | None = None  # None when pruned
    seconds: float | None = None  # seconds per call, its fastest timed sample (measured candidates)
    compile_seconds: float | None = None

    @property
    def default(self) -> bool:
        """The config's default schedule (candidate #0, the reference every result is checked against)."""
        return self.index == 0

    @property
    def overrides(self) -> dict[str, int]:
        return dict(self.fields)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "fields": [list(f) for f in self.fields],
            "status": self.status,
            "reason": self.reason,
            "schedule": self.schedule.as_dict() if self.schedule is not None else None,
            "seconds": self.seconds,
            "compile_seconds": self.compile_seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        schedule = Schedule.from_json(data["schedule"]) if data["schedule"] is not None else None
        fields = tuple((str(k), int(v)) for k, v in data["fields"])
        return cls(
            data["index"], fields, data["status"], data["reason"], schedule, data["seconds"], data["compile_seconds"]
        )


@dataclass
class KernelTuning:
    """The search for one fused kernel: its candidates, the best one and the spread."""

    kernel: str  # the fused kernel's name
    family: str
    space: tuple[str, ...]  # the fields searched, in column order
    candidates: list[Candidate]
    best_index: int | None = None
    summary: TuningSummary | None = None  # None with measure=False
    key: str = ""  # of the tuning cache

    @property
    def best(self) -> Schedule | None:
        """The chosen schedule, with its ``sched.autotune`` summary."""
        if self.best_index is None:
            return None
        return dataclasses.replace(self.candidates[self.best_index].schedule, autotune=self.summary)

    @property
    def default(self) -> Candidate:
        return self.candidates[0]

    @property
    def overrides(self) -> dict[str, int]:
        """The schedule fields that select the best candidate (empty: the config's default won)."""
        return self.candidates[self.best_index].overrides if self.best_index is not None else {}

    @property
    def cached(self) -> bool:
        return self.summary is not None and self.summary.cached

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.candidates)

    def table(self) -> str:
        """One row per candidate: its fields, status, time and note."""
        columns = list(self.space)
        rows = [["#", *columns, "status", "time", "note"]]
        for c in self.candidates:
            values = dict(c.fields)
            if c.schedule is not None:
                values = {k: _field(c.schedule, k) for k in columns}
            note = "default" if c.default else ""
            if c.index == self.best_index:
                note = "best" + (" (default)" if c.default else "")
            if c.reason:
                note = f"{note}; {c.reason}" if note else c.reason
            time_text = _ms(c.seconds) if c.seconds is not None else ""
            rows.append([str(c.index), *(str(values.get(k, "")) for k in columns), c.status, time_text, note])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
        return f"{self.kernel} ({self.family})\n" + "\n".join("  " + line.rstrip() for line in lines) + "\n"

    def summary_line(self) -> str:
        counts = ", ".join(f"{self.count(s)} {s}" for s in STATUSES if self.count(s))
        if self.summary is None:
            return f"{self.kernel}: {counts} (not measured)"
        best = self.candidates[self.best_index]
        fields = " ".join(f"{k}={_field(best.schedule, k)}" for k in self.space)
        return f"{self.kernel}: {fields} ({'the default' if best.default else f'#{best.index}'}); {self.summary.text()}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "family": self.family,
            "space": list(self.space),
            "candidates": [c.as_dict() for c in self.candidates],
            "best_index": self.best_index,
            "summary": self.summary.as_dict() if self.summary is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], key: str = "") -> KernelTuning:
        summary = TuningSummary(**data["summary"]) if data["summary"] is not None else None
        return cls(
            data["kernel"],
            data["family"],
            tuple(data["space"]),
            [Candidate.from_dict(c) for c in data["candidates"]],
            data["best_index"],
            summary,
            key,
        )


@dataclass
class AutotuneResult:
    """What :func:`autotune` returns: one :class:`KernelTuning` per fused kernel."""

    kernel: str
    target: str
    shapes: dict[str, int]
    kernels: list[KernelTuning]
    seconds: float = 0.0  # wall time of this call
    compile_seconds: float = 0.0  # wall time of the parallel compiles
    measure_seconds: float = 0.0
    workers: int = 0

    @property
    def best(self) -> dict[str, Schedule]:
        """The chosen schedule of every fused kernel (each shows ``sched.autotune``)."""
        return {t.kernel: t.best for t in self.kernels if t.best is not None}

    @property
    def schedule(self) -> dict[str, dict[str, int]]:
        """Overrides that select the chosen schedules: ``ts.compile(..., schedule=result.schedule)``."""
        return {t.kernel: t.overrides for t in self.kernels if t.overrides}

    @property
    def cached(self) -> bool:
        """Whether every fused kernel came from the tuning cache (nothing compiled or measured)."""
        return all(t.cached for t in self.kernels)

    def table(self) -> str:
        return "\n".join(t.table() for t in self.kernels)

    def summary(self) -> str:
        bound = ", ".join(f"{k}={v}" for k, v in self.shapes.items())
        head = f"autotune {self.kernel} on {self.target} ({bound}): {len(self.kernels)} fused kernel(s)"
        if self.cached:
            head += ", from the tuning cache"
        else:
            head += (
                f" in {self.seconds:.1f} s (compile {self.compile_seconds:.1f} s in {self.workers} worker(s), "
                f"measure {self.measure_seconds:.1f} s)"
            )
        return head + "\n" + "\n".join("  " + t.summary_line() for t in self.kernels) + "\n"

    def __str__(self) -> str:
        return self.table() + "\n" + self.summary()

    def to_json(self) -> str:
        return json.dumps(
            {
                "kernel": self.kernel,
                "target": self.target,
                "shapes": self.shapes,
                "seconds": self.seconds,
                "kernels": [t.as_dict() for t in self.kernels],
                "schedule": self.schedule,
            },
            indent=2,
        )


def _field(schedule: Schedule, name: str) -> int:
    return getattr(schedule, "swizzle" if name == "rasterize" else name)


# ---------------------------------------------------------------------------------------------
# The search space
# ---------------------------------------------------------------------------------------------


def normalize_space(space: Mapping[str, Any], where: str) -> dict[str, tuple[int, ...]]:
    """``space`` checked like a config's ``autotune:`` section: field -> distinct ints, ``rasterize`` as ``swizzle``."""
    if not isinstance(space, Mapping):
        raise AutotuneError(f"{where}: space is {space!r}; expected a mapping of field -> list of ints")
    out: dict[str, tuple[int, ...]] = {}
    for key, values in space.items():
        name = "swizzle" if key == "rasterize" else key
        if name not in OVERRIDABLE:
            import difflib

            close = difflib.get_close_matches(str(key), list(AUTOTUNE_KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise AutotuneError(
                f"{where}: space key {key!r} is not a schedule field{hint}; fields: {', '.join(OVERRIDABLE)}"
            )
        if name in out:
            raise AutotuneError(f"{where}: space names {name} twice (swizzle and rasterize are the same field)")
        values = list(values) if isinstance(values, list | tuple) else [values]
        low = 0 if name == "swizzle" else 1
        if not values:
            raise AutotuneError(f"{where}: space[{key!r}] is empty; expected a list of ints >= {low}")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise AutotuneError(f"{where}: space[{key!r}] holds {v!r}; expected ints >= {low}")
        if len(set(values)) != len(values):
            raise AutotuneError(f"{where}: space[{key!r}] lists a value twice: {values}")
        out[name] = tuple(values)
    return out


@dataclass
class _Plan:
    """The candidates of one fused kernel, after pruning; what is left to compile and measure."""

    name: str
    describe: str
    spec: Any
    space: tuple[str, ...]
    candidates: list[Candidate]
    key: str = ""
    tuning: KernelTuning | None = None  # from the cache, or once measured
    compiled: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> worker's answer

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.candidates)

    @property
    def all_pruned(self) -> bool:
        """Every point of the space is rejected by the resource model (the default aside)."""
        return all(c.status == "pruned" for c in self.candidates[1:])

    @property
    def live(self) -> list[Candidate]:
        """Candidates to compile and measure (the default first)."""
        return [c for c in self.candidates if c.status in ("planned", "measured")]


def _plan(group, binding, config, space: dict[str, tuple[int, ...]], fixed: dict[str, int], max_candidates) -> _Plan:
    """Every candidate of one fused kernel through the resource model; nothing is compiled."""
    space = {k: v for k, v in space.items() if k not in fixed}  # fixed fields are not searched
    name, describe, spec = group.name, group.describe(), binding.spec
    try:  # what ts.compile would use
        default = choose_schedule(name, describe, spec, config, fixed)
        candidates = [Candidate(0, (), "planned", schedule=default)]
        seen = {_program_identity(default, config): 0}
    except ScheduleError as exc:  # the config's defaults may not fit its own resources either
        candidates, seen = [Candidate(0, (), "pruned", exc.reason)], {}
    for values in itertools.product(*space.values()):
        fields = tuple(zip(space, values, strict=True))
        index = len(candidates)
        try:
            schedule = choose_schedule(name, describe, spec, config, {**fixed, **dict(fields)})
        except ScheduleError as exc:
            candidates.append(Candidate(index, fields, "pruned", exc.reason))
            continue
        tile = _program_identity(schedule, config)
        if tile in seen:
            first = seen[tile]
            candidates.append(Candidate(index, fields, "same", f"as #{first}", schedule=schedule))
            continue
        seen[tile] = index
        candidates.append(Candidate(index, fields, "planned", schedule=schedule))
    live = [c for c in candidates if c.status == "planned"]
    if max_candidates is not None and len(live) > max_candidates:
        # Evenly spread over the space (the default always kept, as the reference).
        rest = live[1:]
        picks = {rest[round(i * (len(rest) - 1) / max(1, max_candidates - 2))].index for i in range(max_candidates - 1)}
        for c in rest:
            if c.index not in picks:
                candidates[c.index] = dataclasses.replace(
                    c, status="skipped", reason=f"max_candidates={max_candidates}"
                )
    return _Plan(name, describe, spec, tuple(space), candidates)


def _program_identity(schedule: Schedule, config) -> tuple:
    """The values of the schedule fields its tile program reads (the tile library's
    :func:`~tessera_tvm.tile.program_fields`); candidates equal here are one program."""
    tile = schedule.tile_schedule()
    return tuple(getattr(tile, name) for name in program_fields(schedule.family, config))


def _pruned_report(plans: list[_Plan], config) -> str:
    lines = []
    for plan in plans:
        pruned = [c for c in plan.candidates if c.status == "pruned"]
        default = "" if plan.candidates[0].status == "pruned" else " (the config's default schedule fits)"
        lines.append(f"  {plan.name} ({plan.spec.family}): all {len(plan.candidates) - 1} candidates pruned{default}")
        reasons: dict[str, list[str]] = {}
        for c in pruned:
            reasons.setdefault(c.reason, []).append(" ".join(f"{k}={v}" for k, v in c.fields) or "default")
        for reason, which in reasons.items():
            shown = "; ".join(which[:3]) + (f"; ... ({len(which) - 3} more)" if len(which) > 3 else "")
            lines.append(f"    {reason}: {shown}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Measuring on the target
# ---------------------------------------------------------------------------------------------


class CpuBench:
    """Runs CPU kernels in this process: numpy arrays, the shared library called through ctypes."""

    def __init__(self, spec, seed: int = 0):
        from .compiler import _numpy_dtype

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

    def prepare(self, lowered) -> tuple[Callable[[], Any], np.ndarray]:
        """A call of ``lowered`` on this bench's arrays, and the output of its first (warm-up) run."""
        from .compiler import _numpy_dtype

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

    def __init__(self, spec, seed: int = 0):
        import torch

        from .gpu import _default_device, torch_dtype

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

        from .gpu import torch_dtype

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

        from .gpu import gpu_available

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
    if kind == "c" and config.codegen_dict["compiler"] == "none":
        return "the config builds no library (codegen.compiler: none)"
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
# Compiling in worker processes
# ---------------------------------------------------------------------------------------------


def compile_candidate(job: Mapping[str, Any]) -> dict[str, Any]:
    """Build and lower one candidate (in a worker); its build lands in the persistent kernel cache."""
    from .compiler import tile_program

    start = time.perf_counter()
    try:
        tile, _ = tile_program(job["name"], job["describe"], job["spec"], job["schedule"], job["config"])
        lowered = tessera_tvm.lower(tile, job["config"])
    except Exception as exc:  # one candidate's failure is its own, reported in the table
        return {"ok": False, "error": _one_line(exc), "seconds": time.perf_counter() - start}
    return {"ok": True, "seconds": time.perf_counter() - start, "from_cache": lowered.from_cache}


def _one_line(exc: BaseException) -> str:
    """``exc`` for a table cell; a compiler failure shows its first error line, not its command line."""
    from tessera_tvm.errors import ToolchainError

    text = str(exc)
    if isinstance(exc, ToolchainError):
        errors = [ln.strip() for ln in exc.output.splitlines() if "error" in ln.lower()]
        tool = os.path.basename(exc.command[0]) if exc.command else "the compiler"
        text = f"{tool} failed: {errors[0] if errors else exc.output.strip()[:200]}"
    text = " ".join(text.split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(exc).__name__}: {text}"


#: Seconds one candidate may compile in a worker before the worker, and the compilers it started,
#: are killed and the candidate fails (``ts.autotune(compile_timeout=...)``).
COMPILE_TIMEOUT_S = 300.0
#: Seconds a fresh worker may take to start (import TVM and Tessera); not counted in the compile limit.
WORKER_START_TIMEOUT_S = 120.0
_READY = "ready"  # a worker's first message: started, imports done


def worker_main() -> None:
    """A compile worker: pickled jobs on stdin, pickled answers on stdout, until stdin closes."""
    from . import compiler  # noqa: F401  (imported before saying ready: the compile limit counts compiles)

    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints (TVM, g++) go to stderr, never into the answers
    sys.stdout = sys.stderr
    pickle.dump(_READY, answers)
    answers.flush()
    jobs = sys.stdin.buffer
    while True:
        try:
            job = pickle.load(jobs)
        except EOFError:
            return
        pickle.dump(compile_candidate(job), answers)
        answers.flush()


# The child takes the parent's sys.path, so it imports the same tessera the parent did.
_WORKER_BOOT = (
    "import json, os, sys; sys.path[:] = json.loads(os.environ['TESSERA_TUNE_SYS_PATH']); "
    "from tessera.tuning import worker_main; worker_main()"
)


def _kill(proc: subprocess.Popen) -> None:
    """``proc`` and the compilers it started (g++, nvcc): it leads its own process group."""
    if proc.returncode is not None:  # already reaped: its id may belong to another process now
        return
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # pragma: no cover - Windows: no process groups
            proc.kill()
    except OSError:  # gone already
        pass


class WorkerPool:
    """``workers`` compile processes fed from one queue. A job that kills its worker, or compiles longer
    than ``timeout`` seconds (None: no limit), fails alone: its worker is killed with the compilers it
    started, and a fresh worker takes the slot's next job."""

    def __init__(self, workers: int, env: Mapping[str, str] | None = None, timeout: float | None = None):
        self.workers = workers
        self.timeout = timeout
        self.env = {**os.environ, **dict(env or {}), "TESSERA_TUNE_SYS_PATH": json.dumps(sys.path)}
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen] = set()
        self._stopped = False

    def _start(self, stderr) -> subprocess.Popen | None:
        with self._lock:
            if self._stopped:
                return None
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_BOOT],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=self.env,
                start_new_session=True,  # a process group of its own: a timeout kills its g++/nvcc too
            )
            self._live.add(proc)
            return proc

    def run(self, jobs: list[tuple[Any, dict]], done: Callable[[Any, dict], None]) -> None:
        """Compile every ``(tag, job)``; ``done(tag, answer)`` is called (from a worker thread) for each."""
        todo: queue.Queue = queue.Queue()
        for item in jobs:
            todo.put(item)
        threads = [threading.Thread(target=self._serve, args=(todo, done), daemon=True) for _ in range(self.workers)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        finally:  # interrupted (Ctrl-C does not reach workers in their own process groups): none outlives us
            with self._lock:
                self._stopped = True
                live = list(self._live)
            for proc in live:
                _kill(proc)

    def _ask(self, proc: subprocess.Popen, job: dict | None, limit: float | None) -> tuple[Any, bool]:
        """``job`` sent to ``proc`` (None: nothing, read its ready message) and its answer; past ``limit``
        seconds ``proc`` is killed. (the answer, None when the worker died or was killed; whether killed)."""
        expired = threading.Event()

        def expire():
            expired.set()
            _kill(proc)

        timer = threading.Timer(limit, expire) if limit is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            if job is not None:
                pickle.dump(job, proc.stdin)
                proc.stdin.flush()
            answer = pickle.load(proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            answer = None
        finally:
            if timer is not None:
                timer.cancel()
                timer.join()  # a kill under way has been sent by now
        return answer, expired.is_set()

    def _reap(self, proc: subprocess.Popen, stderr) -> str:
        """Wait for a worker that died or was killed: ``(exit code N): <the end of its stderr>``."""
        code = proc.wait()
        with self._lock:
            self._live.discard(proc)
        stderr.seek(0)
        tail = " ".join(stderr.read().decode(errors="replace").split())[-300:]
        return f"(exit code {code}): {tail}"

    def _serve(self, todo: queue.Queue, done) -> None:
        with tempfile.TemporaryFile() as stderr:
            proc = None
            try:
                while True:
                    try:
                        tag, job = todo.get_nowait()
                    except queue.Empty:
                        return
                    if proc is None:
                        stderr.seek(0)
                        stderr.truncate()
                        proc = self._start(stderr)
                        if proc is None:  # the pool was stopped
                            return
                        ready, expired = self._ask(proc, None, WORKER_START_TIMEOUT_S)
                        if ready != _READY:
                            why = f"did not start in {WORKER_START_TIMEOUT_S:g} s" if expired else "died starting"
                            done(tag, {"ok": False, "error": f"the compile worker {why} {self._reap(proc, stderr)}"})
                            proc = None
                            continue
                    answer, expired = self._ask(proc, job, self.timeout)
                    if answer is None or expired:  # the worker is gone: the next job starts a fresh one
                        died = self._reap(proc, stderr)
                        proc = None
                        if answer is None and expired:
                            answer = {
                                "ok": False,
                                "error": f"compile exceeded {self.timeout:g} s (its worker was killed)",
                                "seconds": self.timeout,
                            }
                        elif answer is None:
                            answer = {"ok": False, "error": f"the compile worker died {died}"}
                    done(tag, answer)
            finally:
                if proc is not None:
                    proc.stdin.close()
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        _kill(proc)
                        proc.wait()
                    with self._lock:
                        self._live.discard(proc)


# ---------------------------------------------------------------------------------------------
# Progress on stderr
# ---------------------------------------------------------------------------------------------


class _Progress:
    """A one-line bar on a terminal (rewritten in place); one line per phase elsewhere (logs)."""

    def __init__(self, enabled: bool, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.lock = threading.Lock()

    def start(self, label: str, total: int) -> None:
        self.label, self.total, self.done, self.began = label, total, 0, time.perf_counter()
        self._draw("")

    def step(self, note: str = "") -> None:
        with self.lock:
            self.done += 1
            self._draw(note)

    def _draw(self, note: str) -> None:
        if not self.tty:
            return
        width = 24
        filled = width * self.done // max(1, self.total)
        bar = "#" * filled + "." * (width - filled)
        line = f"\r{self.label} [{bar}] {self.done}/{self.total} {note}"[:160]
        self.stream.write(line.ljust(100))
        self.stream.flush()

    def finish(self, note: str = "") -> None:
        if not self.enabled:
            return
        took = time.perf_counter() - self.began
        end = f"{self.label}: {self.done}/{self.total} in {took:.1f} s{'; ' + note if note else ''}"
        self.stream.write(("\r" + end.ljust(100) if self.tty else end) + "\n")
        self.stream.flush()

    def write(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text)
            self.stream.flush()


# ---------------------------------------------------------------------------------------------
# The tuning cache
# ---------------------------------------------------------------------------------------------


def _machine() -> str:
    """What the timings were measured on (timings from another CPU are not this one's)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model)
    except OSError:
        pass
    return f"{platform.system()} {platform.machine()} {model} x{os.cpu_count()}"


def _tuning_key(plan: _Plan, config, fixed: dict, space: dict, repeats: int, compile_timeout: float | None) -> str:
    payload = json.dumps(
        {
            "format": _FORMAT,
            "kernel": plan.name,
            "spec": plan.spec.fingerprint(),  # the fused computation with its shapes and dtypes
            "fixed": fixed,
            "space": {k: list(v) for k, v in space.items()},
            "candidates": [c.schedule.tile_schedule().fingerprint() for c in plan.live],
            "config": config.fingerprint(),
            "versions": versions(config),
            "machine": _machine(),
            "repeats": repeats,
            "compile_timeout": compile_timeout,  # a longer limit may compile what this one failed
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _tuning_cache(kernels: KernelCache) -> KernelCache:
    """The tuning results live next to the kernels: ``$TESSERA_CACHE_DIR/autotune``."""
    return KernelCache(kernels.root / "autotune" if kernels.enabled else None)


@contextmanager
def _kernel_cache_for_tuning() -> Iterator[dict[str, str]]:
    """A kernel cache for the workers to build into and this process to measure from; yields the
    workers' environment. With the cache disabled (``TESSERA_DISABLE_CACHE``) a private one serves
    this run and is removed after."""
    if KernelCache.from_env().enabled:
        yield {}
        return
    root = tempfile.mkdtemp(prefix="tessera_tune_")
    saved = {k: os.environ.get(k) for k in ("TESSERA_CACHE_DIR", "TESSERA_DISABLE_CACHE")}
    os.environ["TESSERA_CACHE_DIR"] = root
    os.environ.pop("TESSERA_DISABLE_CACHE", None)
    try:
        yield {"TESSERA_CACHE_DIR": root}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# ts.autotune
# ---------------------------------------------------------------------------------------------


def autotune(
    kernel: Kernel,
    target: str | Any = "cpu",
    *,
    shapes: Mapping[str, int] | None = None,
    space: Mapping[str, Any] | None = None,
    schedule: Mapping[str, Any] | None = None,
    max_candidates: int | None = None,
    workers: int | None = None,
    repeats: int = 5,
    progress: bool = True,
    cache: bool = True,
    measure: bool = True,
    compile_timeout: float | None = COMPILE_TIMEOUT_S,
) -> AutotuneResult:
    """Search the schedule space of every fused kernel of ``kernel`` on ``target`` for the fastest schedule.

    ``shapes`` binds every dim (tuning is per shape). ``space`` replaces the config's ``autotune:``
    lists (``{"block_m": [32, 64], ...}``); ``schedule`` fixes fields (they are not searched).
    ``max_candidates`` caps the candidates compiled per fused kernel (spread over the space, the
    default always kept). ``workers`` compile processes (default: the CPU count; 0 compiles in this
    process). ``repeats`` rounds of timed samples (a candidate's fastest sample counts). ``progress`` draws a bar
    and prints the summary on stderr. ``cache=False`` re-tunes without reading or writing the tuning
    cache. ``measure=False`` only prunes: the result lists what would be compiled.
    ``compile_timeout`` seconds (default :data:`COMPILE_TIMEOUT_S`; None: no limit) bound each
    candidate's compile in a worker: past it the worker and its compilers are killed, the candidate
    fails (``compile exceeded 300 s``) and the rest go on. It applies to worker compiles only: with
    ``workers=0`` candidates compile in this process, where nothing can stop a compile.

    Raises :class:`AutotuneError` when every candidate of a fused kernel is pruned (nothing is
    compiled then), when none compiles and runs, or when the target's kernels cannot be timed here.
    """
    begin = time.perf_counter()
    if not isinstance(kernel, Kernel):
        raise TypeError(f"ts.autotune takes a @tessera.kernel, found {kernel!r}")
    config = tessera_tvm.load_config(target)
    where = f"autotune {kernel.name} on {config.name}"
    env = kernel.check_shapes(shapes)
    missing = [s for s in kernel.symbols if s not in env]
    if missing:
        raise ShapeError(
            f"autotuning is per shape; bind {', '.join(missing)} with shapes={{{', '.join(repr(m) + ': ...' for m in missing)}}}",
            op="ts.autotune",
            location=user_location(),
        )
    if config.codegen_kind == "tt":
        raise AutotuneError(f"{where}: Tenstorrent kernels have fixed 32x32 tiles; there is no schedule to tune")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise AutotuneError(f"{where}: repeats is {repeats!r}; expected an int >= 1")
    if max_candidates is not None and (
        isinstance(max_candidates, bool) or not isinstance(max_candidates, int) or max_candidates < 1
    ):
        raise AutotuneError(f"{where}: max_candidates is {max_candidates!r}; expected an int >= 1")
    if compile_timeout is not None and (
        isinstance(compile_timeout, bool) or not isinstance(compile_timeout, int | float) or not compile_timeout > 0
    ):
        raise AutotuneError(f"{where}: compile_timeout is {compile_timeout!r}; expected seconds > 0 (None: no limit)")
    searched = normalize_space(dict(config.autotune) if space is None else space, where)
    if not searched:
        raise AutotuneError(
            f"{where}: the config ({config.source}) declares no autotune space; add an `autotune:` section "
            "(e.g. {block_m: [32, 64], block_n: [32, 64]}) or pass space={...}"
        )
    graph = kernel.graph(env)
    names = [g.name for g in graph.groups]
    fixed = split_overrides({**kernel.schedule_overrides, **dict(schedule or {})}, names, f"kernel {kernel.name}")

    # 1-2. Candidates through the resource model, for every fused kernel, before anything compiles.
    plans = [_plan(g, kernel_spec(g, env), config, searched, fixed[g.name], max_candidates) for g in graph.groups]
    dead = [p for p in plans if p.all_pruned]
    if dead:
        raise AutotuneError(
            f"{where}: every candidate is pruned by the resource model of {config.source}; nothing was "
            f"compiled. Widen the space or the config's resources:\n{_pruned_report(dead, config)}"
        )
    result = AutotuneResult(kernel.name, config.name, dict(env), [])
    if not measure:
        result.kernels = [KernelTuning(p.name, p.spec.family, p.space, p.candidates) for p in plans]
        result.seconds = time.perf_counter() - begin
        return result
    why = _cannot_measure(config)
    if why is not None:
        live = sum(len(p.live) for p in plans)
        raise AutotuneError(
            f"{where}: cannot measure on {config.name}: {why}. {live} candidate(s) pass the resource model "
            "(measure=False lists them without compiling)"
        )
    bench_type = BENCHES[config.codegen_kind]
    show = _Progress(progress)
    tuning_cache = _tuning_cache(KernelCache.from_env()) if cache else KernelCache(None)
    for plan in plans:
        space_searched = {k: searched[k] for k in plan.space}
        plan.key = _tuning_key(plan, config, fixed[plan.name], space_searched, repeats, compile_timeout)
        entry = tuning_cache.load(plan.key)
        if entry is not None:
            tuned = KernelTuning.from_dict(entry.record["tuning"], plan.key)
            tuned.summary = dataclasses.replace(tuned.summary, cached=True)
            plan.tuning = tuned
    todo = [p for p in plans if p.tuning is None]
    if todo:
        with _kernel_cache_for_tuning() as worker_env:
            result.workers, result.compile_seconds = _compile_all(
                todo, config, workers, worker_env, show, compile_timeout
            )
            start = time.perf_counter()
            _measure_all(todo, config, bench_type, repeats, show)
            result.measure_seconds = time.perf_counter() - start
        for plan in todo:
            if tuning_cache.enabled:
                tuning_cache.store(plan.key, {"tuning": plan.tuning.as_dict()}, {})
    result.kernels = [p.tuning for p in plans]
    result.seconds = time.perf_counter() - begin
    if todo:
        show.write(result.summary())
    return result


def _compile_all(
    plans: list[_Plan], config, workers: int | None, env: dict[str, str], show: _Progress, timeout: float | None
) -> tuple[int, float]:
    """Every live candidate compiled (in parallel, each within ``timeout`` seconds; workers=0: in this
    process, unbounded); answers recorded on the plans. (workers, seconds)."""
    start = time.perf_counter()
    jobs = [
        (
            (i, c.index),
            {"name": p.name, "describe": p.describe, "spec": p.spec, "schedule": c.schedule, "config": config},
        )
        for i, p in enumerate(plans)
        for c in p.live
    ]
    if workers is None:
        workers = os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise AutotuneError(f"workers is {workers!r}; expected an int >= 0 (0: compile in this process)")
    workers = min(workers, len(jobs))
    show.start(f"autotune: compiling {len(jobs)} candidates ({workers or 'no'} worker processes)", len(jobs))

    def done(tag, answer):
        plans[tag[0]].compiled[tag[1]] = answer
        show.step(f"{plans[tag[0]].name} #{tag[1]}")

    if workers == 0:
        for tag, job in jobs:
            done(tag, compile_candidate(job))
    else:
        WorkerPool(workers, env, timeout).run(jobs, done)
    failed = sum(not a["ok"] for p in plans for a in p.compiled.values())
    show.finish(f"{failed} failed" if failed else "")
    return workers, time.perf_counter() - start


#: One timed sample lasts at least this long (a tiny kernel is called several times per sample).
MIN_SAMPLE_S = 2e-3


def _measure_all(plans: list[_Plan], config, bench_type, repeats: int, show: _Progress) -> None:
    """Time every compiled candidate here and choose the best of each plan.

    Each candidate is loaded, run once (its result checked against the default schedule's) and
    calibrated; then ``repeats`` rounds time every candidate once each, so load from other processes
    falls on all candidates alike. A candidate's time is its fastest sample: interference only adds.
    """
    from .compiler import tile_program

    for plan in plans:
        show.start(
            f"autotune: measuring {plan.name} ({len(plan.live)} candidates, {repeats} rounds)", len(plan.live) + repeats
        )
        bench = None
        reference, reference_index = None, None
        ready: dict[int, tuple[Callable[[], Any], int]] = {}  # index -> (run, calls per sample)
        reasons: dict[int, str] = {}
        for c in plan.live:
            answer = plan.compiled.get(c.index, {"ok": False, "error": "not compiled"})
            if not answer["ok"]:
                reasons[c.index] = answer["error"]
                show.step()
                continue
            try:
                tile, tile_spec = tile_program(plan.name, plan.describe, plan.spec, c.schedule, config)
                lowered = tessera_tvm.lower(tile, config)  # the worker's build, from the kernel cache
                bench = bench or bench_type(tile_spec)
                run, out = bench.prepare(lowered)
                if reference is None:  # the default schedule's result, unless it failed
                    reference, reference_index = out, c.index
                if not _agrees(out, reference, tile_spec.outputs()[0].dtype):
                    reasons[c.index] = f"wrong result: differs from #{reference_index}'s"
                else:
                    once = bench.sample(run, 1)
                    ready[c.index] = (run, max(1, min(1000, int(MIN_SAMPLE_S / max(once, 1e-7)))))
            except Exception as exc:  # a candidate that does not run is reported, not fatal
                reasons[c.index] = _one_line(exc)
            show.step()
        samples: dict[int, list[float]] = {i: [] for i in ready}
        for _ in range(repeats):
            for index, (run, number) in ready.items():
                samples[index].append(bench.sample(run, number))
            show.step()
        for c in plan.live:
            measured = c.index in samples
            plan.candidates[c.index] = dataclasses.replace(
                c,
                status="measured" if measured else "failed",
                reason=reasons.get(c.index, ""),
                seconds=min(samples[c.index]) if measured else None,
                compile_seconds=plan.compiled.get(c.index, {}).get("seconds"),
            )
        show.finish()
        measured = [c for c in plan.candidates if c.status == "measured"]
        if not measured:
            failures = "\n".join(
                f"    #{c.index} {c.overrides or 'default'}: {c.reason}"
                for c in plan.candidates
                if c.status == "failed"
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
        plan.tuning = KernelTuning(
            plan.name, plan.spec.family, plan.space, plan.candidates, best.index, summary, plan.key
        )
