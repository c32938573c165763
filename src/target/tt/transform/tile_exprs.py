"""Expression patterns tt.Tensorize matches inside element-wise tile loops.

Helpers over TIR expressions, independent of any kernel state: casts stripped, float constants
compared with a tolerance, products flattened to factors, structural equality that also requires
the same buffers (``same_expr``), and the GELU recogniser (``match_gelu``, erf and tanh forms).
``tensorizer`` uses them to map a store's expression tree onto FPU and SFPU tile operations.
"""

from __future__ import annotations

import math
from typing import Any

from tessera_tvm._tvm import tvm

from . import common

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _strip_casts(expr):
    while isinstance(expr, tvm.tirx.Cast):
        expr = expr.value
    return expr


def _is_float(expr, value: float, rel: float = 1e-6) -> bool:
    expr = _strip_casts(expr)
    if isinstance(expr, tvm.tirx.FloatImm | tvm.tirx.IntImm):
        return abs(float(expr.value) - value) <= rel * max(1.0, abs(value))
    return False


def _factors(expr) -> list:
    expr = _strip_casts(expr)
    if isinstance(expr, tvm.tirx.Mul):
        return _factors(expr.a) + _factors(expr.b)
    return [expr]


def same_expr(a, b) -> bool:
    """Structural equality that also requires the same buffers (TVM maps buffers positionally)."""
    a, b = _strip_casts(a), _strip_casts(b)
    if not tvm.ir.structural_equal(a, b):
        return False
    loads: tuple[list, list] = ([], [])
    for expr, found in ((a, loads[0]), (b, loads[1])):
        tvm.tirx.stmt_functor.post_order_visit(
            tvm.tirx.Evaluate(expr),
            lambda n, f=found: f.append(n.buffer) if isinstance(n, tvm.tirx.BufferLoad) else None,
        )
    return all(x.same_as(y) for x, y in zip(*loads, strict=True))


def _same_multiset(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    rest = list(b)
    for x in a:
        for k, y in enumerate(rest):
            if same_expr(x, y):
                del rest[k]
                break
        else:
            return False
    return True


def _product(factors: list):
    out = factors[0]
    for f in factors[1:]:
        out = out * f
    return out


def _constant(expr) -> float | None:
    expr = _strip_casts(expr)
    return float(expr.value) if isinstance(expr, tvm.tirx.FloatImm | tvm.tirx.IntImm) else None


def _match_scaled_gelu(factors: list):
    """``gelu(s * X)`` after the simplifier folded the constants: ``a * X * (1 + erf(b * X))`` with
    ``b = sqrt(2) * a`` (``a = s / 2``). Returns ``("gelu", s * X)`` or None."""
    erfs = [
        (f, _strip_casts(call))
        for f in factors
        if isinstance(f, tvm.tirx.Add)
        for one, call in ((f.a, f.b), (f.b, f.a))
        if _is_float(one, 1.0) and common.op_name(_strip_casts(call)) == "tirx.erf"
    ]
    if len(erfs) != 1:
        return None
    add, call = erfs[0]
    rest = [f for f in factors if not f.same_as(add)]
    outer = [c for c in map(_constant, rest) if c is not None]
    inner_factors = _factors(call.args[0])
    inner = [c for c in map(_constant, inner_factors) if c is not None]
    xs = [f for f in rest if _constant(f) is None]
    if not xs or not _same_multiset(xs, [f for f in inner_factors if _constant(f) is None]):
        return None
    a, b = math.prod(outer), math.prod(inner)
    if a == 0 or abs(b - math.sqrt(2.0) * a) > 1e-5 * max(1.0, abs(b)):
        return None
    x = _product(xs)
    scale = 2.0 * a
    return "gelu", x if abs(scale - 1.0) <= 1e-6 else x * tvm.tirx.FloatImm(str(x.dtype), scale)


def match_gelu(expr) -> tuple[str, Any] | None:
    """``("gelu", x)`` for 0.5*x*(1 + erf(x/sqrt2)) (also with its constants folded, for gelu of a
    scaled value), ``("gelu_tanh", x)`` for the tanh form, else None."""
    found = _match_gelu(expr)
    return found if found is not None else _match_scaled_gelu(_factors(expr))


def _match_gelu(expr) -> tuple[str, Any] | None:
    factors = _factors(expr)
    halves = [f for f in factors if _is_float(f, 0.5)]
    ones_plus = []
    for f in factors:
        if isinstance(f, tvm.tirx.Add):
            for one, call in ((f.a, f.b), (f.b, f.a)):
                if _is_float(one, 1.0) and common.op_name(_strip_casts(call)) in ("tirx.erf", "tirx.tanh"):
                    ones_plus.append((f, _strip_casts(call)))
    if len(halves) != 1 or len(ones_plus) != 1:
        return None
    add, call = ones_plus[0]
    rest = [f for f in factors if not f.same_as(halves[0]) and not f.same_as(add)]
    if not rest:
        return None
    inner = _factors(call.args[0])
    if common.op_name(call) == "tirx.erf":
        consts = [f for f in inner if _is_float(f, _SQRT_HALF, 1e-5)]
        if len(consts) == 1 and _same_multiset([f for f in inner if not f.same_as(consts[0])], rest):
            return "gelu", _product(rest)
        return None
    # tanh form: sqrt(2/pi) * (x + 0.044715 * x * x * x)
    consts = [f for f in inner if _is_float(f, _SQRT_2_OVER_PI, 1e-5)]
    if len(consts) != 1 or len(inner) != 2 or len(rest) != 1:
        return None
    poly = _strip_casts(inner[1] if inner[0].same_as(consts[0]) else inner[0])
    if not isinstance(poly, tvm.tirx.Add):
        return None
    x = rest[0]
    for lin, cube in ((poly.a, poly.b), (poly.b, poly.a)):
        cube_factors = _factors(cube)
        coef = [f for f in cube_factors if _is_float(f, 0.044715, 1e-4)]
        if (
            same_expr(lin, x)
            and len(coef) == 1
            and _same_multiset([f for f in cube_factors if not f.same_as(coef[0])], [x, x, x])
        ):
            return "gelu_tanh", x
    return None


def _is_zero(expr) -> bool:
    return _is_float(expr, 0.0)


def _describe(expr) -> str:
    name = common.op_name(expr)
    if name is not None:
        return name
    return type(expr).__name__
