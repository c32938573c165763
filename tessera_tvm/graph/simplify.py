"""tessera.Simplify: algebraic simplification of a traced kernel (graph phase).

Drops identity casts and arithmetic (``x * 1``, ``x + 0``, a cast to the value's own dtype) and folds
chains: a cast through a type that holds every value of the source (bf16 -> f32 -> bf16) and
scalar-multiply chains (``(x * a) * b`` -> ``x * (a*b)``). Rewrites keep the result's struct info.
"""

from __future__ import annotations

from typing import Any

from .._tvm import tvm
from ..pass_log import report_status
from ..registry import BuildContext, register_pass, tessera_module_pass
from .nodes import (
    FlatFunction,
    Node,
    call_with,
    constant_value,
    flatten,
    kernel_functions,
    rebuild,
    replace_functions,
    scalar_const,
)

relax = tvm.relax

# Casts that represent every value of the source exactly: casting through them changes nothing.
_LOSSLESS = {
    "float16": {"float32"},
    "bfloat16": {"float32"},
    "float8_e4m3fn": {"float16", "bfloat16", "float32"},
    "float8_e5m2": {"float16", "bfloat16", "float32"},
    "int8": {"int32", "float16", "bfloat16", "float32"},
}


def simplify(flat: FlatFunction) -> tuple[FlatFunction, int]:
    """Rewrite identity casts/arithmetic and fold cast and scalar-multiply chains."""
    producer = flat.producers()
    uses = flat.uses()
    subst: dict[Any, Any] = {}
    rewrites = 0
    nodes: list[Node] = []
    for node in flat.nodes:
        node = Node(
            node.var,
            node.op,
            [subst.get(a, a) if isinstance(a, relax.Var) else a for a in node.args],
            node.call,
            node.attrs,
        )
        src = node.args[0] if node.args else None
        if node.op == "astype" and str(src.struct_info.dtype) == node.attrs["dtype"]:
            subst[node.var] = src
            rewrites += 1
            continue
        if node.op == "astype":
            inner = producer.get(src)
            if inner is not None and inner.op == "astype" and uses.get(src) == 1:
                orig = inner.args[0] if inner.args[0] not in subst else subst[inner.args[0]]
                if inner.attrs["dtype"] in _LOSSLESS.get(str(orig.struct_info.dtype), ()):
                    if str(orig.struct_info.dtype) == node.attrs["dtype"]:
                        subst[node.var] = orig
                    else:
                        node = Node(node.var, node.op, [orig], call_with(node, [orig]), node.attrs)
                        nodes.append(node)
                    rewrites += 1
                    continue
        if node.op in ("add", "subtract", "multiply", "divide"):
            a, b = node.args
            ca, cb = constant_value(a), constant_value(b)
            identity = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "divide": 1.0}[node.op]
            keep = a if cb == identity else b if (ca == identity and node.op in ("add", "multiply")) else None
            if keep is not None and isinstance(keep, relax.Var) and _same_sinfo(keep, node.var):
                subst[node.var] = keep
                rewrites += 1
                continue
            if node.op == "multiply" and (ca is not None or cb is not None):
                x, c = (b, ca) if ca is not None else (a, cb)
                inner = producer.get(x)
                if inner is not None and inner.op == "multiply" and uses.get(x) == 1:
                    ia, ib = inner.args
                    ic = constant_value(ib) if constant_value(ib) is not None else constant_value(ia)
                    iv = ia if constant_value(ib) is not None else ib
                    product = _folded_scale(ic, c, str(node.var.struct_info.dtype)) if ic is not None else None
                    if product is not None and isinstance(iv, relax.Var):
                        iv = subst.get(iv, iv)
                        rewrites += 1
                        if product == 1 and _same_sinfo(iv, node.var):
                            subst[node.var] = iv
                            continue
                        const = scalar_const(product, str(node.var.struct_info.dtype))
                        node = Node(node.var, node.op, [iv, const], relax.op.multiply(iv, const), node.attrs)
                        nodes.append(node)
                        continue
        nodes.append(node)
    outputs = [subst.get(o, o) if isinstance(o, relax.Var) else o for o in flat.outputs]
    return FlatFunction(flat.name, flat.params, nodes, outputs, flat.tuple_output), rewrites


def _folded_scale(a: float, b: float, dtype: str) -> float | int | None:
    """The one scale of ``dtype`` that ``(x * a) * b`` may be folded into, None where there is none.

    Integers wrap as the kernels' arithmetic does, so their product is folded wrapped. A float
    product is folded only where ``dtype`` holds it (float32: within its rounding, finite and not
    subnormal): folded into a constant of ``dtype`` it was rounded there, and f16 ``(x * 256) * 256``
    became ``x * inf`` (inf and NaN where the reference has 65.56 and 0), ``(x * 1e-3) * 1e-4`` a
    subnormal scale 19% off."""
    import numpy as np

    if dtype.startswith("int"):
        bits = int(dtype[3:])
        return (int(a) * int(b) + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1)
    product = a * b  # exact in float64 for two float32 constants
    if dtype == "float32":
        with np.errstate(over="ignore"):
            rounded = float(np.float32(product))
        normal = abs(rounded) >= float(np.finfo(np.float32).tiny) or product == 0.0
        return product if np.isfinite(rounded) and normal else None
    if dtype in ("float16", "bfloat16"):
        import ml_dtypes

        with np.errstate(over="ignore"):
            rounded = float(np.asarray(product, np.float16 if dtype == "float16" else ml_dtypes.bfloat16))
        return product if rounded == product else None
    return None


def _same_sinfo(a, b) -> bool:
    return tvm.ir.structural_equal(a.struct_info, b.struct_info)


@register_pass("tessera.Simplify", ir="relax", doc="identity casts and arithmetic; cast and scale chains")
def _simplify_pass(ctx: BuildContext):
    def run(mod, _pass_ctx):
        funcs, rewrites = {}, 0
        for gv, func in kernel_functions(mod):
            flat, count = simplify(flatten(func, str(gv.name_hint)))
            funcs[gv] = rebuild(flat, dict(func.attrs))
            rewrites += count
        report_status(f"{rewrites} rewrite{'s' if rewrites != 1 else ''}")
        return replace_functions(mod, funcs)

    return tessera_module_pass(run, name="tessera.Simplify")
