"""Tile schedules: how a kernel spec is tiled, and the heuristics that choose the tiling.

``TileSchedule`` holds the tiling knobs (block sizes, pipeline stages, threads, rasterisation);
``TileSchedule.from_config`` derives a spec family's defaults from a target config's ``schedule:``
section and, given a spec, fits them to the problem: ``fit_schedule`` shrinks blocks larger than the
problem (keeping what the GPU's MMA needs) and spreads CPU blocks over the cores, causal attention
drops to one stage where TileLang cannot pipeline it, and stages / K steps are cut until the
schedule's shared memory (``resources.smem_bytes``) fits the target.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

from ..config import SCHEDULE_CHOICES
from .base import _check_positive, _fail, _fingerprint, _set
from .resources import smem_bytes
from .specs import (
    SPEC_FAMILIES,
    AttentionSpec,
    Conv2dSpec,
    ElementwiseSpec,
    GemmSpec,
    KernelSpec,
    NormSpec,
    ReduceSpec,
    SoftmaxSpec,
)

#: How a convolution is computed (TileSchedule.conv_algorithm): as its implicit GEMM, or directly;
#: "" where nothing chose (the planner chooses for a convolution; a program given "" runs the GEMM).
CONV_ALGORITHMS = ("", *SCHEDULE_CHOICES["conv_algorithm"])


@dataclass(frozen=True)
class TileSchedule:
    """How a spec is tiled. What each field means per kernel kind:

    - gemm: an output tile of ``block_m x block_n``, a K step of ``block_k``, ``stages`` buffers in the
      pipelined K loop, ``threads`` per block, ``rasterize`` (L2 swizzle panel width, 0 = off).
    - attention: ``block_m`` query rows per block, ``block_n`` keys per step; ``stages`` K/V buffers;
      ``overlap`` (Hopper): one key block's softmax runs while the tensor cores compute the previous
      block's P V (FlashAttention-3's intra-warpgroup overlap on asynchronous wgmma; ``stages`` >= 2).
      ``kv_packs_per_head`` (CPU): 0, a block owns ``block_m`` queries of one head and packs each key
      block's K and V as it reaches it (every query block packs them again); n >= 1, each (batch, kv
      head) is split into n blocks, each owning every n-th query block of all the query heads that
      read the kv head, and packing the K and V they read once, into a per-thread workspace.
    - softmax / norm / reduce: ``block_m`` rows per block, ``block_n`` columns per step along the
      reduced axis.
    - elementwise: a ``block_m x block_n`` tile of the output viewed as [rows, last dim].
    - conv2d: ``conv_algorithm`` "implicit_gemm" tiles it as the gemm above (output pixels x output
      channels); "direct" (CPU) gives a block ``block_m`` output channels of ``block_n``
      output rows, and ``block_k`` is the K step; "winograd" (CPU, 3x3 stride 1) gives a block
      ``block_m`` output channels of ``block_n`` output rows, computed in chunks of ``block_k`` rows
      (tile/conv.py). The planner chooses ("" until then).

    On the CPU target (``c``) the blocks run in parallel over the cores (one OpenMP region), a block's
    body is serial code; ``threads`` and ``stages`` are ignored.
    """

    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    stages: int = 2
    threads: int = 128
    rasterize: int = 0
    mma: tuple[int, int, int] | None = None  # the target's MMA instruction shape (informational)
    overlap: bool = False
    kv_packs_per_head: int = 0
    conv_algorithm: str = ""

    def __post_init__(self) -> None:
        for f in ("block_m", "block_n", "block_k", "stages", "threads"):
            _check_positive("TileSchedule", f, getattr(self, f))
        if isinstance(self.rasterize, bool) or not isinstance(self.rasterize, int) or self.rasterize < 0:
            raise _fail("TileSchedule", f"rasterize is {self.rasterize!r}; expected an int >= 0 (0 = off)")
        if (
            isinstance(self.kv_packs_per_head, bool)
            or not isinstance(self.kv_packs_per_head, int)
            or self.kv_packs_per_head < 0
        ):
            raise _fail(
                "TileSchedule",
                f"kv_packs_per_head is {self.kv_packs_per_head!r}; expected an int >= 0 (0 = per query block)",
            )
        if self.conv_algorithm not in CONV_ALGORITHMS:
            raise _fail(
                "TileSchedule",
                f"conv_algorithm is {self.conv_algorithm!r}; expected one of {', '.join(map(repr, CONV_ALGORITHMS))}",
            )
        if not isinstance(self.overlap, bool):
            raise _fail("TileSchedule", f"overlap is {self.overlap!r}; expected True or False")
        if self.mma is not None:
            _set(self, "mma", tuple(int(x) for x in self.mma))

    def replace(self, **changes: Any) -> TileSchedule:
        """A copy with ``changes`` (e.g. a user override)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            names = ", ".join(f.name for f in dataclasses.fields(self))
            raise _fail("TileSchedule", f"unknown field(s) {unknown}; fields are {names}")
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain values (JSON-serialisable); ``TileSchedule(**d)`` rebuilds it."""
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """A hash of the schedule that is stable across processes."""
        return _fingerprint(self)

    @classmethod
    def from_config(cls, config: Any, kind: str | KernelSpec = "gemm", *, conv_algorithm: str = "") -> TileSchedule:
        """Defaults for ``kind`` (a spec family name or a spec) on ``config`` (a TargetConfig or its name).

        GEMMs take the config's ``schedule:`` section as is; other kinds derive theirs from it (a
        config may also hold a per-kind mapping, e.g. ``schedule: {attention: {block_m: 64}}``).
        With a spec, blocks larger than the problem are shrunk (a 1 x 8 softmax gets no 64-row block).
        ``conv_algorithm``: a convolution's, where the caller chose it (raises where it cannot run).
        """
        from ..config import load_config

        config = load_config(config)
        spec = kind if isinstance(kind, KernelSpec) else None
        kind = spec.family if spec is not None else kind
        if kind not in SPEC_FAMILIES:
            raise _fail("TileSchedule.from_config", f"kind is {kind!r}; expected one of {', '.join(SPEC_FAMILIES)}")
        raw = dict(config.schedule)
        per_kind = {k: dict(v) for k, v in raw.items() if k in SPEC_FAMILIES}
        base = {k: v for k, v in raw.items() if k not in SPEC_FAMILIES and k in _FIELDS}
        codegen_kind = config.codegen_kind  # the backend's kind (Tenstorrent: tt, though its TVM kind is c)
        if _fixed_schedule(codegen_kind):  # Tenstorrent: one tile shape, the config's, for every family
            return cls(**base)
        values = {**_kind_defaults(kind, codegen_kind, base), **per_kind.get(kind, {})}
        if kind != "attention":  # a switch of attention's program only
            values.pop("overlap", None)
        if kind != "attention" or _thread_blocks(codegen_kind):  # the CPU attention program's only
            values.pop("kv_packs_per_head", None)
        configured = values.pop("conv_algorithm", "")
        if kind == "conv2d":  # the caller's, else the config's, else the planner's (fit_schedule)
            values["conv_algorithm"] = conv_algorithm or configured
        if isinstance(spec, GemmSpec) and not _thread_blocks(codegen_kind) and "block_k" not in per_kind.get(kind, {}):
            from .gemm import cpu_gemm_quads

            if cpu_gemm_quads(spec):
                # int8 k-quads: a K step of as many packed words as fp32's (128 int8 a step ran 0.90x
                # torch._int_mm at 1024^3, 512 0.94x: a call's fixed costs over 4x the work).
                values["block_k"] = 4 * values.get("block_k", TileSchedule.block_k)
        schedule = cls(**{k: v for k, v in values.items() if k in _FIELDS})
        if spec is None:
            return schedule
        schedule = fit_schedule(spec, schedule, codegen_kind, wgmma=bool(config.fact("wgmma")))
        if _dynamic_pipeline_unsupported(spec, config):
            schedule = schedule.replace(stages=1)
        schedule = settle_overlap(spec, schedule, config)  # (off where the loop above cannot be pipelined)
        return _fit_shared_memory(spec, schedule, config)


_FIELDS = {f.name for f in dataclasses.fields(TileSchedule)}


def _fixed_schedule(codegen_kind: str) -> bool:
    """Whether ``codegen_kind``'s programs are built with one fixed schedule (Tenstorrent's tile)."""
    from ..target.backend import backend_for

    return backend_for(codegen_kind).fixed_schedule is not None


def _thread_blocks(codegen_kind: str) -> bool:
    """Whether ``codegen_kind``'s kernels are thread blocks (GPU: threads, shared memory, MMA tiles)."""
    from ..target.backend import backend_for

    return backend_for(codegen_kind).thread_blocks


def _kind_defaults(kind: str, codegen_kind: str, base: dict[str, Any]) -> dict[str, Any]:
    """Per-kind defaults derived from the config's GEMM defaults."""
    gpu = _thread_blocks(codegen_kind)
    if kind in ("gemm", "conv2d"):  # a convolution runs as its implicit GEMM
        return base
    if kind == "attention":
        # 64 query rows x 64 keys per step keep S, P and O in registers for D <= 128 on every GPU.
        return (
            {**base, "block_m": 64, "block_n": 64, "stages": min(base.get("stages", 2), 2), "threads": 128}
            if gpu
            # CPU: 192 queries (6 x the micro-kernel's 32 columns in S^T = K Q^T; every query block
            # reads all of K and V, so fewer blocks read them less: +15% at S=2048 over 96), 112 keys
            # (8 x its 14 rows).
            else {**base, "block_m": 192, "block_n": 112}
        )
    if kind in ("softmax", "norm", "reduce"):
        # A few rows per block, a wide step along the reduced axis (coalesced loads on GPU).
        return {**base, "block_m": 4, "block_n": 256, "threads": 128} if gpu else {**base, "block_m": 8, "block_n": 256}
    return {**base, "block_m": 16, "block_n": 128, "threads": 128} if gpu else {**base, "block_m": 16, "block_n": 256}


#: Threads of a GPU block that fit_schedule or the shared-memory fit shrank below the config's: one
#: consumer warp group, as the GPU tests ran (Hopper's 256 threads are for its 128 x 256 tiles).
SMALL_BLOCK_THREADS = 128

#: A CPU GEMM smaller than this (multiply-adds) runs in fewer blocks than cores rather than pay for
#: waking threads (~10 us each) to share a few microseconds of work.
CPU_GEMM_SPREAD_MIN_WORK = 1 << 22


def _spread_cpu_gemm(spec: GemmSpec, block_m: int, block_n: int) -> tuple[int, int]:
    """CPU GEMM blocks that give every core work: at least as many blocks as cores (when the GEMM is
    large enough), a multiple of the cores while there are few blocks per core (3 blocks on 2 cores
    keep one core idle for a third of the time: GPT-2's 128 x 768 projection ran at 0.86x torch), and
    blocks of nearly equal size (1024 rows in 224-row blocks: 5 blocks of 210, not 4 of 224 and one of
    128), rounded to the micro-kernel's register tile. Where both could be split, the longer side of
    the blocks is: each block packs its own panels, so rows x cols blocks pack K x (cols x M + rows x N)
    elements (K x cols x M where B is a constant packed ahead, tile/panels.py), least for square blocks (a GPT-2 MLP's 128 x 1024 -> 256 linear in two 128 x 128 blocks,
    not two 64 x 256: 152 -> 164 GFLOP/s)."""
    from .gemm import cpu_k_per_word, cpu_micro_tile

    tile_m, tile_n = cpu_micro_tile(spec)
    batch = math.prod(spec.batch)
    rows, cols = math.ceil(spec.M / block_m), math.ceil(spec.N / block_n)
    if spec.M * spec.N * spec.K * batch >= CPU_GEMM_SPREAD_MIN_WORK:
        cores = os.cpu_count() or 1
        while not _cores_evenly_busy(rows * cols * batch, cores):
            can_rows, can_cols = spec.M >= (rows + 1) * tile_m, spec.N >= (cols + 1) * tile_n
            if can_rows and (not can_cols or spec.M / rows >= spec.N / cols):
                rows += 1
            elif can_cols:
                cols += 1
            else:
                break
        if cpu_k_per_word(spec) > 1 and spec.transpose_a and spec.packed_b is None:
            # A transposed A is copied once per row block where the row blocks alone keep the cores
            # equally busy (tile/gemm.py cpu_a_shared_by_column_blocks), else once per block.
            while not _cores_evenly_busy(rows * batch, cores) and spec.M >= (rows + 1) * tile_m:
                rows += 1
    even_m = _round_up(math.ceil(spec.M / rows), tile_m)
    even_n = _round_up(math.ceil(spec.N / cols), tile_n)
    return min(block_m, even_m) if rows > 1 else block_m, min(block_n, even_n) if cols > 1 else block_n


def _spread_cpu_attention(spec: AttentionSpec, block_m: int) -> int:
    """CPU attention query blocks that give every core a block where the queries allow (smaller
    blocks, in multiples of the micro-kernel's 32 columns, until the (query block, head, batch) grid
    has as many blocks as cores), then evened out (for 8 cores, 1000 queries: 8 blocks of 128 (the last
    104), where 192-query blocks would leave two cores idle)."""
    from .gemm import CPU_MICRO_TILE

    tile = CPU_MICRO_TILE[1]
    heads = spec.B * spec.H
    cores = os.cpu_count() or 1
    while math.ceil(spec.S_q / block_m) * heads < cores and block_m > tile:
        block_m = max(tile, (block_m - 1) // tile * tile)
    blocks = math.ceil(spec.S_q / block_m)
    return min(block_m, _round_up(math.ceil(spec.S_q / blocks), tile)) if blocks > 1 else block_m


def _cpu_kv_packs(spec: AttentionSpec, block_m: int) -> int:
    """How often CPU attention packs each (batch, kv head)'s K and V (``kv_packs_per_head``): once
    where the kv heads alone give every core blocks of equal work (as many as the cores, a multiple
    of them, or 4 per core or more), else a few times, each block owning every n-th query block
    (interleaved, so that causal blocks get equal work too) and at least two of them; 0 (packed by
    every query block as it goes) where no split gives every core a block or nothing would be packed
    twice anyway (one query block of one query head per kv head), and for dtypes the packing routines
    do not read (serial loops, tile/attention.py)."""
    from .gemm import cpu_pack_suffix

    if cpu_pack_suffix(spec.dtype_in) is None:
        return 0
    query_blocks = math.ceil(spec.S_q / block_m)
    cores = os.cpu_count() or 1
    heads = spec.B * spec.H_kv
    for packs in range(1, query_blocks + 1):
        if _cores_evenly_busy(heads * packs, cores):
            reused = math.ceil(query_blocks / packs) * spec.groups  # (query block, head)s per packing
            return packs if reused >= 2 else 0
    return 0


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _cores_evenly_busy(blocks: int, cores: int) -> bool:
    """Whether ``blocks`` blocks of equal work, run in parallel, keep ``cores`` cores equally busy: at
    least one each, and a multiple of the cores while there are fewer than 4 per core (the CPU
    programs' rule for splitting a grid)."""
    return blocks >= cores and (blocks % cores == 0 or blocks >= 4 * cores)


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, 1 << max(0, (n - 1).bit_length()))


def fit_schedule(spec: KernelSpec, schedule: TileSchedule, codegen_kind: str, wgmma: bool = False) -> TileSchedule:
    """Shrink blocks that are larger than the problem, keeping what the GPU's MMA needs.

    On GPUs a GEMM block keeps at least one 16 x 16 MMA tile per warp, and an attention block
    at least 16 query rows per warp (each warp owns whole rows of the scores); Hopper's wgmma
    keeps 64-row blocks.
    """
    gpu = _thread_blocks(codegen_kind)
    warps = max(1, schedule.threads // 32)
    wgmma = gpu and wgmma  # the config's hardware.wgmma
    changes: dict[str, int] = {}
    if isinstance(spec, Conv2dSpec):
        direct = _fit_conv_algorithm(spec, schedule, gpu)
        if direct is not None:
            return direct
        if not spec.depthwise:
            changes["conv_algorithm"] = "implicit_gemm"
        spec = spec.as_gemm()  # tiled as its implicit GEMM (output pixels x output channels)
    if isinstance(spec, GemmSpec):
        floor = 16 if gpu else 1
        block_m = min(schedule.block_m, _pow2_at_least(spec.M, floor))
        block_n = min(schedule.block_n, _pow2_at_least(spec.N, floor))
        if wgmma:
            block_m = max(block_m, 64)
        while gpu and block_m * block_n < warps * 16 * 16:
            if block_n <= block_m:
                block_n *= 2
            else:
                block_m *= 2
        if not gpu:
            block_m, block_n = _spread_cpu_gemm(spec, block_m, block_n)
        elif block_m * block_n < schedule.block_m * schedule.block_n:
            changes["threads"] = min(schedule.threads, SMALL_BLOCK_THREADS)
        changes.update(block_m=block_m, block_n=block_n, block_k=min(schedule.block_k, _pow2_at_least(spec.K, floor)))
    elif isinstance(spec, AttentionSpec):
        floor = 16 if gpu else 1
        block_m = min(schedule.block_m, _pow2_at_least(spec.S_q, floor))
        if gpu:
            block_m = max(block_m, 16 * warps, 64 if wgmma else 16)
        else:
            block_m = _spread_cpu_attention(spec, block_m)
            changes["kv_packs_per_head"] = _cpu_kv_packs(spec, block_m)
        changes.update(block_m=block_m, block_n=min(schedule.block_n, _pow2_at_least(spec.S_kv, floor)))
    elif isinstance(spec, SoftmaxSpec | NormSpec | ReduceSpec):
        rows, cols = _rows_cols(spec)
        changes["block_m"] = min(schedule.block_m, _pow2_at_least(rows, 1))
        changes["block_n"] = min(schedule.block_n, _pow2_at_least(cols, 32 if gpu else 1))
    elif isinstance(spec, ElementwiseSpec):
        changes["block_n"] = min(schedule.block_n, _pow2_at_least(spec.shape[-1], 32 if gpu else 1))
        rows = math.prod(spec.shape[:-1])
        changes["block_m"] = min(schedule.block_m, _pow2_at_least(rows, 1))
    return schedule.replace(**changes) if changes else schedule


def _fit_conv_algorithm(spec: Conv2dSpec, schedule: TileSchedule, gpu: bool) -> TileSchedule | None:
    """The schedule of the direct or the Winograd program where one runs ``spec`` (tile/conv.py):
    the one the caller chose (``schedule.conv_algorithm``), else the one estimated fastest of the
    three (CPU only); None for the implicit GEMM. Raises where the caller chose an algorithm that
    cannot run ``spec``."""
    from .conv import direct_applies, direct_schedule, direct_wins, winograd_applies, winograd_schedule, winograd_wins

    chosen, cores = schedule.conv_algorithm, os.cpu_count() or 1
    if chosen == "winograd":
        why = "the GPU has no Winograd convolution" if gpu else winograd_applies(spec)
        if why is not None:
            raise _fail("TileSchedule", f"conv_algorithm='winograd' cannot run this convolution: {why}")
        return winograd_schedule(spec, schedule, cores)
    why = "the GPU has no direct convolution" if gpu else direct_applies(spec)
    if chosen == "direct" and why is not None:
        raise _fail("TileSchedule", f"conv_algorithm='direct' cannot run this convolution: {why}")
    if chosen == "implicit_gemm" and spec.depthwise:
        raise _fail("TileSchedule", "conv_algorithm='implicit_gemm': a depthwise convolution runs its own program")
    if why is not None or chosen == "implicit_gemm":
        return None
    direct = direct_schedule(spec, schedule, cores)
    if chosen == "direct":
        return direct
    best = direct if direct_wins(spec, direct) else None  # None: the implicit GEMM
    if winograd_applies(spec) is None:
        winograd = winograd_schedule(spec, schedule, cores)
        if winograd_wins(spec, winograd, best):
            return winograd
    return best


def _dynamic_pipeline_unsupported(spec: KernelSpec, config: Any) -> bool:
    """Causal attention's key loop has a per-block trip count; TileLang 0.1.15's cp.async pipeline
    then emits a non-constant ``cp.async.wait_group`` that the CUDA codegen rejects (the config's
    ``hardware.pipelined_dynamic_loops: false``). Hopper's warp-specialised TMA pipeline and ROCm
    handle it."""
    return (
        isinstance(spec, AttentionSpec)
        and spec.causal
        and not config.fact("pipelined_dynamic_loops")
        and not config.feature("warp_specialization")
    )


def settle_overlap(spec: KernelSpec, schedule: TileSchedule, config: Any, *, strict: bool = False) -> TileSchedule:
    """``schedule`` with ``overlap`` where it means something: attention on a thread-block target
    whose software pipeline takes the key loop, with the two K/V stages the overlapped loop uses.
    Elsewhere ``overlap`` is switched off for other kernel families (as ``rasterize`` is ignored by
    attention), and for attention raises with ``strict`` (a user's override), else is switched off."""
    if not schedule.overlap:
        return schedule
    if not isinstance(spec, AttentionSpec):
        return schedule.replace(overlap=False)
    why = None
    if not _thread_blocks(config.codegen_kind):
        why = f"overlap is a GPU attention schedule; {config.name} runs attention without tensor cores to overlap"
    elif not config.fact("wgmma"):
        why = (
            f"overlap issues Hopper's asynchronous warpgroup MMA (hardware.wgmma), which {config.name} does not "
            "have; its attention runs without it"
        )
    elif spec.dtype_in not in ("float16", "bfloat16"):
        why = (
            f"overlap takes float16 or bfloat16 attention, not {spec.dtype_in} (the tf32 path multiplies "
            "P V with synchronous MMA instructions)"
        )
    elif _dynamic_pipeline_unsupported(spec, config):
        why = (
            f"overlap needs a software-pipelined key loop, and {config.name}'s pipeline cannot pipeline causal "
            "attention's key loop (hardware.pipelined_dynamic_loops: false, no warp specialisation)"
        )
    if why is None:  # the loop double-buffers K and V at least
        return schedule.replace(stages=max(2, schedule.stages))
    if strict:
        raise _fail("TileSchedule", why)
    return schedule.replace(overlap=False)


def _fit_shared_memory(spec: KernelSpec, schedule: TileSchedule, config: Any) -> TileSchedule:
    """Fewer stages, then smaller K/key steps, until the schedule fits the config's shared memory."""
    limit = config.resource_limits.get("shared_memory_per_block")
    codegen_kind = config.codegen_kind
    if limit is None or not _thread_blocks(codegen_kind):  # no shared memory to fit
        return schedule
    if isinstance(spec, Conv2dSpec):
        spec = spec.as_gemm()
    gemm = isinstance(spec, GemmSpec)
    min_rows = 64 if gemm and config.fact("wgmma") else 16  # wgmma takes 64-row tiles
    while smem_bytes(spec, schedule, codegen_kind) > limit:
        threads = min(schedule.threads, SMALL_BLOCK_THREADS)  # for a block shrunk below this one
        # a GEMM halves its wider side first (block_m only down to min_rows); attention its key step
        n_first = schedule.block_n >= schedule.block_m or schedule.block_m <= min_rows
        if schedule.stages > 1:  # the overlapped attention loop needs its two stages
            schedule = schedule.replace(stages=schedule.stages - 1, overlap=False)
        elif gemm and schedule.block_k > 16:
            schedule = schedule.replace(block_k=schedule.block_k // 2)
        elif schedule.block_n > 16 and (isinstance(spec, AttentionSpec) or (gemm and n_first)):
            schedule = schedule.replace(block_n=schedule.block_n // 2, threads=threads)
        elif schedule.block_m > min_rows:
            schedule = schedule.replace(block_m=schedule.block_m // 2, threads=threads)
        else:
            break  # nothing left to shrink: VerifyResources reports what does not fit
    return schedule


def _rows_cols(spec: KernelSpec) -> tuple[int, int]:
    """(independent rows, reduced length) of a reduction-like spec."""
    if isinstance(spec, NormSpec):
        return math.prod(spec.shape[:-1]), spec.shape[-1]
    if isinstance(spec, SoftmaxSpec):
        return math.prod(spec.shape) // spec.shape[spec.axis], spec.shape[spec.axis]
    if isinstance(spec, ReduceSpec):
        reduced = math.prod(spec.shape[a] for a in spec.axis)
        return math.prod(spec.shape) // reduced, reduced
    raise TypeError(spec)
