"""The kernel-spec API in one module (kept for importers of ``tessera_tvm.tile.spec``).

The code lives in the modules this one re-exports from: ``base`` (``SpecError``, dtypes,
``TensorArg``, argument checks), ``expr`` (element-wise expressions), ``specs`` (the kernel specs),
``schedule`` (``TileSchedule`` and its heuristics), ``resources`` (shared-memory and local-array
estimates) and ``validate`` (``validate_schedule``). New code imports from ``tessera_tvm.tile`` or
from those modules.
"""

from __future__ import annotations

from .base import DTYPES, TARGET_KINDS, SpecError, TensorArg, dtype_bytes  # noqa: F401
from .expr import BINARY_OPS, UNARY_OPS, Binary, Const, Expr, Input, Unary, expr_nodes, expr_text  # noqa: F401
from .resources import local_bytes, smem_bytes  # noqa: F401
from .schedule import CPU_GEMM_SPREAD_MIN_WORK, TileSchedule, fit_schedule  # noqa: F401
from .specs import (  # noqa: F401
    EPILOGUE_KINDS,
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
from .validate import validate_schedule  # noqa: F401

__all__ = [
    "DTYPES",
    "AttentionSpec",
    "Binary",
    "Const",
    "Conv2dSpec",
    "ElementwiseSpec",
    "EpilogueOp",
    "Expr",
    "GemmSpec",
    "Input",
    "KernelSpec",
    "NormSpec",
    "Pool2dSpec",
    "ReduceSpec",
    "SoftmaxSpec",
    "SpecError",
    "TensorArg",
    "TileSchedule",
    "Unary",
    "dtype_bytes",
    "local_bytes",
    "smem_bytes",
    "validate_schedule",
]
