"""Device source generation: the lowered device module to CUDA, HIP or C source text, and the
symbol each kernel is compiled under (:func:`kernel_name`).

Each backend names one of TileLang's registered source generators (``Backend.source_generator``),
called here without compiling so that source generation never needs a toolchain.
"""

from __future__ import annotations

import numpy as np

from tessera_tvm._tvm import tvm

from .backend import backend_for


def device_source(device_mod, config, target=None) -> str:
    """Generate the device source of ``device_mod`` (after CodegenPrep) for ``config`` (a TargetConfig)."""
    target = target if target is not None else config.tvm_target()
    generate = tvm.ffi.get_global_func(backend_for(config).source_generator)
    with target:
        return generate(device_mod, target).inspect_source()


def exact_float_constants(mod, host_kind: str | None = None):
    """``mod`` (its functions of target kind ``host_kind``, or all) with each float32 or float64
    constant that TVM's C code generator would print inexactly written as a sum of ones that it prints
    exactly (which the C compiler folds back into the constant).

    The C code generator prints a float with 7 significant digits (``2.772589e+00f``), where a float32
    needs 9 and a float64 17: ``log(16)`` came out one unit in the last place low, and T5's
    relative-position buckets, ``(log(d / 8) / log(16) * 8).long()``, fell one bucket short at
    distances 16 and 32 (a T5 encoder at 64 tokens off by 2%, with no error). The first term is the
    printed value, each next one what is left (two terms for a float32, three for a float64)."""
    tirx = tvm.tirx
    kinds = {"float32": np.float32, "float64": np.float64}

    def split(expr):
        if not (isinstance(expr, tirx.FloatImm) and str(expr.dtype) in kinds and np.isfinite(expr.value)):
            return None
        kind = kinds[str(expr.dtype)]
        value, parts, total = kind(expr.value), [], None
        while total != value and len(parts) < 3:
            part = kind(f"{float(value) - sum(float(p) for p in parts):e}")  # what the printer keeps of the rest
            parts.append(part)
            total = part if total is None else kind(total + part)  # the C addition, left to right
        if len(parts) == 1 or total != value:
            return None
        out = tirx.FloatImm(str(expr.dtype), float(parts[0]))
        for part in parts[1:]:
            out = tirx.Add(out, tirx.FloatImm(str(expr.dtype), float(part)))  # the node: `+` would fold it
        return out

    out = {}
    for gv, func in mod.functions.items():
        target = func.attrs.get("target") if isinstance(func, tirx.PrimFunc) and func.attrs else None
        if isinstance(func, tirx.PrimFunc) and (
            host_kind is None or (target is not None and target.kind.name == host_kind)
        ):
            func = func.with_body(tirx.stmt_functor.ir_transform(func.body, None, split, ["ir.FloatImm"]))
        out[gv] = func
    return tvm.IRModule(out, attrs=mod.attrs)


def kernel_name(gv, func) -> str:
    """The symbol the kernel is compiled and launched under."""
    symbol = func.attrs.get("global_symbol") if func.attrs else None
    return str(symbol) if symbol is not None else str(gv.name_hint)
