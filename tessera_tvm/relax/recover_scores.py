"""Attention whose scores get more than one mask: ALiBi, as BLOOM and MPT write it.

:func:`tessera_tvm.relax.recover.recover_attention` takes the scores as SDPA's decomposition and HF's
eager attention spell them: the product, scaled, plus one mask. BLOOM and MPT add an ALiBi
position bias as well, and compute the product on Q, K and V merged to ``[B*H, S, D]`` (BLOOM) or
in 4-D (MPT, imported without decomposition):

    BLOOM:  s = reshape(alibi + matmul(q', permute(k')) * c, [B, H, S_q, S_kv]) + mask   # baddbmm
    MPT:    s = where(masked, finfo.min, matmul(q, permute(k)) * c + alibi)            # masked_fill

then ``softmax(s)`` (in float32 between casts, or in the model's dtype) and ``probs @ v``.
:func:`recover_scored_attention` walks the scores back from the softmax to the product: casts
(between the model's dtype and float32 only: Tessera's kernel computes scores and softmax in
float32), one scale, one reshape from [B*H, S_q, S_kv] to [B, H, S_q, S_kv], and terms added
after the scale. A ``where(cond, fill, s)`` (masked_fill) is the term ``where(cond, fill, 0)``
where ``fill`` is -inf or at most -2**127 (finfo.min of float32 and bfloat16): a score plus such a
fill rounds to the fill in float32 for any score below 2**103 in magnitude, so a row of masked keys
is a row of equal fills (uniform probabilities, as torch computes) and any other masked key gets
probability 0 either way. The terms become one bias of ``R.nn.attention_bias``, summed in their
order (``s + (t1 + t2)`` for torch's ``(s + t1) + t2``: a rounding apart, and exact where a term is
0 or a fill), in float32 if any term is float32 and else in the model's dtype; terms of
``[B*H, ...]`` are reshaped to ``[B, H, ...]``. The bias, the same in every layer, is bound
once (the rewrite reuses the binding of the same sum; tests/relax/test_scored_attention.py checks
it). Models in float32 and bfloat16 only: in float16 a score plus finfo.min (-65504) rounds to
-65504 in float16 but not in the kernel's float32. As in recover_attention, the attention is rebuilt only
where ``takes`` accepts it, and a query whose keys are all -inf gets zeros where torch gives NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._tvm import tvm
from .recover import _relax_shape, _scalar, _shape, rebuilt_attention, rewrite_functions

relax = tvm.relax
dpl = relax.dpl

__all__ = ["recover_scored_attention"]

#: A masked_fill's fill whose sum with any score below 2**103 in magnitude rounds to it in float32.
_FILL_AT_MOST = -(2.0**127)


def _pattern():
    def merged(x):  # [B, H, ...] -> [B*H, ...], through a broadcast_to or not
        return dpl.is_op("relax.reshape")(dpl.is_op("relax.broadcast_to")(x, dpl.wildcard()) | x, dpl.wildcard())

    probs = dpl.is_op("relax.nn.softmax")(dpl.wildcard())
    downcast = dpl.is_op("relax.astype")(probs)
    v = dpl.wildcard()
    out = dpl.is_op("relax.matmul")(merged(downcast | probs), merged(v))
    out = out | dpl.is_op("relax.matmul")(downcast | probs, v)
    out_cast = dpl.is_op("relax.astype")(out)
    root = dpl.is_op("relax.reshape")(out_cast | out, dpl.wildcard()) | out_cast | out
    return root, dict(probs=probs, downcast=downcast, v=v, out=out, out_cast=out_cast)


def recover_scored_attention(mod, takes: Callable[[Any], bool] | None = None) -> tuple[Any, int]:
    """``mod`` with each attention whose scores the module docstring describes rewritten to
    ``R.nn.attention_bias``; and how many. Run after recover_attention (which takes the others)."""
    pattern, parts = _pattern()
    return rewrite_functions(mod, pattern, lambda orig, m, bindings: _rewritten(orig, m, parts, bindings, takes))


def _call(expr, bindings, *names):
    """The Call bound to ``expr`` when it is one of the ops ``names`` (None: any op), else None."""
    value = bindings.get(expr, expr)
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        if not names or value.op.name in names:
            return value
    return None


def _consumed(orig, bindings) -> bool:
    """Whether ``orig`` (a matmul or a cast) is bound to a var that a cast or reshape reads: that
    one is the attention's root."""
    var = next((var for var, value in bindings.items() if value.same_as(orig)), None)
    return var is not None and any(
        isinstance(value, relax.Call)
        and isinstance(value.op, tvm.ir.Op)
        and value.op.name in ("relax.astype", "relax.reshape")
        and value.args[0].same_as(var)
        for value in bindings.values()
    )


def _steps(expr, bindings, depth: int = 0, failed: set | None = None) -> list | None:
    """The ops from the QK^T product to ``expr`` (the softmax's input), innermost first: ("product",
    matmul), ("cast", astype), ("reshape", reshape), ("scale", factor), ("term", added) and ("fill",
    where); None when ``expr`` is built otherwise. Of an add, the operand of the add's own shape is
    tried first as the scores (a term broadcasts)."""
    failed = set() if failed is None else failed
    call = _call(expr, bindings)
    if call is None or depth > 24 or expr in failed:
        return None
    found = _step(call, bindings, depth, failed)
    if found is None:
        failed.add(expr)
    return found


def _step(call, bindings, depth, failed) -> list | None:
    name, args = call.op.name, call.args
    if name == "relax.matmul":
        return [("product", call)]
    if name in ("relax.astype", "relax.reshape"):
        rest = _steps(args[0], bindings, depth + 1, failed)
        return None if rest is None else [*rest, (name.removeprefix("relax.").replace("astype", "cast"), call)]
    if name in ("relax.multiply", "relax.divide"):
        for i in (0, 1) if name == "relax.multiply" else (0,):
            const = bindings.get(args[1 - i], args[1 - i])
            factor = _scalar(const) if isinstance(const, relax.Constant) else None
            if factor is None or (name == "relax.divide" and factor == 0):
                continue
            rest = _steps(args[i], bindings, depth + 1, failed)
            if rest is not None:
                return [*rest, ("scale", factor if name == "relax.multiply" else 1 / factor)]
        return None
    if name == "relax.add":
        for i in sorted((0, 1), key=lambda i: _shape(args[i]) != _shape(call)):
            rest = _steps(args[i], bindings, depth + 1, failed)
            if rest is not None:
                return [*rest, ("term", args[1 - i])]
        return None
    if name == "relax.where":
        rest = _steps(args[2], bindings, depth + 1, failed)
        return None if rest is None else [*rest, ("fill", call)]
    return None


def _fill_term(where, bindings):
    """``where(cond, fill, s)`` (masked_fill) as the term ``where(cond, fill, 0)``; None unless the
    fill is a scalar -inf or at most -2**127 (see the module docstring)."""
    cond, fill = where.args[0], where.args[1]
    value = bindings.get(fill, fill)
    full = _call(fill, bindings, "relax.full_like", "relax.full")
    if full is not None:  # full_like(s, c) / full(shape, c): c everywhere
        value = full.args[1]
        value = bindings.get(value, value)
    fill_value = _scalar(value) if isinstance(value, relax.Constant) else None
    if fill_value is None or not fill_value <= _FILL_AT_MOST:
        return None
    if str(cond.struct_info.dtype) != "bool":
        return None
    dtype = str(where.struct_info.dtype)
    term = relax.op.where(cond, relax.const(fill_value, dtype), relax.const(0.0, dtype))
    return relax.BlockBuilder().normalize(term)


def _operand(expr, bindings, dtype, merged: bool, key: bool):
    """Q (``key``: K) of the product: ``(x [B, H, S, D], factor)`` for the matmul's operand ``expr``
    (cast from ``dtype`` to float32, merged to [B*H, ...] when ``merged``, K transposed before or
    after the merge, scaled by a constant); None otherwise."""
    cast = _call(expr, bindings, "relax.astype")
    if cast is not None:
        if str(cast.args[0].struct_info.dtype) != dtype or str(cast.struct_info.dtype) not in (dtype, "float32"):
            return None
        expr = cast.args[0]
    if merged:
        t = _call(expr, bindings, "relax.permute_dims")
        if key and t is not None and [int(a) for a in t.attrs.axes] == [0, 2, 1]:  # BLOOM: k merged, then transposed
            reshape = _call(t.args[0], bindings, "relax.reshape")
            return None if reshape is None else (reshape.args[0], 1.0, False)
        reshape = _call(expr, bindings, "relax.reshape")
        if reshape is None:
            return None
        expr = reshape.args[0]
        spread = _call(expr, bindings, "relax.broadcast_to")
        if spread is not None and _shape(spread.args[0]) == _shape(spread):
            expr = spread.args[0]
    factor = 1.0
    scaled = _call(expr, bindings, "relax.multiply")
    if scaled is not None:
        const = bindings.get(scaled.args[1], scaled.args[1])
        factor = _scalar(const) if isinstance(const, relax.Constant) else None
        if factor is None:
            return None
        expr = scaled.args[0]
    if key:
        t = _call(expr, bindings, "relax.permute_dims")
        if t is None or [int(a) for a in t.attrs.axes] != [0, 1, 3, 2]:
            return None
        expr = t.args[0]
    return expr, factor, True


def _rewritten(orig, m, p, bindings, takes):
    if orig.op.name in ("relax.matmul", "relax.astype") and _consumed(orig, bindings):
        return None  # the cast or reshape after it is the root
    probs, v, out = m[p["probs"]], m[p["v"]], m[p["out"]]
    dtype = str(v.struct_info.dtype)
    if dtype not in ("float32", "bfloat16"):
        return None  # float16's finfo.min (-65504) plus a score is no longer the fill in float32
    steps = _steps(probs.args[0], bindings)
    if steps is None or int(probs.attrs.axis) not in (-1, 3):
        return None
    product = steps[0][1]
    merged = len(_shape(product) or ()) == 3
    operands = [_operand(product.args[i], bindings, dtype, merged, key=i == 1) for i in (0, 1)]
    if None in operands:
        return None
    (q, q_factor, _), (k, k_factor, _) = operands
    shapes = [_shape(t) for t in (q, k, v)]
    if any(s is None or len(s) != 4 for s in shapes) or len(_shape(probs) or ()) != 4:
        return None
    (b, h, s_q, d), (b_k, h_k, s_k, d_k), v_shape = shapes
    dv = v_shape[3]
    if (b_k, h_k, d_k) != (b, h, d) or v_shape != (b, h, s_k, dv) or _shape(probs) != (b, h, s_q, s_k):
        return None
    if _shape(product) != ((b * h, s_q, s_k) if merged else (b, h, s_q, s_k)):
        return None
    if _shape(out) not in ((b * h, s_q, dv), (b, h, s_q, dv)) or _shape(orig) is None:
        return None
    if any(str(t.struct_info.dtype) != dtype for t in (q, k)):
        return None
    # The ops between: casts within float32 and the dtype, one scale before any term, one reshape.
    allowed = {dtype, "float32"}
    scale, terms, reshaped = q_factor * k_factor, [], False
    for kind, x in steps[1:]:
        if kind == "scale":
            if terms:
                return None
            scale *= x
        elif kind == "reshape":
            if reshaped or not merged or _shape(x.args[0]) != (b * h, s_q, s_k) or _shape(x) != (b, h, s_q, s_k):
                return None
            reshaped = True
        elif kind == "term":
            if _reads(x, product, bindings):
                return None  # computed from the scores: not a bias
            terms.append((x, merged and not reshaped))
        elif kind == "fill":
            term = _fill_term(x, bindings)
            if term is None or _reads(x.args[0], product, bindings):
                return None
            terms.append((term, merged and not reshaped))
        if kind != "term" and kind != "scale" and str(x.struct_info.dtype) not in allowed:
            return None
    if merged != reshaped or not terms:
        return None  # without a term: recover_attention's case
    if str(product.struct_info.dtype) not in allowed or str(probs.struct_info.dtype) not in allowed:
        return None
    for cast in (m[p[name]] for name in ("downcast", "out_cast") if p[name] in m):
        if str(cast.struct_info.dtype) != dtype:
            return None
    if str(out.struct_info.dtype) not in allowed or str(orig.struct_info.dtype) not in allowed:
        return None
    if p["downcast"] not in m and str(probs.struct_info.dtype) != dtype:
        return None
    bias = _bias(terms, (b, h, s_q, s_k), dtype)
    if bias is None:
        return None
    result = rebuilt_attention(q, k, v, scale, False, bias, checked=True, bindings=bindings, takes=takes)
    if result is None:
        return None
    if _shape(orig) != (b, h, s_q, dv):
        result = relax.op.reshape(result, _relax_shape(_shape(orig)))
    if str(orig.struct_info.dtype) != dtype:
        result = relax.op.astype(result, str(orig.struct_info.dtype))
    return result


def _reads(expr, product, bindings) -> bool:
    """Whether ``expr`` is computed from ``product`` (through the function's bindings)."""
    seen, todo = set(), [expr]
    while todo:
        node = todo.pop()
        value = bindings.get(node, node)
        if value.same_as(product):
            return True
        if node in seen or not isinstance(value, relax.Call | relax.Tuple):
            continue
        seen.add(node)
        todo.extend(value.args if isinstance(value, relax.Call) else value.fields)
    return False


def _bias(terms, full: tuple, dtype: str):
    """The terms (each ``(expr, of [B*H, S_q, S_kv])``) summed into one bias of 4 dims, each 1 or the
    scores', its last S_kv: ``(bias, shape)``; None when they are not such a bias."""
    b, h, s_q, s_k = full
    parts, dtypes = [], set()
    for term, merged in terms:
        shape = _shape(term)
        if shape is None or not str(term.struct_info.dtype).startswith(("float", "bfloat")):
            return None
        if merged:  # [B*H|1, S_q|1, S_kv|1] -> [B, H|1, ...]
            if len(shape) > 3:
                return None
            shape = (1,) * (3 - len(shape)) + shape
            shape = ((1, 1) if shape[0] == 1 else (b, h) if shape[0] == b * h else (None,)) + shape[1:]
            if None in shape:
                return None
        elif len(shape) > 4:
            return None
        shape = (1,) * (4 - len(shape)) + shape
        if any(d != 1 and d != f for d, f in zip(shape, full, strict=True)):
            return None
        term_dtype = str(term.struct_info.dtype)
        parts.append(
            (term if _shape(term) == shape else relax.op.reshape(term, _relax_shape(shape)), shape, term_dtype)
        )
        dtypes.add(term_dtype)
    bias_dtype = dtype if dtypes == {dtype} else "float32"
    if not dtypes <= {dtype, "float32"}:
        return None
    bias, bias_shape = None, (1, 1, 1, 1)
    for term, shape, term_dtype in parts:
        if term_dtype != bias_dtype:
            term = relax.op.astype(term, bias_dtype)
        bias = term if bias is None else relax.op.add(bias, term)
        bias_shape = tuple(f if d != 1 else c for d, c, f in zip(shape, bias_shape, full, strict=True))
    if bias_shape[3] != s_k:
        return None
    return bias, bias_shape, bias_dtype
