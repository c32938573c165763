"""Resource estimates: the memory a generated tile kernel allocates, known before lowering.

``smem_bytes`` counts the shared memory of a GPU block (the tiles placed in shared memory times the
pipeline stages, plus TileLang's cross-thread reduction workspace) and ``local_bytes`` the local
(stack) arrays of a CPU block. The schedule heuristics use them to fit a schedule to the target, and
``validate_schedule`` to reject one that cannot fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import dtype_bytes
from .specs import AttentionSpec, Conv2dSpec, GemmSpec, KernelSpec, NormSpec, Pool2dSpec, ReduceSpec, SoftmaxSpec

if TYPE_CHECKING:
    from .schedule import TileSchedule


def smem_bytes(spec: KernelSpec, schedule: TileSchedule, codegen_kind: str = "cuda") -> int:
    """Shared memory (bytes per block) the generated kernel allocates, estimated before lowering.

    Counts the tiles the generator places in shared memory times the pipeline stages, plus the
    reduction workspace TileLang adds for cross-thread reductions. A target without thread blocks
    (the CPU, ``c``) has no shared memory and returns 0 (see :func:`local_bytes`).
    """
    from ..target.backend import backend_for

    if not backend_for(codegen_kind).thread_blocks:
        return 0
    if isinstance(spec, Conv2dSpec):
        spec = spec.as_gemm()
    s = schedule
    if isinstance(spec, GemmSpec):
        return s.stages * (
            s.block_m * s.block_k * dtype_bytes(spec.dtype_a) + s.block_k * s.block_n * dtype_bytes(spec.dtype_b)
        )
    if isinstance(spec, AttentionSpec):
        size = dtype_bytes(spec.dtype_in)
        probs = s.block_m * s.block_n * 4 if spec.dtype_in == "float32" else 0  # fp32 P is staged in smem
        return s.block_m * spec.D * size + s.stages * 2 * s.block_n * spec.D * size + probs  # Q + stages x (K + V)
    if isinstance(spec, SoftmaxSpec | NormSpec | ReduceSpec):
        # Cross-thread all-reduce workspace: one fp32 per thread for each reduction in flight.
        return 2 * 4 * s.threads
    return 0


def local_bytes(spec: KernelSpec, schedule: TileSchedule, codegen_kind: str = "c") -> int:
    """Bytes of local (stack) arrays one CPU block allocates; compare with ``local_memory_per_kernel``."""
    if isinstance(spec, Pool2dSpec):  # the padded input plane and the plane of accumulators (tile/pool.py)
        from .pool import padded_plane

        rows, cols = padded_plane(spec)
        return 4 * (rows * cols + spec.OH * spec.OW)
    if isinstance(spec, Conv2dSpec):
        if spec.depthwise:  # the padded input plane and the plane of accumulators (tile/conv.py)
            from .conv import depthwise_planes

            return 4 * sum(depthwise_planes(spec))
        if schedule.conv_algorithm == "direct":  # the accumulator and packed weights (the input: workspace)
            from .conv import direct_local_floats

            return 4 * direct_local_floats(spec, schedule)
        if schedule.conv_algorithm == "winograd":  # a chunk's accumulator (the transforms: workspace)
            from .conv import winograd_local_floats

            return 4 * winograd_local_floats(spec, schedule)
        spec = spec.as_gemm()  # the implicit GEMM's accumulator and packed panels
    s = schedule
    if isinstance(spec, GemmSpec):
        from .gemm import (
            cpu_a_shared_by_column_blocks,
            cpu_b_shared_by_row_blocks,
            cpu_gemm_packs,
            cpu_k_per_word,
            cpu_pack_elements,
            cpu_reads_a_in_place,
        )

        # The packed A/B panels of the micro-kernel: bf16 k-pairs take half; a row-major bf16 A is read
        # in place, and an A or B packed once for all blocks of a row or column lives in the thread's
        # (heap) workspace.
        packed = 0
        if cpu_gemm_packs(spec):
            a_elems, b_elems = cpu_pack_elements(s.block_m, s.block_n, s.block_k, per_word=cpu_k_per_word(spec))
            a_elems = 1 if cpu_reads_a_in_place(spec) else 0 if cpu_a_shared_by_column_blocks(spec, s) else a_elems
            packed = 4 * (a_elems + (0 if cpu_b_shared_by_row_blocks(spec, s) else b_elems))
        return s.block_m * s.block_n * dtype_bytes(spec.dtype_acc) + packed
    if isinstance(spec, AttentionSpec):
        from .gemm import cpu_pack_elements, cpu_pack_suffix  # packed K, Q^T, P and V panels

        packed = 0
        if cpu_pack_suffix(spec.dtype_in) is not None:
            k_elems, q_elems = cpu_pack_elements(s.block_n, s.block_m, spec.D)
            p_elems, v_elems = cpu_pack_elements(s.block_m, spec.D, s.block_n)
            # K and V panels on the stack, unless packed once per block into the thread's (heap) workspace
            packed = q_elems + p_elems + (0 if s.kv_packs_per_head else k_elems + v_elems)
        from .attention import _bias_varies_in_both  # the block's bias, transposed

        bias = s.block_m * s.block_n if packed and _bias_varies_in_both(spec) else 0
        return 4 * (s.block_m * spec.D + s.block_m * s.block_n + 4 * s.block_m + packed + bias)
    if isinstance(spec, SoftmaxSpec | NormSpec | ReduceSpec):
        from .common import CPU_LANES

        return 4 * (CPU_LANES + 2)
    return 0
