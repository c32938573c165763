"""tessera.ExactFloatConstants: float constants that TVM's C code generator prints exactly.

The C code generator prints a float with 7 significant digits (``2.772589e+00f``), where a float32
needs 9 and a float64 17: ``log(16)`` came out one unit in the last place low, and T5's
relative-position buckets, ``(log(d / 8) / log(16) * 8).long()``, fell one bucket short at distances
16 and 32 (a T5 encoder at 64 tokens off by 2%, with no error). Each constant it would print
inexactly becomes a sum of constants it prints exactly, which the C compiler folds back: the first
term is the printed value, each next one what is left (two terms for a float32, three for a float64).
The CUDA generator prints hex floats, exact already.

Last in the CPU config's ``codegen_prep``: a ``tirx.Simplify`` after it would fold the sums back.
``partition_for_tessera``'s TIR pipeline applies :func:`exact_float_constants_in` to the C functions
TVM keeps.
"""

from __future__ import annotations

import numpy as np

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, prim_func_pass, register_pass

from . import analysis

_KINDS = {"float32": np.float32, "float64": np.float64}


def _split(expr):
    """``expr`` (a FloatImm) as a sum of constants C prints exactly; None where it prints exactly."""
    if str(expr.dtype) not in _KINDS or not np.isfinite(expr.value):
        return None
    kind = _KINDS[str(expr.dtype)]
    value, parts, total = kind(expr.value), [], None
    while total != value and len(parts) < 3:
        part = kind(f"{float(value) - sum(float(p) for p in parts):e}")  # what the printer keeps of the rest
        parts.append(part)
        total = part if total is None else kind(total + part)  # the C addition, left to right
    if len(parts) == 1 or total != value:
        return None
    tirx = tvm.tirx
    out = tirx.FloatImm(str(expr.dtype), float(parts[0]))
    for part in parts[1:]:
        out = tirx.Add(out, tirx.FloatImm(str(expr.dtype), float(part)))  # the node: `+` would fold it
    return out


def exact_float_constants(func):
    """``func`` with its float constants printed exactly by TVM's C code generator (the same object
    when every one already is)."""
    return analysis.rewrite_nodes(func, _split, ["ir.FloatImm"])


def exact_float_constants_in(mod, host_kind: str):
    """``mod`` with :func:`exact_float_constants` applied to its PrimFuncs for targets of kind
    ``host_kind`` (the C host of a Relax module)."""
    out = {}
    for gv, func in mod.functions.items():
        target = func.attrs.get("target") if isinstance(func, tvm.tirx.PrimFunc) and func.attrs else None
        out[gv] = exact_float_constants(func) if target is not None and target.kind.name == host_kind else func
    return tvm.IRModule(out, attrs=mod.attrs)


@register_pass(
    "tessera.ExactFloatConstants",
    doc="write each float constant C would print with 7 digits as a sum of exactly printed ones",
)
def _exact_float_constants(_ctx: BuildContext):
    return prim_func_pass(lambda _gv, func: exact_float_constants(func), name="tessera.ExactFloatConstants")
