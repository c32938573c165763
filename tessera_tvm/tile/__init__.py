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

from ..target.backend import backend_for, known_kinds
from ..target.tt.ir import UnsupportedTTOperationError  # noqa: F401  (what a TT tile program refuses)
from .base import DTYPES, SPEC_ATTR, TARGET_KINDS, SpecError, TensorArg, dtype_bytes  # noqa: F401
from .expr import Binary, Const, Expr, Input, Unary  # noqa: F401
from .resources import local_bytes, smem_bytes  # noqa: F401
from .schedule import TileSchedule, fit_schedule, settle_overlap  # noqa: F401
from .specs import (  # noqa: F401
    SPEC_FAMILIES,
    AttentionSpec,
    Conv2dSpec,
    ElementwiseSpec,
    EpilogueOp,
    GemmSpec,
    KernelSpec,
    NormSpec,
    Pool2dSpec,
    ReduceSpec,
    SoftmaxSpec,
)
from .storage import CPU_WIDENED, cpu_storage  # noqa: F401
from .validate import validate_schedule  # noqa: F401


def codegen_kind_of(target: Any) -> str:
    """``cuda`` / ``hip`` / ``c`` / ``tt`` from a codegen kind, a config name or a TargetConfig."""
    if isinstance(target, str) and target in known_kinds():
        return target
    from ..config import load_config

    return load_config(target).codegen_kind  # Tenstorrent: codegen kind tt (its TVM kind is c)


def program_fields(family: str | KernelSpec, target: Any) -> tuple[str, ...]:
    """The :class:`TileSchedule` fields the tile program of ``family`` reads on ``target``.

    ``family`` is a spec family name (``"gemm"``) or a spec; ``target`` is anything
    :func:`build_tile_program` takes (``"cuda"``, ``"c"``, a config name or TargetConfig). Two
    schedules equal in these fields build byte-identical programs (``mma`` is never read: it only
    describes the target's instruction). The autotuner compiles one candidate per program.
    """
    name = family.family if isinstance(family, KernelSpec) else family
    if name not in SPEC_FAMILIES:
        raise SpecError(f"program_fields: family is {name!r}; expected one of {', '.join(SPEC_FAMILIES)}")
    return backend_for(codegen_kind_of(target)).program_fields[name]


def build_tile_program(
    spec: KernelSpec, schedule: TileSchedule | None = None, target: Any = "c", *, name: str | None = None
):
    """The TileLang PrimFunc computing ``spec`` on ``target``: a codegen kind (``cuda``, ``hip``, ``c``
    or ``tt``; not a TVM kind: Tenstorrent's is ``c``), a config name or a TargetConfig (``"hopper"``,
    ``"cpu"``). Without a ``schedule`` the defaults of the target's config are used. The PrimFunc's parameters are
    ``spec.params()`` in order; its symbol is ``name`` (default: the spec's family, e.g. ``gemm``,
    so the device kernel is ``gemm_kernel``).
    """
    kind = codegen_kind_of(target)
    backend = backend_for(kind)
    if schedule is None and backend.fixed_schedule is not None:  # Tenstorrent: one 32x32 tile (tt/tile_programs.py)
        schedule = backend.hook("fixed_schedule")
    if schedule is None:
        given_a_kind = isinstance(target, str) and target in known_kinds()  # not a config name
        config = backend.default_config if given_a_kind else target
        schedule = TileSchedule.from_config(config, spec)
    if not isinstance(schedule, TileSchedule):
        raise SpecError(f"schedule is {schedule!r}; expected a TileSchedule")
    if not isinstance(spec, KernelSpec):
        raise SpecError(
            f"build_tile_program: {type(spec).__name__} is not a kernel spec; expected one of "
            "GemmSpec, ElementwiseSpec, ReduceSpec, SoftmaxSpec, NormSpec, AttentionSpec"
        )
    generate = backend.tile_program(spec.family)
    fp8 = [p for p in spec.params() if p.dtype in backend.unheld_dtypes]
    if fp8:  # else TVM's C codegen fails later with "Cannot convert type float8_e4m3fn to C type"
        raise SpecError(
            f"build_tile_program: parameter {fp8[0].name} is {fp8[0].dtype}, which the CPU's C code cannot "
            "hold; pass fp8 data as float32 on the CPU (every fp8 value is exact in float32; ts.compile does this)"
        )
    func = generate(spec, schedule)
    symbol = name or spec.family
    if not symbol.isidentifier():
        raise SpecError(f"build_tile_program: name is {symbol!r}; expected a C identifier")
    # SPEC_ATTR: a kernel of Tessera's own (tessera_tvm.lower turns loop if-conversion back on for it).
    return func.with_attrs({"global_symbol": symbol, SPEC_ATTR: spec.family})
