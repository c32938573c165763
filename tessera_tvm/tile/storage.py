"""CPU storage of kernel specs: fp8 parameters held as float32, which TVM's C codegen can hold.

The CPU backend's ``tile_spec`` hook: ``ts.compile`` and the autotuner build CPU tile programs from
:func:`cpu_storage` of the graph's spec, so the C code never sees an fp8 type.
"""

from __future__ import annotations

import dataclasses

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
    return dataclasses.replace(spec, **changes)
