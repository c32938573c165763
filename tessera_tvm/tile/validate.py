"""Schedule validation: whether a tile schedule can be built for a spec on a target config.

``validate_schedule`` runs before any lowering and raises a ``SpecError`` or ``ResourceError`` that
says what to change: the thread count against ``resources.threads_per_block`` and whole warps, MMA
block sizes and input dtypes on GPUs, stages that TileLang cannot pipeline, shared memory against
``shared_memory_per_block`` and CPU local arrays against ``local_memory_per_kernel``.
"""

from __future__ import annotations

from typing import Any

from ..errors import ResourceError
from .base import _fail, dtype_bytes
from .resources import local_bytes, smem_bytes
from .schedule import TileSchedule, _dynamic_pipeline_unsupported
from .specs import AttentionSpec, GemmSpec, KernelSpec


def validate_schedule(spec: KernelSpec, schedule: TileSchedule, config: Any) -> None:
    """Raise if ``schedule`` cannot be built for ``spec`` on ``config`` (before any lowering).

    Checks the thread count, MMA-compatible block sizes on GPUs, shared memory against
    ``resources.shared_memory_per_block`` and CPU local arrays against ``local_memory_per_kernel``.
    """
    from ..config import load_config

    config = load_config(config)
    from ..target.backend import backend_for

    limits = config.resource_limits
    codegen_kind = config.codegen_kind  # the backend's kind: Tenstorrent is tt, not its TVM kind c
    name = f"{spec.family} kernel"
    s = schedule
    if backend_for(config).thread_blocks:  # threads, warps, MMA tiles and shared memory
        max_threads = limits.get("threads_per_block")
        if max_threads and s.threads > max_threads:
            raise ResourceError(
                name, "threads per block", s.threads, max_threads, config.name, "lower schedule.threads"
            )
        if s.threads % 32:
            raise _fail(name, f"threads is {s.threads}; expected a multiple of 32 (whole warps)")
        if isinstance(spec, GemmSpec | AttentionSpec):
            warps = s.threads // 32
            if isinstance(spec, GemmSpec):
                fp8 = {"float8_e4m3fn", "float8_e5m2"}
                if spec.dtype_a != spec.dtype_b and not {spec.dtype_a, spec.dtype_b} <= fp8:
                    raise _fail(
                        name,
                        f"dtype_a is {spec.dtype_a} but dtype_b is {spec.dtype_b}; GPU MMA instructions "
                        "take one input dtype (fp8 e4m3 x e5m2 excepted): cast one operand first",
                    )
                k_step = 32 if dtype_bytes(spec.dtype_a) == 1 else 16
                if s.block_k % k_step:
                    raise _fail(
                        name,
                        f"block_k is {s.block_k}; the MMA instructions for {spec.dtype_a} need a multiple of {k_step}",
                    )
            if s.block_m % 16 or s.block_n % 16:
                raise _fail(
                    name,
                    f"block_m x block_n is {s.block_m} x {s.block_n}; the MMA tile needs multiples "
                    "of 16 (try 64 x 64 or 128 x 128)",
                )
            if isinstance(spec, AttentionSpec) and s.block_m % (16 * warps):
                raise _fail(
                    name,
                    f"block_m is {s.block_m}; attention gives each of the {warps} warps whole rows of 16, so "
                    f"block_m must be a multiple of {16 * warps} (or use fewer threads)",
                )
            if s.block_m * s.block_n < warps * 16 * 16:
                raise _fail(
                    name,
                    f"block_m x block_n = {s.block_m} x {s.block_n} is too small for {warps} warps "
                    f"(each warp needs a 16 x 16 MMA tile); lower threads or raise the block",
                )
            if config.fact("wgmma") and s.block_m % 64:
                raise _fail(name, f"block_m is {s.block_m}; {config.name!r} has wgmma, which needs a multiple of 64")
        if _dynamic_pipeline_unsupported(spec, config) and s.stages > 1:
            raise _fail(
                name,
                f"stages is {s.stages}; causal attention on {config.name!r} (cp.async pipeline, no warp "
                "specialisation) needs stages=1: TileLang 0.1.15 cannot pipeline its per-block key loop",
            )
        smem = smem_bytes(spec, s, codegen_kind)
        limit = limits.get("shared_memory_per_block")
        if limit is not None and smem > limit:
            raise ResourceError(
                name, "bytes of shared memory", smem, limit, config.name, "lower stages or block_m/block_n/block_k"
            )
    else:
        local = local_bytes(spec, s, codegen_kind)
        limit = limits.get("local_memory_per_kernel")
        if limit is not None and local > limit:
            raise ResourceError(name, "bytes of local arrays", local, limit, config.name, "lower block_m/block_n")
