"""Compiling one instance: a kernel with every dim bound, through Schedule IR, Tile IR and Target IR.

:func:`_compile_instance` takes the kernel's Graph IR, chooses and validates a
:class:`~tessera.schedule.Schedule` for every fused kernel before any is lowered (from the config's
``schedule:`` defaults and the user's overrides; autotuned kernels carry their summary), builds each
one's TileLang PrimFunc with :func:`tile_program` (from the spec its backend holds: on the CPU fp8 as
float32), lowers it with ``tessera_tvm.lower`` and records every step as a :class:`~tessera.instance.PassLogEntry`;
with dump stages it writes them through :mod:`tessera.dumps`. The autotuner's compile workers build
their tile programs with :func:`tile_program` too, so the kernel cache entries match ``ts.compile``'s.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tessera_tvm
from tessera_tvm import planner
from tessera_tvm.capture import collecting_logs
from tessera_tvm.graph import GraphIR, kernel_spec
from tessera_tvm.tile import (
    SpecError,
    UnsupportedTTOperationError,
    cpu_storage,  # noqa: F401  (re-exported: tessera.compiler.cpu_storage)
)
from tessera_tvm.trace import span

from .dumps import write_dumps
from .errors import KernelError, ScheduleError
from .instance import DeviceKernel, Instance, PassLogEntry
from .kernel import Kernel
from .repro import CompileProgress, capture_compile_failure
from .schedule import Schedule, TuningSummary, choose_schedule, split_overrides


def _graph_log(name: str, graph: GraphIR) -> list[PassLogEntry]:
    return [PassLogEntry("graph", name, r.phase, r.name, r.seconds, r.status) for r in graph.records]


# ---------------------------------------------------------------------------------------------
# Compiling one instance
# ---------------------------------------------------------------------------------------------


def _compile_instance(
    kernel: Kernel,
    config,
    env: dict[str, int],
    overrides: dict[str, Any],
    dump_stages: tuple[str, ...],
    dump_dir: Path | None,
    build: bool,
    tuning: Mapping[str, TuningSummary] | None = None,
) -> Instance:
    progress = CompileProgress()
    with span(f"instance {kernel.name}", "host", target=config.name, shapes=str(env)), collecting_logs(kernel.name):
        try:
            return _compile_stages(kernel, config, env, overrides, dump_stages, dump_dir, build, tuning, progress)
        except Exception as exc:  # a crash capture (tessera.repro), its path at the end of the message
            capture_compile_failure(exc, kernel, config, env, overrides, build, progress)
            raise


def _compile_stages(kernel, config, env, overrides, dump_stages, dump_dir, build, tuning, progress) -> Instance:
    graph_dumps = dump_dir / "passes" / "graph" if dump_dir is not None and "graph" in dump_stages else None
    graph, log, planned = _planned(kernel, config, env, overrides, graph_dumps, tuning, progress)
    out_root = dump_dir if dump_dir is not None and "target" in dump_stages else None  # else: the kernel cache
    devices = []
    for group, binding, schedule in planned:
        progress.stage, progress.group = "tile", group.name
        start = time.perf_counter()
        with span(f"tile {group.name}", "host"):
            tile, spec = tile_program(group.name, group.describe(), binding.spec, schedule, config)
        progress.tiles[group.name] = tile
        progress.stage = "target"
        log.append(PassLogEntry("tile", group.name, "tile", "build tile program", time.perf_counter() - start))
        passes_dir = dump_dir / "passes" / group.name if dump_dir is not None and "target" in dump_stages else None
        out_dir = out_root / "artifacts" / group.name if out_root is not None else None
        with span(f"target {group.name}", "host", config=config.name, build=build):
            lowered = tessera_tvm.lower(tile, config, dump_dir=passes_dir, out_dir=out_dir, build=build)
        log.extend(PassLogEntry("target", group.name, r.phase, r.name, r.seconds, r.status) for r in lowered.pass_log)
        devices.append(DeviceKernel(group.name, binding, schedule, tile, lowered, spec))
    instance = Instance(kernel, config, dict(env), graph, devices, log)
    if dump_dir is not None and dump_stages:
        write_dumps(instance, dump_dir, dump_stages)
    return instance


def _planned(kernel, config, env, overrides, graph_dumps, tuning, progress) -> tuple[GraphIR, list, list]:
    """Graph IR, then Schedule IR for every fused kernel (an override the target cannot hold fails
    before anything lowers): the graph, the pass log so far and each kernel's (group, binding, schedule)."""
    with span("graph", "host", kernel=kernel.name):
        graph = kernel.graph(env, target=config, dump_dir=graph_dumps)
    tuning = tuning or {}
    log = _graph_log(kernel.name, graph)
    per_kernel = split_overrides(overrides, [g.name for g in graph.groups], f"kernel {kernel.name}")
    planned = []
    for group in graph.groups:
        progress.stage, progress.group = "sched", group.name
        start = time.perf_counter()
        try:
            binding = kernel_spec(group, env)
        except SpecError as exc:
            raise KernelError(
                f"fused kernel {group.name} ({group.describe()}) has no tile kernel: {exc}",
                location=(kernel.fn.__code__.co_filename, kernel.fn.__code__.co_firstlineno),
            ) from None
        with span(f"sched {group.name}", "host", ops=group.describe()):
            schedule = choose_schedule(group.name, group.describe(), binding.spec, config, per_kernel[group.name])
        if group.name in tuning:
            schedule = dataclasses.replace(schedule, autotune=tuning[group.name])
        progress.schedules[group.name] = schedule
        log.append(
            PassLogEntry(
                "sched",
                group.name,
                "schedule",
                "choose schedule",  # a step of the frontend, not a registered pass
                time.perf_counter() - start,
                "ran (autotuned)" if group.name in tuning else "ran (overridden)" if per_kernel[group.name] else "ran",
            )
        )
        planned.append((group, binding, schedule))
    return graph, log, planned


def tile_programs(kernel: Kernel, config, env: dict[str, int], overrides: dict[str, Any] | None = None) -> dict:
    """Each fused kernel's TileLang program at ``env``, as ``ts.compile`` builds it, without lowering
    it: for what looks at the Tile IR alone (a GPU kernel's lowering costs seconds)."""
    _, _, planned = _planned(kernel, config, env, overrides or {}, None, None, CompileProgress())
    return {
        group.name: tile_program(group.name, group.describe(), binding.spec, schedule, config)[0]
        for group, binding, schedule in planned
    }


def tile_program(name: str, describe: str, spec, schedule: Schedule, config) -> tuple[Any, Any]:
    """The TileLang PrimFunc of fused kernel ``name`` under ``schedule``, and the spec it was built from
    (on the CPU fp8 is held as f32). The autotuner's workers build programs here too, so the
    kernel cache entries they leave are the ones ``ts.compile`` finds."""
    try:
        return planner.tile_program(spec, schedule.tile_schedule(), config, name)
    except UnsupportedTTOperationError as exc:
        raise UnsupportedTTOperationError(f"kernel {name} ({describe}): {exc}") from None
    except SpecError as exc:
        raise ScheduleError(f"kernel {name} on {config.name}: {exc}") from None
