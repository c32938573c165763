"""Tile IR: TileLang tile programs generated from kernel specs, one generator per kernel family.

    from tessera_tvm.tile import GemmSpec, EpilogueOp, TileSchedule, build_tile_program
    spec = GemmSpec(1000, 1000, 999, dtype_a="float16", epilogue=(EpilogueOp("relu"),))
    schedule = TileSchedule.from_config("hopper", spec)
    func = build_tile_program(spec, schedule, "cuda")       # a TileLang PrimFunc
    tessera_tvm.lower(func, "hopper")

GPU targets (``cuda``, ``hip``) get shared-memory tiles, fragments, a pipelined K loop and
``T.gemm``; the CPU target (``c``) gets local accumulators and serial loops. Every kernel masks the
edges, so sizes need not be multiples of the block. :func:`program_fields` says which schedule
fields a family's program reads on a target (schedules equal in those build the same program).
"""

from __future__ import annotations

from typing import Any

from ..transform.tt.common import UnsupportedTTOperationError  # noqa: F401  (what a TT tile program refuses)
from .base import DTYPES, TARGET_KINDS, SpecError, TensorArg, dtype_bytes  # noqa: F401
from .expr import Binary, Const, Expr, Input, Unary  # noqa: F401
from .resources import local_bytes, smem_bytes  # noqa: F401
from .schedule import TileSchedule, fit_schedule  # noqa: F401
from .specs import (  # noqa: F401
    SPEC_FAMILIES,
    AttentionSpec,
    ElementwiseSpec,
    EpilogueOp,
    GemmSpec,
    KernelSpec,
    NormSpec,
    ReduceSpec,
    SoftmaxSpec,
)
from .validate import validate_schedule  # noqa: F401

_DEFAULT_CONFIG = {"cuda": "hopper", "hip": "rocm", "c": "cpu", "tt": "tenstorrent"}

#: Dtypes the CPU's C code cannot hold (TVM's C codegen has no fp8 type, and its C legalisation
#: decodes fp8 wrongly): CPU programs take them as float32, which holds every fp8 value exactly.
CPU_WIDENED = ("float8_e4m3fn", "float8_e5m2")


def target_kind_of(target: Any) -> str:
    """``cuda`` / ``hip`` / ``c`` / ``tt`` from a target kind, a config name or a TargetConfig."""
    if isinstance(target, str) and (target in TARGET_KINDS or target == "tt"):
        return target
    from ..config import load_config

    config = load_config(target)
    return "tt" if config.codegen_kind == "tt" else config.target_kind  # Tenstorrent: TVM kind c


#: The TileSchedule fields each family's tile program reads on GPU targets (cuda, hip).
_GPU_FIELDS: dict[str, tuple[str, ...]] = {
    "gemm": ("block_m", "block_n", "block_k", "stages", "threads", "rasterize"),
    "attention": ("block_m", "block_n", "stages", "threads"),  # no K loop, no swizzle
    "softmax": ("block_m", "block_n", "threads"),  # not pipelined: no stages
    "norm": ("block_m", "block_n", "threads"),
    "reduce": ("block_m", "block_n", "threads"),
    "elementwise": ("block_m", "block_n", "threads"),
}
#: The same on the CPU (c): a block's body is serial code, so no program reads threads or stages.
_CPU_FIELDS: dict[str, tuple[str, ...]] = {
    "gemm": ("block_m", "block_n", "block_k"),
    "attention": ("block_m", "block_n"),
    "softmax": ("block_m",),  # a row at a time, in vector lanes of a fixed width: no block_n
    "norm": ("block_m",),
    "reduce": ("block_m",),
    "elementwise": ("block_m", "block_n"),
}
PROGRAM_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "cuda": _GPU_FIELDS,
    "hip": _GPU_FIELDS,
    "c": _CPU_FIELDS,
    "tt": dict.fromkeys(SPEC_FAMILIES, ()),  # one fixed 32x32 schedule (tile/tt.py): nothing to choose
}


def program_fields(family: str | KernelSpec, target_kind: Any) -> tuple[str, ...]:
    """The :class:`TileSchedule` fields the tile program of ``family`` reads on ``target_kind``.

    ``family`` is a spec family name (``"gemm"``) or a spec; ``target_kind`` is anything
    :func:`build_tile_program` takes (``"cuda"``, ``"c"``, a config name or TargetConfig). Two
    schedules equal in these fields build byte-identical programs (``mma`` is never read: it only
    describes the target's instruction). The autotuner compiles one candidate per program.
    """
    name = family.family if isinstance(family, KernelSpec) else family
    if name not in SPEC_FAMILIES:
        raise SpecError(f"program_fields: family is {name!r}; expected one of {', '.join(SPEC_FAMILIES)}")
    return PROGRAM_FIELDS[target_kind_of(target_kind)][name]


def build_tile_program(
    spec: KernelSpec, schedule: TileSchedule | None = None, target_kind: str = "c", *, name: str | None = None
):
    """The TileLang PrimFunc computing ``spec`` on ``target_kind`` (``cuda``, ``hip``, ``c`` or ``tt``).

    ``target_kind`` may also be a config name or TargetConfig (``"hopper"``, ``"cpu"``). Without a
    ``schedule`` the defaults of the target's config are used. The PrimFunc's parameters are
    ``spec.params()`` in order; its symbol is ``name`` (default: the spec's family, e.g. ``gemm``,
    so the device kernel is ``gemm_kernel``).
    """
    kind = target_kind_of(target_kind)
    if kind == "tt":  # Tenstorrent: 32x32 tiles, GEMM and element-wise only (tile/tt.py)
        from .tt import TT_SCHEDULE, tt_program

        func = tt_program(spec, TT_SCHEDULE if schedule is None else schedule, kind)
        return func.with_attr("global_symbol", name or spec.family)
    if schedule is None:
        config = (
            target_kind if not (isinstance(target_kind, str) and target_kind in TARGET_KINDS) else _DEFAULT_CONFIG[kind]
        )
        schedule = TileSchedule.from_config(config, spec)
    if not isinstance(schedule, TileSchedule):
        raise SpecError(f"schedule is {schedule!r}; expected a TileSchedule")
    if isinstance(spec, GemmSpec):
        from .gemm import gemm_program as generate
    elif isinstance(spec, ElementwiseSpec):
        from .elementwise import elementwise_program as generate
    elif isinstance(spec, ReduceSpec):
        from .reduce import reduce_program as generate
    elif isinstance(spec, SoftmaxSpec):
        from .reduce import softmax_program as generate
    elif isinstance(spec, NormSpec):
        from .reduce import norm_program as generate
    elif isinstance(spec, AttentionSpec):
        from .attention import attention_program as generate
    else:
        raise SpecError(
            f"build_tile_program: {type(spec).__name__} is not a kernel spec; expected one of "
            "GemmSpec, ElementwiseSpec, ReduceSpec, SoftmaxSpec, NormSpec, AttentionSpec"
        )
    fp8 = [p for p in spec.params() if p.dtype in CPU_WIDENED] if kind == "c" else []
    if fp8:  # else TVM's C codegen fails later with "Cannot convert type float8_e4m3fn to C type"
        raise SpecError(
            f"build_tile_program: parameter {fp8[0].name} is {fp8[0].dtype}, which the CPU's C code cannot "
            "hold; pass fp8 data as float32 on the CPU (every fp8 value is exact in float32; ts.compile does this)"
        )
    func = generate(spec, schedule, kind)
    symbol = name or spec.family
    if not symbol.isidentifier():
        raise SpecError(f"build_tile_program: name is {symbol!r}; expected a C identifier")
    return func.with_attr("global_symbol", symbol)
