"""CPU storage of kernel specs: fp8 parameters held as float32, which TVM's C codegen can hold.

The CPU backend's ``tile_spec`` hook: ``ts.compile`` and the autotuner build CPU tile programs from
:func:`cpu_storage` of the graph's spec, so the C code never sees an fp8 type.
"""

from __future__ import annotations

import dataclasses

from .base import SpecError
from .specs import ElementwiseSpec, GemmSpec, KernelSpec

#: Dtypes the CPU's C code cannot hold (TVM's C codegen has no fp8 type, and its C legalisation
#: decodes fp8 wrongly): CPU programs take them as float32, which holds every fp8 value exactly.
CPU_WIDENED = ("float8_e4m3fn", "float8_e5m2")


def cpu_storage(spec: KernelSpec) -> KernelSpec:
    """``spec`` with fp8 parameters held as float32 (:data:`CPU_WIDENED`). Exact: every
    fp8 value is a float32, and the kernel computes in float32 anyway; results are rounded to the
    graph's dtype here, as the kernel's own store would. (bf16 goes as its 16 bits: the C codegen
    passes it as uint16_t, and the CPU GEMM packs it for the CPU's bf16 dot products, tessera/cpu_gemm.h.)"""

    def widen(dtype):
        return "float32" if dtype in CPU_WIDENED else dtype

    changes = {
        f.name: widen(getattr(spec, f.name))
        for f in dataclasses.fields(spec)
        if f.name.startswith("dtype_")
        and f.name not in ("dtype_acc", "dtype_compute")
        and isinstance(getattr(spec, f.name), str)
    }
    if isinstance(spec, GemmSpec):
        changes["epilogue"] = tuple(
            dataclasses.replace(op, dtype=widen(op.dtype)) if op.operand is not None else op for op in spec.epilogue
        )
    if isinstance(spec, ElementwiseSpec):
        changes["operands"] = tuple((p.name, p.shape, widen(p.dtype)) for p in spec.operands)
        changes["expr"] = _without_final_fp8_cast(spec)
    return dataclasses.replace(spec, **changes)


def _without_final_fp8_cast(spec: ElementwiseSpec):
    """``spec.expr`` without a last cast to its fp8 output dtype: the result is rounded to fp8 where
    it is stored (the runner, the tvm-ffi entry), which is that cast. An fp8 cast inside the
    expression would need rounding in C, which the CPU codegen cannot express: a clear error."""
    from .expr import Unary, expr_nodes

    expr = spec.expr
    if isinstance(expr, Unary) and expr.op == "cast" and expr.dtype == spec.dtype_out in CPU_WIDENED:
        expr = expr.x
    inner = [n for n in expr_nodes(expr) if isinstance(n, Unary) and n.op == "cast" and n.dtype in CPU_WIDENED]
    if inner:
        raise SpecError(
            f"the CPU cannot round to {inner[0].dtype} inside an element-wise expression (TVM's C codegen has no "
            "fp8 type); cast to fp8 only as the kernel's last step on CPU configs"
        )
    return expr
