"""Schedule IR: one typed, frozen :class:`Schedule` per fused kernel.

A schedule says how a fused kernel is tiled and launched on a target: block sizes, pipeline stages,
threads, warp specialisation, where each operand lives (global / shared / registers / local), the
block swizzle, the epilogue and the grid. Defaults come from the target config's ``schedule:``
section (fitted to the problem by the tile library); users override them with
``ts.compile(..., schedule={...})`` or ``@ts.schedule(...)``:

    schedule={"block_m": 64, "stages": 2}                       # every fused kernel
    schedule={"fused_matmul_cast_add_gelu": {"block_n": 64}}    # one fused kernel, by name

An override the target cannot hold (shared memory over ``resources.shared_memory_per_block``,
threads over ``threads_per_block``, blocks that do not fit the config's ``schedule.mma``
instruction shape) raises :class:`ScheduleError` here, before anything is lowered.

Printed form (``inspect_ir("sched")``, examples/linear.py on Hopper)::

    sched.kernel    fused_matmul_cast_add_gelu  gemm: matmul + cast + add + gelu  [hopper]
    sched.tile      block_m=128 block_n=128 block_k=64  mma=64x256x16
    sched.pipeline  stages=3 threads=128 warp_specialized=true
    sched.memory    A: global -> shared (128x64 f16 x3, TMA)  W: global -> shared (64x128 f16 x3, TMA) ...
    sched.swizzle   rasterize=0 (off)
    sched.epilogue  acc f32 -> cast f16 -> bias b -> gelu_erf -> store f16
    sched.launch    grid=[32, 32, 1] threads=256 (128 compute + 128 TMA producer) smem=98304 B (estimated)

A kernel whose schedule was chosen by ``ts.autotune`` (or ``ts.compile(..., autotune=True)``) has one
more line, :class:`TuningSummary`::

    sched.autotune  best of 9 measured (18 pruned): 1.23 ms; median 2.10 ms, worst 5.00 ms; default 3.20 ms (2.60x); cached
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera_tvm import load_config, planner
from tessera_tvm.config import SCHEDULE_SWITCHES, schedule_value_expected
from tessera_tvm.errors import ResourceError
from tessera_tvm.target.backend import backend_for, backend_of_device
from tessera_tvm.tile import (
    AttentionSpec,
    Conv2dSpec,
    ElementwiseSpec,
    GemmSpec,
    KernelSpec,
    NormSpec,
    ReduceSpec,
    SoftmaxSpec,
    SpecError,
    TileSchedule,
    local_bytes,
    smem_bytes,
)
from tessera_tvm.tile.expr import expr_text

from .errors import ScheduleError
from .types import dtype as as_dtype

__all__ = ["OVERRIDABLE", "Schedule", "TuningSummary", "choose_schedule", "split_overrides"]

#: Schedule fields a user may override, with what they mean.
OVERRIDABLE = {
    "block_m": "rows of the output tile (query rows for attention, rows per block for reductions)",
    "block_n": "columns of the output tile (keys per step for attention, columns per step for reductions)",
    "block_k": "the K step of a GEMM's main loop",
    "stages": "buffers in the software-pipelined main loop",
    "threads": "threads per block",
    "swizzle": "L2 rasterization panel width for GEMM blocks (0 = off)",
    "overlap": "GPU attention: compute one key block's softmax while the tensor cores run the previous block's P V",
    "kv_packs_per_head": (
        "CPU attention: how often each (batch, kv head)'s K and V are packed (n >= 1: once per block of every "
        "n-th query block of its query heads; 0: per query block, as each reaches a key block)"
    ),
    "conv_algorithm": (
        "a convolution's program: 'implicit_gemm' (output pixels x output channels), 'direct' (CPU: "
        "block_m output channels x block_n output rows) or 'winograd' (CPU, 3x3 stride 1: block_m output "
        "channels x block_n output rows, in chunks of block_k rows); the planner chooses where not given"
    ),
}

#: Override fields that take True or False (the others take ints).
BOOL_FIELDS = SCHEDULE_SWITCHES


def _short(dtype: str) -> str:
    try:
        return as_dtype(dtype).name
    except TypeError:
        return dtype


def _ms(seconds: float) -> str:
    """A kernel time for people: 1.23 ms, 45.6 us, 2.50 s."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


@dataclass(frozen=True)
class TuningSummary:
    """How a schedule was chosen by the autotuner: the ``sched.autotune`` line of the Schedule IR."""

    measured: int  # candidates compiled and timed
    pruned: int  # rejected by the resource model before compiling
    failed: int  # failed to compile or run, or disagreed with the default schedule's result
    best_s: float  # seconds per call of the chosen schedule (its fastest timed sample)
    median_s: float  # median over the measured candidates
    worst_s: float
    default_s: float | None  # the config's default schedule, when it was among the candidates
    cached: bool = False  # served by the tuning cache (nothing compiled or measured this time)

    def text(self) -> str:
        counts = [f"{self.pruned} pruned"] + ([f"{self.failed} failed"] if self.failed else [])
        out = (
            f"best of {self.measured} measured ({', '.join(counts)}): {_ms(self.best_s)}; "
            f"median {_ms(self.median_s)}, worst {_ms(self.worst_s)}"
        )
        if self.default_s is not None:
            out += f"; default {_ms(self.default_s)} ({self.default_s / self.best_s:.2f}x)"
        return out + ("; cached" if self.cached else "")

    __str__ = text

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Schedule:
    """How one fused kernel runs on one target. Frozen; ``replace`` gives a modified copy."""

    kernel: str
    family: str
    target: str
    summary: str
    block_m: int
    block_n: int
    block_k: int
    stages: int
    threads: int
    swizzle: int
    warp_specialized: bool
    mma: tuple[int, int, int] | None
    memory: tuple[tuple[str, str], ...]
    epilogue: tuple[str, ...]
    grid: tuple[int, int, int]
    smem_bytes: int
    local_bytes: int
    device: str = "gpu"  # "gpu", "cpu" or "tenstorrent": how blocks execute (from the config's codegen)
    parallel_grid: bool = False  # CPU: the config's parallel_grid feature (blocks shared among threads)
    autotune: TuningSummary | None = None  # set when the autotuner chose this schedule
    producer_threads: int = 0  # the config's hardware.producer_threads: what warp specialisation adds
    overlap: bool = False  # attention on a GPU: softmax of block kb beside the P V GEMM of block kb - 1
    kv_packs_per_head: int = 0  # attention on the CPU: K and V packed once per block of a kv head's queries
    conv_algorithm: str = ""  # a convolution's program: "implicit_gemm" or "direct" ("" for other kernels)

    # Views ------------------------------------------------------------------------------------
    @property
    def launch_threads(self) -> int:
        """Threads per block at launch: warp specialisation adds one producer warp group."""
        return self.threads + self.producer_threads if self.warp_specialized else self.threads

    def tile_schedule(self) -> TileSchedule:
        """The tile library's schedule for this kernel."""
        return TileSchedule(
            block_m=self.block_m,
            block_n=self.block_n,
            block_k=self.block_k,
            stages=self.stages,
            threads=self.threads,
            rasterize=self.swizzle,
            mma=self.mma,
            overlap=self.overlap,
            kv_packs_per_head=self.kv_packs_per_head,
            conv_algorithm=self.conv_algorithm,
        )

    def text(self) -> str:
        """The readable form: one ``sched.*`` line per aspect."""
        backend = backend_of_device(self.device)
        gpu = backend.thread_blocks
        tile = f"block_m={self.block_m} block_n={self.block_n}"
        if self.family == "gemm" or self.conv_algorithm:
            tile += f" block_k={self.block_k}"
        if self.conv_algorithm:
            tile += f"  conv_algorithm={self.conv_algorithm}"
        if self.mma is not None and self.family in ("gemm", "attention"):
            tile += "  mma=" + "x".join(map(str, self.mma))
        # stages only matter for the pipelined main loops of GEMM and attention.
        staged = self.family in ("gemm", "attention")
        pipeline = f"stages={self.stages} threads={self.threads}" if staged else f"threads={self.threads}"
        if gpu:
            pipeline += f" warp_specialized={str(self.warp_specialized).lower()}"
            if self.overlap:
                pipeline += " overlap=softmax(kb)|PV(kb-1)"
        elif self.parallel_grid:
            pipeline += " (CPU: the grid's blocks are shared among the cores' threads)"
        elif backend.block_note is not None:  # how the backend's serial blocks run
            pipeline += backend.hook("block_note")(self)
        if self.kv_packs_per_head:
            pipeline += f" kv_packs_per_head={self.kv_packs_per_head} (K, V packed once per block, into a workspace)"
        memory = "  ".join(f"{name}: {place}" for name, place in self.memory)
        launch = f"grid=[{', '.join(map(str, self.grid))}] threads={self.launch_threads}"
        if self.launch_threads != self.threads:
            launch += f" ({self.threads} compute + {self.launch_threads - self.threads} TMA producer)"
        launch += f" smem={self.smem_bytes} B (estimated)" if gpu else f" local={self.local_bytes} B (estimated)"
        lines = [
            f"sched.kernel    {self.kernel}  {self.family}: {self.summary}  [{self.target}]",
            f"sched.tile      {tile}",
            f"sched.pipeline  {pipeline}",
            f"sched.memory    {memory}",
            f"sched.swizzle   rasterize={self.swizzle}{' (off)' if self.swizzle == 0 else ''}",
            f"sched.epilogue  {' -> '.join(self.epilogue) if self.epilogue else '(none)'}",
            f"sched.launch    {launch}",
        ]
        if self.autotune is not None:
            lines.append(f"sched.autotune  {self.autotune.text()}")
        return "\n".join(lines) + "\n"

    __str__ = text

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["memory"] = [list(m) for m in self.memory]
        data["epilogue"] = list(self.epilogue)
        data["grid"] = list(self.grid)
        data["mma"] = list(self.mma) if self.mma is not None else None
        if self.autotune is None:  # untuned schedules keep the JSON they always had
            del data["autotune"]
        if not self.producer_threads:
            del data["producer_threads"]
        if not self.overlap:
            del data["overlap"]
        if not self.kv_packs_per_head:
            del data["kv_packs_per_head"]
        if not self.conv_algorithm:
            del data["conv_algorithm"]
        return data

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> Schedule:
        data = dict(json.loads(text) if isinstance(text, str) else text)
        fields = {f.name for f in dataclasses.fields(cls)}
        optional = {f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        unknown = sorted(set(data) - fields)
        missing = sorted(fields - set(data) - optional)
        if unknown or missing:
            raise ScheduleError(f"Schedule JSON: unknown keys {unknown}, missing keys {missing}")
        data["memory"] = tuple(tuple(m) for m in data["memory"])
        data["epilogue"] = tuple(data["epilogue"])
        data["grid"] = tuple(data["grid"])
        data["mma"] = tuple(data["mma"]) if data["mma"] is not None else None
        if data.get("autotune") is not None:
            data["autotune"] = TuningSummary(**data["autotune"])
        return cls(**data)


# ---------------------------------------------------------------------------------------------
# Choosing a schedule
# ---------------------------------------------------------------------------------------------


def split_overrides(overrides: Mapping[str, Any] | None, kernel_names: list[str], where: str) -> dict[str, dict]:
    """``{field: v}`` (all kernels) and ``{kernel: {field: v}}`` -> per-kernel override dicts."""
    overrides = dict(overrides or {})
    common = {k: v for k, v in overrides.items() if k in OVERRIDABLE}
    per_kernel: dict[str, dict] = {name: dict(common) for name in kernel_names}
    for key, value in overrides.items():
        if key in OVERRIDABLE:
            continue
        if key in kernel_names:
            if not isinstance(value, Mapping):
                raise ScheduleError(
                    f"{where}: schedule[{key!r}] is {value!r}; expected a mapping of fields, e.g. {{'block_m': 64}}"
                )
            per_kernel[key].update(value)
            continue
        import difflib

        close = difflib.get_close_matches(key, [*OVERRIDABLE, *kernel_names], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ScheduleError(
            f"{where}: schedule key {key!r} is neither a schedule field nor a fused kernel{hint}; "
            f"fields: {', '.join(OVERRIDABLE)}; kernels: {', '.join(kernel_names)}"
        )
    for name, fields in per_kernel.items():
        for key, value in fields.items():
            if key not in OVERRIDABLE:
                raise ScheduleError(
                    f"{where}: schedule[{name!r}] has unknown field {key!r}; fields: {', '.join(OVERRIDABLE)}"
                )
            expected = schedule_value_expected(key, value)
            if expected is not None:
                raise ScheduleError(f"{where}: schedule field {key} of kernel {name} is {value!r}; expected {expected}")
    return per_kernel


def _bytes(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.4g} KiB"


def _short_reason(exc: Exception) -> str:
    """``exc`` in a few words for a table: ``shared memory 264 KiB > 227 KiB``."""
    if isinstance(exc, ResourceError):
        if exc.resource.startswith("bytes of "):
            return f"{exc.resource.removeprefix('bytes of ')} {_bytes(exc.amount)} > {_bytes(exc.limit)}"
        return f"{exc.resource} {exc.amount} > {exc.limit}"
    return str(exc).split(": ", 1)[-1]  # SpecError: "<spec>: <what is wrong>"


def _grid(spec: KernelSpec, t: TileSchedule, gpu: bool) -> tuple[int, int, int]:
    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    if isinstance(spec, GemmSpec):
        from tessera_tvm.tile.gemm import cpu_a_shared_by_column_blocks, cpu_b_shared_by_row_blocks

        if not gpu and cpu_b_shared_by_row_blocks(spec, t):  # a block per column (tessera_tvm/tile/gemm.py)
            return cdiv(spec.N, t.block_n), 1, math.prod(spec.batch)
        if not gpu and cpu_a_shared_by_column_blocks(spec, t):  # a block per row
            return 1, cdiv(spec.M, t.block_m), math.prod(spec.batch)
        return cdiv(spec.N, t.block_n), cdiv(spec.M, t.block_m), math.prod(spec.batch)
    if isinstance(spec, Conv2dSpec) and t.conv_algorithm in ("direct", "winograd"):  # (channels, rows, image x group)
        return cdiv(spec.O // spec.groups, t.block_m), cdiv(spec.OH, t.block_n), spec.N * spec.groups
    if isinstance(spec, Conv2dSpec) and not spec.depthwise:  # (channels, pixels, group): its implicit GEMM
        return cdiv(spec.O // spec.groups, t.block_n), cdiv(spec.N * spec.OH * spec.OW, t.block_m), spec.groups
    if isinstance(spec, AttentionSpec):
        if t.kv_packs_per_head:  # a block per piece of a kv head's queries (tessera_tvm/tile/attention.py)
            return t.kv_packs_per_head, spec.H_kv, spec.B
        return cdiv(spec.S_q, t.block_m), spec.H, spec.B
    if isinstance(spec, ElementwiseSpec):
        return cdiv(spec.shape[-1], t.block_n), cdiv(math.prod(spec.shape[:-1]), t.block_m), 1
    if isinstance(spec, NormSpec):
        rows = math.prod(spec.shape[:-1])
    elif isinstance(spec, SoftmaxSpec):
        rows = math.prod(spec.shape) // spec.shape[spec.axis]
    elif isinstance(spec, ReduceSpec):
        rows = math.prod(spec.shape) // math.prod(spec.shape[a] for a in spec.axis)
    else:
        rows = 1
    return cdiv(rows, t.block_m), 1, 1


#: Where a CPU program keeps an operand it packs once per block (not per K step): its thread's workspace.
_PACKED_ONCE = "global -> workspace (packed once per block)"


def _memory(spec: KernelSpec, t: TileSchedule, gpu: bool, config) -> tuple[tuple[str, str], ...]:
    """Where each operand lives while the kernel runs."""
    copy = "TMA" if config.fact("tma") else ("cp.async" if config.fact("cp_async") else "global loads")
    out: list[tuple[str, str]] = []
    if isinstance(spec, GemmSpec):
        a, b = spec.inputs()[:2]
        tile_a = f"{t.block_k}x{t.block_m}" if spec.transpose_a else f"{t.block_m}x{t.block_k}"
        tile_b = f"{t.block_n}x{t.block_k}" if spec.transpose_b else f"{t.block_k}x{t.block_n}"
        if gpu:
            out += [
                (a.name, f"global -> shared ({tile_a} {_short(a.dtype)} x{t.stages}, {copy})"),
                (b.name, f"global -> shared ({tile_b} {_short(b.dtype)} x{t.stages}, {copy})"),
                ("acc", f"registers ({t.block_m}x{t.block_n} {_short(spec.dtype_acc)})"),
            ]
        else:
            from tessera_tvm.tile.gemm import cpu_a_shared_by_column_blocks, cpu_b_shared_by_row_blocks

            shared_a, shared_b = cpu_a_shared_by_column_blocks(spec, t), cpu_b_shared_by_row_blocks(spec, t)
            out += [
                (a.name, _PACKED_ONCE if shared_a else "global"),
                (b.name, _PACKED_ONCE if shared_b else "global"),
                ("acc", f"local ({t.block_m}x{t.block_n} {_short(spec.dtype_acc)})"),
            ]
        out += [(p.name, "global (read in the epilogue)") for p in spec.inputs()[2:]]
    elif isinstance(spec, AttentionSpec):
        q, k, v = spec.inputs()[:3]
        if gpu:
            out += [
                (q.name, f"global -> shared ({t.block_m}x{spec.D} {_short(q.dtype)})"),
                (k.name, f"global -> shared ({t.block_n}x{spec.D} {_short(k.dtype)} x{max(1, min(t.stages, 2))})"),
                (v.name, f"global -> shared ({t.block_n}x{spec.D} {_short(v.dtype)} x{max(1, min(t.stages, 2))})"),
                ("scores", f"registers ({t.block_m}x{t.block_n} f32)"),
                ("acc", f"registers ({t.block_m}x{spec.D} f32, running max/sum per row)"),
            ]
        else:
            out += [
                (q.name, "global"),
                (k.name, _PACKED_ONCE if t.kv_packs_per_head else "global"),
                (v.name, _PACKED_ONCE if t.kv_packs_per_head else "global"),
                ("acc", f"local ({t.block_m}x{spec.D} f32, running max/sum per row)"),
            ]
        out += [(p.name, "global (read as the scores are scaled)") for p in spec.inputs()[3:]]
    else:
        for p in spec.inputs():
            out.append((p.name, "global -> registers" if gpu else "global"))
        if isinstance(spec, SoftmaxSpec | NormSpec | ReduceSpec):
            out.append(("stats", f"{'registers' if gpu else 'local'} ({t.block_m} rows f32)"))
    for p in spec.outputs():
        out.append((p.name, "global"))
    return tuple(out)


def _epilogue(spec: KernelSpec) -> tuple[str, ...]:
    if isinstance(spec, GemmSpec):
        steps = [f"acc {_short(spec.dtype_acc)}"]
        for op in spec.epilogue:
            if op.operand is not None:  # bias, residual, gate
                steps.append(f"{op.kind} {op.operand}")
            elif op.value is not None:  # scale, add_scalar, max_scalar, min_scalar
                steps.append(f"{op.kind} {op.value:g}")
            elif op.kind == "cast":
                steps.append(f"cast {_short(op.dtype)}")
            else:
                steps.append(op.kind)
        return (*steps, f"store {_short(spec.dtype_out)}")
    if isinstance(spec, ElementwiseSpec):
        return (expr_text(spec.expr), f"store {_short(spec.dtype_out)}")
    if isinstance(spec, NormSpec):
        steps = [spec.kind]
        if spec.has_weight:
            steps.append(f"* {spec.name_weight}")
        if spec.has_bias:
            steps.append(f"+ {spec.name_bias}")
        return (*steps, f"store {_short(spec.dtype_out)}")
    if isinstance(spec, AttentionSpec):
        return (
            f"acc / row sum{' (causal ' + spec.causal_align + ')' if spec.causal else ''}",
            f"store {_short(spec.dtype_out)}",
        )
    return (f"store {_short(spec.outputs()[0].dtype)}",)


def choose_schedule(
    kernel: str,
    summary: str,
    spec: KernelSpec,
    config,
    overrides: Mapping[str, Any] | None = None,
) -> Schedule:
    """The schedule of ``spec`` on ``config``: its defaults, then ``overrides``, validated.

    Raises :class:`ScheduleError` when the result cannot run on the target (before lowering).
    """
    config = load_config(config)
    backend = backend_for(config)
    overrides = dict(overrides or {})
    changes = {("rasterize" if k == "swizzle" else k): v for k, v in overrides.items()}
    try:
        tile = planner.schedule_for(spec, config, changes)
    except planner.MmaError as exc:
        raise ScheduleError(
            f"schedule for kernel {kernel} on {config.name}: {exc}; rejected before lowering",
            reason="; ".join(exc.problems),
        ) from None
    except (ResourceError, SpecError) as exc:
        detail = str(exc).replace(f"kernel '{spec.family} kernel' needs", "it needs")
        how = f" with override {overrides}" if overrides else ""
        raise ScheduleError(
            f"schedule for kernel {kernel} on {config.name}{how} cannot be held: {detail}; rejected before lowering",
            reason=_short_reason(exc),
        ) from None
    gpu = backend.thread_blocks
    device = backend.device
    # TileLang splits pipelined TMA loops into producer/consumer warp groups (Hopper).
    producers = int(config.fact("producer_threads"))
    warp_specialized = bool(
        producers and config.feature("warp_specialization") and spec.family in ("gemm", "attention")
    )
    return Schedule(
        kernel=kernel,
        family=spec.family,
        target=config.name,
        summary=summary,
        block_m=tile.block_m,
        block_n=tile.block_n,
        block_k=tile.block_k,
        stages=tile.stages,
        threads=tile.threads,
        swizzle=tile.rasterize,
        overlap=tile.overlap,
        kv_packs_per_head=tile.kv_packs_per_head,
        conv_algorithm=tile.conv_algorithm,
        warp_specialized=warp_specialized,
        producer_threads=producers if warp_specialized else 0,
        mma=tile.mma if gpu else None,
        memory=_memory(spec, tile, gpu, config),
        epilogue=_epilogue(spec),
        grid=_grid(spec, tile, gpu),
        smem_bytes=smem_bytes(spec, tile, backend.kind),
        local_bytes=local_bytes(spec, tile, backend.kind) if not gpu else 0,
        device=device,
        parallel_grid=backend.parallel_grid and config.feature("parallel_grid"),  # runs tessera.MarkParallelGrid
    )
