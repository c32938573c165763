"""The kernel planner: how a kernel spec becomes a tile schedule and a tile program on a target.

Every path that builds Tessera kernels plans them here, so one set of rules decides what a kernel
looks like whichever way it was asked for:

- ``ts.compile`` (``tessera.schedule.choose_schedule``, ``tessera.build.tile_program``),
- the autotuner (its candidates go through ``choose_schedule``; its compile workers build with
  ``tile_program``, so their kernel cache entries are the ones ``ts.compile`` finds),
- Relax offload (``tessera_tvm.relax.patterns.plan_kernel``, ``relax.offload``).

The rules: the config's ``schedule:`` defaults fitted to the problem (:meth:`TileSchedule.from_config`;
a symbolic dim is fitted at its hint; a convolution's algorithm, direct or implicit GEMM, chosen on the
CPU where it is not overridden), a user's overrides (an attention ``overlap`` the target cannot
run is refused, GPU blocks must tile into the config's MMA shape), the resource checks
(:func:`validate_schedule`), the spec as the backend holds it (its ``tile_spec`` hook: the CPU holds
fp8 as float32) and the backend's codegen kind, never the config's TVM kind (Tenstorrent's TVM
kind is ``c``; its programs are ``tt`` programs).

Errors are the tile library's (:class:`SpecError`, :class:`~tessera_tvm.errors.ResourceError`,
:class:`MmaError`); each frontend words them for its users (``ScheduleError`` for ``ts.compile``,
a match's rejection reason for Relax).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .config import TargetConfig, load_config
from .target.backend import backend_for
from .tile import KernelSpec, SpecError, TileSchedule, build_tile_program, settle_overlap, validate_schedule
from .tile.base import bind_dims
from .tile.specs import AttentionSpec, GemmSpec

__all__ = ["MmaError", "check_mma", "held_spec", "schedule_for", "tile_program", "with_packed_b"]


class MmaError(SpecError):
    """Blocks that do not tile into the config's MMA instruction shape (``schedule.mma``)."""

    def __init__(self, problems: list[str], mma: tuple[int, int, int]):
        self.problems = tuple(problems)
        self.mma = mma
        super().__init__(f"{'; '.join(problems)} (schedule.mma is {'x'.join(map(str, mma))})")


def check_mma(spec: KernelSpec, tile: TileSchedule, config: TargetConfig) -> None:
    """Raise :class:`MmaError` unless the blocks of a GEMM or attention tile into the config's MMA
    instruction shape: wgmma (``hardware.wgmma``) takes any N that is a multiple of 8 up to its N,
    other MMAs one fixed N."""
    mma = dict(config.schedule).get("mma")
    if mma is None or not isinstance(spec, GemmSpec | AttentionSpec):
        return
    m, n, k = (int(x) for x in mma)
    wgmma = bool(config.fact("wgmma"))
    n_step = 8 if wgmma else n
    problems = []
    if tile.block_m % m:
        problems.append(f"block_m={tile.block_m} is not a multiple of the MMA's M={m}")
    if tile.block_n % n_step:
        problems.append(f"block_n={tile.block_n} is not a multiple of {n_step} (the MMA's N{' step' if wgmma else ''})")
    if isinstance(spec, GemmSpec) and tile.block_k % k:
        problems.append(f"block_k={tile.block_k} is not a multiple of the MMA's K={k}")
    if problems:
        raise MmaError(problems, (m, n, k))


def schedule_for(
    spec: KernelSpec,
    config: Any,
    overrides: Mapping[str, Any] | None = None,
    *,
    hints: Mapping[str, int] | None = None,
) -> TileSchedule:
    """The tile schedule of ``spec`` on ``config``: its defaults, then ``overrides`` (TileSchedule
    fields), checked against the target's resources.

    ``hints`` gives each symbolic dim of ``spec`` the value the schedule is chosen and checked for
    (a model exported with a dynamic batch). Raises :class:`MmaError` (an override's blocks do not
    fit the MMA shape), :class:`SpecError` or :class:`~tessera_tvm.errors.ResourceError`."""
    config = load_config(config)
    fitted = bind_dims(spec, dict(hints)) if hints else spec
    # A convolution's algorithm decides what its blocks mean: the defaults are fitted for the one chosen.
    tile = TileSchedule.from_config(config, fitted, conv_algorithm=(overrides or {}).get("conv_algorithm", ""))
    if overrides:
        tile = settle_overlap(fitted, tile.replace(**overrides), config, strict=True)
        if backend_for(config).thread_blocks:  # MMA instructions take whole warp tiles
            check_mma(fitted, tile, config)
    validate_schedule(fitted, tile, config)
    return tile


def held_spec(spec: KernelSpec, config: Any) -> KernelSpec:
    """``spec`` as the backend of ``config`` holds its parameters (the CPU: fp8 as float32); the
    spec itself where the backend holds every dtype as it is."""
    storage = backend_for(load_config(config)).hook("tile_spec")
    return storage(spec) if storage is not None else spec


def tile_program(spec: KernelSpec, schedule: TileSchedule, config: Any, name: str) -> tuple[Any, KernelSpec]:
    """The TileLang PrimFunc of ``spec`` under ``schedule`` on ``config``, with symbol ``name``, and
    the spec it was built from (:func:`held_spec`). Raises :class:`SpecError` where the tile library
    cannot build it, ``UnsupportedTTOperationError`` where Tenstorrent's cannot."""
    config = load_config(config)
    held = held_spec(spec, config)
    return build_tile_program(held, schedule, config.codegen_kind, name=name), held


def with_packed_b(spec: KernelSpec, schedule: TileSchedule, config: Any) -> GemmSpec | None:
    """``spec`` (a GEMM) taking its B packed ahead in the layout the backend of ``config`` reads under
    ``schedule`` (its ``packed_weights`` hook: the CPU micro-kernel's panels), for a B that is a
    constant: the caller passes ``spec.packed_b.pack(b, transposed=...)`` of the original spec's B.
    None where the backend reads every B as it is, or cannot take this one packed."""
    if not isinstance(spec, GemmSpec):
        return None
    layout_for = backend_for(load_config(config)).hook("packed_weights")
    layout = layout_for(spec, schedule) if layout_for is not None else None
    if layout is None:
        return None
    return dataclasses.replace(spec, packed_b=layout, dtype_b="float32", transpose_b=False)
