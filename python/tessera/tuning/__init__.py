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
runtime library exist (the backend runner's ``bench``; :data:`BENCHES` lists them). Elsewhere ``measure=False`` lists the candidates that
pass the resource model without compiling any.

``executor="ray"`` sends steps 3 and 4 to Ray workers (``ray_executor``): one candidate per call, each
compiled by an actor within the same time limit and then run and timed on the node that compiled it;
pruning, the result check, the choice and the cache stay here.

This package holds :func:`autotune`; the rest lives in its modules, their names re-exported here: ``results``
(:class:`Candidate`, :class:`KernelTuning`, :class:`AutotuneResult`), ``space`` (candidates and
pruning), ``workers`` (compiling in worker processes), ``measure`` (the benches and the timing loop),
``ray_executor`` (both on Ray), ``cache`` (the tuning cache) and ``progress`` (the bar on stderr).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import tessera_tvm
from tessera_tvm.cache import KernelCache
from tessera_tvm.graph import kernel_spec
from tessera_tvm.target.backend import backend_for

from ..errors import AutotuneError, ShapeError, user_location
from ..kernel import Kernel
from ..schedule import split_overrides

# ``X as X``: re-exported, not used here; the names of the module this package replaced stay importable
# from tessera.tuning (``worker_main`` is how every compile worker starts).
from .cache import _kernel_cache_for_tuning, _tuning_cache, _tuning_key
from .measure import BENCHES, _cannot_measure, _measure_all, bench_for
from .measure import MIN_SAMPLE_S as MIN_SAMPLE_S
from .measure import CpuBench as CpuBench
from .measure import CudaBench as CudaBench
from .progress import _Progress
from .ray_executor import cannot_measure as _cannot_measure_on_ray
from .ray_executor import check_options as _check_ray_options
from .ray_executor import run_on_ray
from .results import STATUSES as STATUSES
from .results import AutotuneResult, Candidate, KernelTuning
from .space import _plan, _pruned_report, normalize_space
from .workers import COMPILE_TIMEOUT_S, _compile_all
from .workers import WORKER_START_TIMEOUT_S as WORKER_START_TIMEOUT_S
from .workers import WorkerPool as WorkerPool
from .workers import compile_candidate as compile_candidate
from .workers import worker_main as worker_main

__all__ = ["AutotuneResult", "BENCHES", "Candidate", "EXECUTORS", "KernelTuning", "autotune"]

#: Where candidates compile and run: ``executor=`` of :func:`autotune`.
EXECUTORS = {
    "local": "worker processes on this machine compile; this process measures",
    "ray": "Ray workers compile and measure (pip install 'tessera[ray]')",
}


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
    executor: str = "local",
    ray_address: str | None = None,
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

    ``executor="ray"`` compiles and measures on Ray workers (one candidate per call; ``workers``: the
    compiling actors, default one per CPU of the cluster, or per GPU on GPU targets). ``ray_address``
    joins that cluster; None starts a local Ray for the call and shuts it down after. A process that
    has joined Ray already (``ray.init``) searches on that one.

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
    refused = backend_for(config).tuning_refused
    if refused is not None:  # Tenstorrent: one fixed tile
        raise AutotuneError(f"{where}: {refused}")
    if not isinstance(executor, str) or executor not in EXECUTORS:
        choices = "; ".join(f"{name!r}: {what}" for name, what in EXECUTORS.items())
        raise AutotuneError(f"{where}: executor is {executor!r}; expected one of {choices}")
    if ray_address is not None and executor != "ray":
        raise AutotuneError(f"{where}: ray_address={ray_address!r} is for executor='ray' (executor is {executor!r})")
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
    graph = kernel.graph(env, target=config)
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
    ray = _check_ray_options(workers, where) if executor == "ray" else None
    why = _cannot_measure(config) if ray is None else _cannot_measure_on_ray(config)
    if why is not None:
        live = sum(len(p.live) for p in plans)
        raise AutotuneError(
            f"{where}: cannot measure on {config.name}: {why}. {live} candidate(s) pass the resource model "
            "(measure=False lists them without compiling)"
        )
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
            if ray is not None:
                result.workers, result.compile_seconds, result.measure_seconds = run_on_ray(
                    ray,
                    todo,
                    config,
                    workers=workers,
                    timeout=compile_timeout,
                    repeats=repeats,
                    address=ray_address,
                    show=show,
                    where=where,
                )
            else:
                result.workers, result.compile_seconds = _compile_all(
                    todo, config, workers, worker_env, show, compile_timeout
                )
                start = time.perf_counter()
                _measure_all(todo, config, bench_for(config), repeats, show)
                result.measure_seconds = time.perf_counter() - start
        for plan in todo:
            if tuning_cache.enabled:
                tuning_cache.store(plan.key, {"tuning": plan.tuning.as_dict()}, {})
    result.kernels = [p.tuning for p in plans]
    result.seconds = time.perf_counter() - begin
    if todo:
        show.write(result.summary())
    return result
