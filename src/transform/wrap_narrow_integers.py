"""tessera.WrapNarrowIntegers: make 8- and 16-bit integer arithmetic wrap where TIR says it does.

In TIR, ``uint8 + uint8`` is a uint8: it wraps at 256. TileLang's C, CUDA and HIP code generators
print it as the bare C expression ``a + b``, which C evaluates in ``int``. The value is narrowed
only when it is stored. Anything that reads it first sees the unwrapped value:
- ``(x << 4) >> 4`` keeps the high nibble;
- ``(a + b) >> 1`` halves 300 instead of 44;
- ``a + b < 50`` is false for 200 + 100;
- a widening cast gives 300.
The answer is wrong silently, on every target (tile-ai/tilelang#2961 shows the shift form).

This pass runs last before code generation, after the last Simplify (which would fold it back). It
rewrites each scalar 8- or 16-bit ``+``, ``-``, ``*`` and ``<<`` as the narrow cast of the same
operation in 32 bits, ``(uint8_t)((int)a + (int)b)``, which C evaluates as TIR means. Vector
lanes are left as they are. Programs without such arithmetic keep TileLang's code.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, prim_func_pass, register_pass

from . import analysis

tirx = tvm.tirx

NARROW = ("int8", "uint8", "int16", "uint16")
_OPS = ("tirx.Add", "tirx.Sub", "tirx.Mul")


def _narrow(dtype) -> bool:
    return str(dtype) in NARROW


def _wide(expr):
    return tirx.Cast("int32", expr)


def _wrapped(node):
    """``node`` computed in int32 and cast back to its narrow dtype; None when it is not narrow."""
    dtype = str(node.dtype)
    if not _narrow(dtype):
        return None
    if isinstance(node, tirx.Add):
        return tirx.Cast(dtype, tirx.Add(_wide(node.a), _wide(node.b)))
    if isinstance(node, tirx.Sub):
        return tirx.Cast(dtype, tirx.Sub(_wide(node.a), _wide(node.b)))
    if isinstance(node, tirx.Mul):
        return tirx.Cast(dtype, tirx.Mul(_wide(node.a), _wide(node.b)))
    if isinstance(node, tirx.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name == "tirx.shift_left":
        a, b = node.args
        return tirx.Cast(dtype, tirx.Call("int32", node.op, [_wide(a), _wide(b)]))
    return None


def wrap_narrow_integers(func):
    """``func`` with its scalar narrow-integer arithmetic wrapped (the same object when it has none)."""
    return analysis.rewrite_nodes(func, _wrapped, [*_OPS, "tirx.Call"])


@register_pass(
    "tessera.WrapNarrowIntegers",
    doc="compute scalar 8/16-bit integer +, -, *, << in 32 bits and cast back, so C wraps them as TIR means",
)
def _wrap_narrow_integers(_ctx: BuildContext):
    return prim_func_pass(lambda _gv, func: wrap_narrow_integers(func), name="tessera.WrapNarrowIntegers")
