"""Attention recovered from the ops torch's decomposition spells it with.

TVM's torch frontend at its defaults (``run_ep_decomposition=True``) imports
``scaled_dot_product_attention`` as torch decomposes it, in ``[B, H, S, D]``:

    scores = reshape(matmul(reshape(broadcast_to(q * sq)), reshape(broadcast_to(permute(k) * sk))))
    probs  = softmax(scores + mask)                    # mask: 0 / -inf, built from arange and where
    probs  = where(row_all_masked(scores + mask), 0, probs)         # torch's guard for empty rows
    out    = reshape(matmul(reshape(broadcast_to(probs)), reshape(broadcast_to(v))))

Attention written by hand (HF style) imports as the same without the guard, q and k unscaled and
the scores scaled instead: ``softmax(reshape(matmul(...)) / c + mask)``. In float16 and bfloat16
each matmul imports as a float32 product cast back to the inputs' dtype, and HF's eager attention
runs its softmax in float32 between casts: ``astype(softmax(astype(scores + mask, "float32")),
dtype)`` (or the mask added after the first cast). The casts are dropped, only these (to float32
inside, to q's dtype outside), and only where Tessera's kernel, which computes the scores and the
softmax in float32, takes the attention.

:func:`recover_attention` rewrites either back into one ``R.nn.attention`` (``[B, S, H, D]``, scale
``sq * sk / c``), which ``partition_for_tessera`` offloads as one flash-attention kernel. A mask
that is all zeros is dropped and torch's causal mask becomes ``causal_mask="TopLeft"``: the mask is
evaluated when it is built from constants only; a mask of a dynamic sequence length is built as a
TIR expression of the query and key indices instead, and TVM's arithmetic must prove it 0 where the
key is at or before the query and -inf after it (or 0 everywhere). Any other mask (padding, ALiBi, a
mask the model takes as an input) becomes the bias of ``R.nn.attention_bias``, with leading 1s up to
4-D; it must broadcast to the scores along B, H and S_q and span the keys. Every reshape must only
merge B and H. K and V whose H_kv heads are each repeated H / H_kv times in a row (HF's
``repeat_kv``: ``reshape(broadcast_to(expand_dims(x, axis=2)))``) are taken before the repeat, as
grouped-query attention, where Tessera's kernel takes it (TVM's own attention pairs grouped heads
differently), and so are K and V of one head that SDPA broadcasts over the query heads (Falcon's
multi-query attention). Scores with more than one mask (ALiBi as BLOOM and MPT add it) are
tessera_tvm/relax/recover_scores.py's. Anything else is left as it is, so a rewrite never changes
what the model computes, with one exception: a query whose keys are all -inf gets zeros (as under
torch's guard) where attention written by hand gives NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import op_table, relax_rewrites
from .._tvm import tvm

relax = tvm.relax
dpl = relax.dpl

__all__ = [
    "fold_batch_norms",
    "fold_constant_slices",
    "recover_attention",
    "recover_gelu_tanh",
    "recover_rms_norm",
    "recover_silu",
    "rewrite_functions",
    "sink_reshapes",
]


def _merged(inner):
    """``reshape(broadcast_to(inner))``: the decomposition's [B, H, ...] -> [B*H, ...] (checked later)."""
    return dpl.is_op("relax.reshape")(dpl.is_op("relax.broadcast_to")(inner, dpl.wildcard()), dpl.wildcard())


def _pattern():
    q, k, v = dpl.wildcard(), dpl.wildcard(), dpl.wildcard()
    q_scale, k_scale, mask = dpl.is_const(), dpl.is_const(), dpl.wildcard()
    q_scaled = dpl.is_op("relax.multiply")(q, q_scale)  # SDPA's decomposition scales q and k by sqrt(scale)
    k_t = dpl.is_op("relax.permute_dims")(k)
    k_scaled = dpl.is_op("relax.multiply")(k_t, k_scale)
    product = dpl.is_op("relax.matmul")(_merged(q_scaled | q), _merged(k_scaled | k_t))
    product_cast = dpl.is_op("relax.astype")(product)  # a half-precision matmul: f32, cast back to q's dtype
    scores = dpl.is_op("relax.reshape")(product_cast | product, dpl.wildcard())
    scale = dpl.is_const()  # attention written by hand scales the scores: (q @ k^T) / sqrt(d)
    multiplied, divided = dpl.is_op("relax.multiply")(scores, scale), dpl.is_op("relax.divide")(scores, scale)
    scaled = multiplied | divided | scores
    masked = dpl.is_op("relax.add")(scaled, mask) | dpl.is_op("relax.add")(mask, scaled)
    # HF in half precision: softmax(w, dtype=torch.float32).to(q.dtype), the mask added before the
    # cast or after it (w.float() + mask).
    upcast = dpl.is_op("relax.astype")(masked | scaled)
    masked_up = dpl.is_op("relax.add")(upcast, mask) | dpl.is_op("relax.add")(mask, upcast)
    probs = dpl.is_op("relax.nn.softmax")(masked_up | upcast | masked | scaled)
    downcast = dpl.is_op("relax.astype")(probs)
    guard, zeros = dpl.wildcard(), dpl.wildcard()
    guarded = dpl.is_op("relax.where")(guard, zeros, probs)
    out = dpl.is_op("relax.matmul")(_merged(guarded | downcast | probs), _merged(v))
    out_cast = dpl.is_op("relax.astype")(out)
    result = dpl.is_op("relax.reshape")(out_cast | out, dpl.wildcard())
    parts = dict(q=q, k=k, v=v, q_scale=q_scale, k_scale=k_scale, mask=mask, scale=scale, divided=divided)
    parts.update(probs=probs, guard=guard, guarded=guarded, zeros=zeros, k_t=k_t, out=out)
    parts.update(product_cast=product_cast, upcast=upcast, downcast=downcast, out_cast=out_cast)
    return result, parts


def recover_attention(mod, takes: Callable[[Any], bool] | None = None) -> tuple[Any, int]:
    """``mod`` with each decomposed attention rewritten to ``R.nn.attention``; and how many.

    An attention with a bias (a mask that is neither causal nor zero), or one in half precision
    whose casts the rewrite drops, is rebuilt where ``takes(call)`` (None: always) accepts its
    ``R.nn.attention`` call on stand-in Vars ([B, S, H, D], the bias [B|1, H|1, S_q|1, S_kv]). K
    and V repeated per kv head are taken before the repeat (grouped-query attention) only where
    ``takes`` accepts that call (None: never); otherwise the attention is rebuilt on them repeated.
    ``partition_for_tessera`` rebuilds one only where Tessera's kernel takes it, so the decomposition
    stays where TVM would compute it: TVM's own attention gives NaN where torch's decomposition gives
    zeros (a query whose keys are all masked), and in half precision computes its softmax in that
    precision, not in float32 as the model does."""
    pattern, parts = _pattern()
    return rewrite_functions(mod, pattern, lambda orig, m, bindings: _rewritten(orig, m, parts, bindings, takes))


def rewrite_functions(mod, pattern, make, rounds: int = 1) -> tuple[Any, int]:
    """tessera_tvm.relax_rewrites.rewrite_functions in TileLang's TVM."""
    return relax_rewrites.rewrite_functions(mod, pattern, make, tvm, rounds)


class _Sym:
    """A symbolic dim (``s0``, ``s0 * 24``) in a shape tuple: equal to another when TVM's arithmetic
    proves it, never equal to an int, and multiplied as an expression. Shapes of static and symbolic
    dims then compare as tuples (a model exported with a dynamic batch is rewritten like a static one)."""

    def __init__(self, expr) -> None:
        self.expr = expr  # as the model spells it (a rewritten shape keeps the spelling)

    def __eq__(self, other) -> bool:
        return isinstance(other, _Sym) and bool(tvm.arith.Analyzer().can_prove_equal(self.expr, other.expr))

    def __hash__(self) -> int:
        return hash(str(tvm.arith.Analyzer().simplify(self.expr)))

    def __mul__(self, other) -> _Sym:
        other = other.expr if isinstance(other, _Sym) else tvm.tirx.IntImm(self.expr.dtype, int(other))
        return _Sym(self.expr * other)

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return str(self.expr)


def _shape(expr) -> tuple[Any, ...] | None:
    """The shape of ``expr``: ints, and a :class:`_Sym` for each symbolic dim (None when unknown)."""
    sinfo = expr.struct_info
    if not isinstance(sinfo, relax.TensorStructInfo) or sinfo.shape is None:
        return None
    return tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else _Sym(d) for d in sinfo.shape.values)


def _relax_shape(shape: tuple[Any, ...]) -> list:
    """A :func:`_shape` tuple as the dims of a Relax shape."""
    return [d.expr if isinstance(d, _Sym) else d for d in shape]


def _scalar(const) -> float | None:
    value = const.data.numpy()
    return float(value) if value.size == 1 else None


def _rewritten(orig, m, p, bindings, takes):
    q, k, v = m[p["q"]], m[p["k"]], m[p["v"]]
    shapes = [_shape(t) for t in (q, k, v, orig)]
    if any(s is None or len(s) != 4 for s in shapes):
        return None
    (b, h, s_q, d), (bk, hk, s_k, dk), (bv, hv, s_v, dv), out_shape = shapes
    if (bk, dk) != (b, d) or (bv, hv, s_v) != (b, hk, s_k) or hk not in (h, 1) or out_shape != (b, h, s_q, dv):
        return None  # shapes the rewrite does not cover (K and V of one head are broadcast over the heads)
    if [int(a) for a in m[p["k_t"]].attrs.axes] != [0, 1, 3, 2]:
        return None
    if _shape(m[p["out"]]) != (b * h, s_q, dv):  # every reshape only merges B and H
        return None
    if int(m[p["probs"]].attrs.axis) not in (-1, 3):
        return None  # a softmax over the queries (attention written by hand)
    if not _casts_kept_to(str(q.struct_info.dtype), orig, m, p, k, v):
        return None
    scales = [_scalar(m[p[name]]) if p[name] in m else 1.0 for name in ("q_scale", "k_scale", "scale")]
    if None in scales or (p["divided"] in m and scales[2] == 0):
        return None
    scale = scales[0] * scales[1] * (1 / scales[2] if p["divided"] in m else scales[2])
    causal, bias = False, None
    if p["mask"] in m:
        mask = _evaluate(m[p["mask"]], bindings)  # None for a mask of dynamic shape: proved instead
        causal = _causal(mask, s_q, s_k) if mask is not None else _causal_symbolic(m[p["mask"]], bindings, s_q, s_k)
        if causal is None:  # any other mask (padding, ALiBi, an input) is an additive bias
            causal, bias = False, _as_bias(m[p["mask"]], (b, h, s_q, s_k))
            if bias is None:
                return None
            bias = (*bias, _dtype(m[p["mask"]]))  # a mask of a lower rank: reshaped, not normalized
    # Torch's guard zeros the rows whose every score is -inf (a bias can mask them): Tessera's kernel does too.
    softmax_input = m[p["probs"]].args[0]
    if p["guarded"] in m and not _is_empty_row_guard(m[p["guard"]], m[p["zeros"]], softmax_input, bindings):
        return None
    casts_dropped = any(p[cast] in m for cast in ("product_cast", "upcast", "out_cast"))
    return rebuilt_attention(
        q, k, v, scale, causal, bias, checked=bias is not None or casts_dropped, bindings=bindings, takes=takes
    )


def rebuilt_attention(q, k, v, scale, causal, bias, *, checked, bindings, takes):
    """``R.nn.attention`` of q [B, H, S_q, D], k [B, H|1, S_kv, D] and v [B, H|1, S_kv, Dv] (K and V
    of one head: broadcast over the heads), its result permuted back to [B, H, S_q, Dv]; ``bias``
    None or (the bias, its 4-D shape). K and V repeated per kv head (:func:`_unrepeated`), or of one
    head, are taken as they are (grouped-query attention) where ``takes`` accepts that call; an
    attention that is ``checked`` (a bias, or casts dropped) only where ``takes`` accepts it (else
    None: not rewritten). See :func:`recover_attention`."""
    (b, h, s_q, d), (_, h_kv, s_k, _), (*_, dv) = (_shape(t) for t in (q, k, v))
    bias, bias_shape, *bias_dtype = bias if bias is not None else (None, None)  # its dtype, where not normalized

    def taken(heads_kv) -> bool:  # whether ``takes`` accepts the attention with K and V of heads_kv heads
        stand_ins = [
            _stand_in(t, shape)
            for t, shape in ((q, (b, s_q, h, d)), (k, (b, s_k, heads_kv, d)), (v, (b, s_k, heads_kv, dv)))
        ]
        bias_stand_in = None
        if bias is not None:
            bias_stand_in = relax.Var(
                "t", relax.TensorStructInfo(_relax_shape(bias_shape), *bias_dtype or [_dtype(bias)])
            )
        causal_mask = "TopLeft" if causal else None
        call = relax.op.nn.attention(*stand_ins, bias_stand_in, scale=scale, causal_mask=causal_mask)
        return takes(relax.BlockBuilder().normalize(call))

    # K and V repeated per kv head (HF's repeat_kv): grouped-query attention on the kv heads, only
    # where Tessera's kernel takes it, as TVM's own attention pairs the heads differently.
    grouped = _unrepeated(k, bindings), _unrepeated(v, bindings)
    if h_kv != h:  # one kv head: multi-query attention, or the head broadcast for TVM
        if takes is None or not taken(h_kv):
            if checked and takes is not None and not taken(h):
                return None
            k, v = (relax.op.broadcast_to(t, _relax_shape((b, h, *_shape(t)[2:]))) for t in (k, v))
    elif None not in grouped and grouped[0][1] == grouped[1][1] and takes is not None and taken(grouped[0][1]):
        (k, _), (v, _) = grouped
    elif checked and takes is not None and not taken(h):
        return None

    def bshd(t):  # [B, H, S, D] -> [B, S, H, D]; the permute undone when it was one
        value = bindings.get(t, t)
        if isinstance(value, relax.Call) and value.op.name == "relax.permute_dims":
            if [int(a) for a in value.attrs.axes] == [0, 2, 1, 3]:
                return value.args[0]
        return relax.op.permute_dims(t, [0, 2, 1, 3])

    attention = relax.op.nn.attention(
        bshd(q), bshd(k), bshd(v), bias, scale=scale, causal_mask="TopLeft" if causal else None
    )
    return relax.op.permute_dims(attention, [0, 2, 1, 3])


def _dtype(expr) -> str:
    return str(expr.struct_info.dtype)


def _unrepeated(t, bindings) -> tuple[Any, Any] | None:
    """``(x, H_kv)`` when ``t`` [B, H, S, D] is ``x`` [B, H_kv, S, D] with each head repeated H / H_kv
    times in a row (HF's ``repeat_kv``, ``repeat_interleave`` along the heads): ``reshape(
    broadcast_to(expand_dims(x, axis=2), [B, H_kv, n, S, D]), [B, H_kv * n, S, D])``, so that query
    head h reads kv head h // n as in Tessera's grouped-query attention. None for anything else (heads
    tiled as kv0, kv1, kv0, kv1 among them)."""
    merged = bindings.get(t, t)
    if not (isinstance(merged, relax.Call) and merged.op.name == "relax.reshape"):
        return None
    spread = bindings.get(merged.args[0], merged.args[0])
    if not (isinstance(spread, relax.Call) and spread.op.name == "relax.broadcast_to"):
        return None
    unsqueezed = bindings.get(spread.args[0], spread.args[0])
    if not (isinstance(unsqueezed, relax.Call) and unsqueezed.op.name == "relax.expand_dims"):
        return None
    x = unsqueezed.args[0]
    shapes = [_shape(e) for e in (x, unsqueezed, spread, merged)]
    if any(s is None for s in shapes) or len(shapes[0]) != 4:
        return None
    (b, h_kv, s, d), new_axis, repeated, out = shapes
    if [int(a) % 5 for a in unsqueezed.attrs.axis] != [2] or new_axis != (b, h_kv, 1, s, d):
        return None
    n = repeated[2]
    if repeated != (b, h_kv, n, s, d) or not isinstance(n, int) or out != (b, h_kv * n, s, d):
        return None
    return x, h_kv


def _casts_kept_to(dtype: str, orig, m, p, *tensors) -> bool:
    """Whether the matched attention computes in q's ``dtype`` but for its casts: each matmul's f32
    product cast back to ``dtype`` (how a half-precision matmul imports) and the softmax either in
    ``dtype`` or in float32 between a cast from ``dtype`` and one back (HF's ``softmax(w,
    dtype=torch.float32).to(q.dtype)``). Tessera's kernel computes scores and softmax in float32 and
    its result in ``dtype``, so dropping these casts only drops roundings; any other cast (a softmax
    in float16 in a bfloat16 model) is not rewritten."""
    if any(_dtype(t) != dtype for t in (*tensors, orig)):
        return False
    for cast in ("product_cast", "out_cast"):
        if p[cast] in m and _dtype(m[p[cast]]) != dtype:
            return False
    if (p["upcast"] in m) != (p["downcast"] in m):
        return False
    if p["upcast"] not in m:
        return _dtype(m[p["probs"]]) == dtype
    upcast, downcast = m[p["upcast"]], m[p["downcast"]]
    return _dtype(upcast.args[0]) == dtype and _dtype(upcast) == "float32" and _dtype(downcast) == dtype


def _as_bias(mask, full: tuple) -> tuple[Any, tuple] | None:
    """``mask`` (added to the scores [B, H, S_q, S_kv]) as Relax attention's bias and its shape: 4-D,
    each dim 1 or the scores', the keys' not broadcast (a lower rank gets leading 1s); None when it
    is not one."""
    shape = _shape(mask)
    if shape is None or len(shape) > 4 or not str(mask.struct_info.dtype).startswith(("float", "bfloat")):
        return None
    shape = (1,) * (4 - len(shape)) + shape
    if shape[-1] != full[-1] or any(d != 1 and d != f for d, f in zip(shape, full, strict=True)):
        return None
    return (mask if len(_shape(mask)) == 4 else relax.op.reshape(mask, _relax_shape(shape))), shape


def _stand_in(expr, shape) -> Any:
    """A Var of ``expr``'s dtype and ``shape`` (a :func:`_shape` tuple)."""
    return relax.Var("t", relax.TensorStructInfo(_relax_shape(shape), str(expr.struct_info.dtype)))


def _causal(mask: np.ndarray, s_q: int, s_k: int) -> bool | None:
    """True for torch's causal mask (0 at or below the diagonal, -inf above), False for all zeros,
    None for any other mask (not rewritten)."""
    if not (isinstance(s_q, int) and isinstance(s_k, int)):
        return None  # a dynamic sequence length: the mask cannot be checked by evaluating it
    try:
        full = np.broadcast_to(mask, mask.shape[:-2] + (s_q, s_k))
    except ValueError:
        return None
    if np.all(full == 0):
        return False
    rows, cols = np.indices((s_q, s_k))
    want = np.where(cols <= rows, 0.0, -np.inf)
    return True if np.all(full == want) else None


def _is_empty_row_guard(guard, zeros, scores, bindings) -> bool:
    """``where(guard, zeros, probs)`` as torch writes its guard for rows whose every score is
    masked: ``zeros`` zeros, and ``guard`` = not(any(scores != -inf)) along the row, spelled with
    logical_not, astype and max around ``equal(scores, -inf)``."""
    value = bindings.get(zeros, zeros)
    if isinstance(value, relax.Constant):
        if not np.all(value.data.numpy() == 0):
            return False
    elif not (
        isinstance(value, relax.Call)
        and (
            value.op.name == "relax.zeros_like"
            or (value.op.name == "relax.full_like" and _scalar_of(value.args[1]) == 0)
        )
    ):
        return False
    node, ops = bindings.get(guard, guard), []
    while isinstance(node, relax.Call) and node.op.name in ("relax.logical_not", "relax.astype", "relax.max"):
        ops.append(node.op.name)
        node = bindings.get(node.args[0], node.args[0])
    if ops.count("relax.logical_not") != 2 or "relax.max" not in ops:
        return False
    if not (isinstance(node, relax.Call) and node.op.name == "relax.equal"):
        return False
    compared = node.args[0]
    if not (compared.same_as(scores) or bindings.get(compared, compared).same_as(bindings.get(scores, scores))):
        return False
    limit = _scalar_of(node.args[1])
    return limit is not None and limit == -np.inf


def _holds(const, value: float) -> bool:
    """Whether the scalar ``const`` is ``value``: within 1e-6 of it, or ``value`` rounded to the
    constant's dtype (a Python number in a float16 or bfloat16 model is imported in that dtype:
    GPT-2's 0.044715 as 0.044677734375 in bfloat16)."""
    got = _scalar(const)
    if got is None:
        return False
    rounded = float(np.asarray(value, dtype=const.data.numpy().dtype))
    return abs(got - value) <= 1e-6 * max(1.0, abs(value)) or got == rounded


def _scalar_of(expr) -> float | None:
    return _scalar(expr) if isinstance(expr, relax.Constant) else None


# ---------------------------------------------------------------------------------------------
# Evaluating a mask built from constants
# ---------------------------------------------------------------------------------------------

_BINARY = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.less": np.less,
    "relax.less_equal": np.less_equal,
    "relax.greater": np.greater,
    "relax.greater_equal": np.greater_equal,
    "relax.equal": np.equal,
    "relax.not_equal": np.not_equal,
    "relax.logical_and": np.logical_and,
    "relax.logical_or": np.logical_or,
}


def _evaluate(expr, bindings, depth: int = 0) -> np.ndarray | None:
    """The value of ``expr`` when it is built from constants with the ops masks are built with
    (arange, full, comparisons, where, ...); None otherwise."""
    if depth > 64:
        return None
    if isinstance(expr, relax.Var) and expr in bindings:
        return _evaluate(bindings[expr], bindings, depth + 1)
    if isinstance(expr, relax.Constant):
        return expr.data.numpy()
    if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
        return None
    name, args = expr.op.name, expr.args

    def arg(i):
        return _evaluate(args[i], bindings, depth + 1)

    def ints(values):
        return [int(x) for x in values]

    if name in _BINARY:
        a, b = arg(0), arg(1)
        return None if a is None or b is None else _BINARY[name](a, b)
    if name == "relax.logical_not":
        a = arg(0)
        return None if a is None else np.logical_not(a)
    if name == "relax.where":
        c, a, b = arg(0), arg(1), arg(2)
        return None if c is None or a is None or b is None else np.where(c, a, b)
    if name == "relax.arange":
        start, end, step = (_prim(a) for a in args[:3])
        if None in (start, end, step):
            return None
        return np.arange(start, end, step)
    if name == "relax.full":
        value = arg(1)
        shape = _shape_value(args[0])
        return None if value is None or shape is None else np.full(shape, value)
    if name == "relax.expand_dims":
        a = arg(0)
        if a is None:
            return None
        for axis in sorted(ints(expr.attrs.axis), key=lambda x: x % (a.ndim + 1)):
            a = np.expand_dims(a, axis)
        return a
    if name in ("relax.broadcast_to", "relax.reshape"):
        a, shape = arg(0), _shape_value(args[1])
        if a is None or shape is None:
            return None
        return np.broadcast_to(a, shape) if name == "relax.broadcast_to" else a.reshape(shape)
    if name == "relax.astype":
        a = arg(0)
        return None if a is None else a.astype(str(expr.attrs.dtype))
    return None


# ---------------------------------------------------------------------------------------------
# Proving a mask of a dynamic shape causal
# ---------------------------------------------------------------------------------------------


class _Lazy:
    """A tensor built from shapes, as its dims (TIR expressions) and its element at an index (a TIR
    expression of the index): how a mask of a dynamic shape is read without evaluating it."""

    def __init__(self, shape, at) -> None:
        self.shape = tuple(shape)
        self.at = at  # list of index expressions, one per dim -> the element


def _is_one(dim) -> bool:
    return isinstance(dim, tvm.tirx.IntImm) and int(dim) == 1


def _broadcast(*tensors: _Lazy) -> tuple[tuple, list]:
    """numpy broadcasting of ``tensors``: the result's dims, and per tensor the index mapping
    (result index -> its index: leading dims dropped, 0 on its dims of extent 1)."""
    rank = max(len(t.shape) for t in tensors)
    dims = []
    for axis in range(rank):
        sizes = [t.shape[axis - rank + len(t.shape)] for t in tensors if axis - rank + len(t.shape) >= 0]
        wide = [d for d in sizes if not _is_one(d)]
        dims.append(wide[0] if wide else sizes[0])

    def mapping(t: _Lazy):
        lead = rank - len(t.shape)
        return lambda index: [
            tvm.tirx.IntImm(index[lead + a].dtype, 0) if _is_one(d) else index[lead + a] for a, d in enumerate(t.shape)
        ]

    return tuple(dims), [mapping(t) for t in tensors]


_TIR_BINARY = {
    "relax.add": lambda a, b: a + b,
    "relax.subtract": lambda a, b: a - b,
    "relax.multiply": lambda a, b: a * b,
    "relax.less": lambda a, b: a < b,
    "relax.less_equal": lambda a, b: a <= b,
    "relax.greater": lambda a, b: a > b,
    "relax.greater_equal": lambda a, b: a >= b,
    "relax.equal": lambda a, b: tvm.tirx.EQ(a, b),
    "relax.not_equal": lambda a, b: tvm.tirx.NE(a, b),
    "relax.logical_and": lambda a, b: tvm.tirx.And(a, b),
    "relax.logical_or": lambda a, b: tvm.tirx.Or(a, b),
}


def _lazy(expr, bindings, depth: int = 0) -> _Lazy | None:
    """``expr`` as a :class:`_Lazy` when it is built with the ops masks are built with (arange,
    full, comparisons, where, ...) from scalar constants and shapes; None otherwise."""
    if depth > 64:
        return None
    if isinstance(expr, relax.Var) and expr in bindings:
        return _lazy(bindings[expr], bindings, depth + 1)
    if isinstance(expr, relax.Constant):
        value = expr.data.numpy()
        if value.size != 1:
            return None
        element = tvm.tirx.const(value.reshape(()).item(), str(value.dtype))
        return _Lazy((tvm.tirx.IntImm("int64", 1),) * value.ndim, lambda index: element)
    if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
        return None
    name, args = expr.op.name, expr.args
    if name in _TIR_BINARY or name == "relax.where":
        operands = [_lazy(a, bindings, depth + 1) for a in args]
        if None in operands:
            return None
        dims, maps = _broadcast(*operands)
        parts = list(zip(operands, maps, strict=True))
        if name == "relax.where":
            return _Lazy(dims, lambda index: tvm.tirx.Select(*(t.at(f(index)) for t, f in parts)))
        combine = _TIR_BINARY[name]
        return _Lazy(dims, lambda index: combine(*(t.at(f(index)) for t, f in parts)))
    if name == "relax.logical_not":
        a = _lazy(args[0], bindings, depth + 1)
        return None if a is None else _Lazy(a.shape, lambda index: tvm.tirx.Not(a.at(index)))
    if name == "relax.arange":
        start, end, step = (_prim_expr(a) for a in args[:3])
        if start is None or end is None or step is None or not isinstance(step, tvm.tirx.IntImm) or int(step) != 1:
            return None
        return _Lazy((end - start,), lambda index: start + index[0])
    if name == "relax.full":
        value = _lazy(args[1], bindings, depth + 1)
        if value is None or not isinstance(args[0], relax.ShapeExpr) or value.shape:
            return None
        return _Lazy(args[0].values, lambda index: value.at([]))
    if name == "relax.expand_dims":
        a = _lazy(args[0], bindings, depth + 1)
        if a is None:
            return None
        rank = len(a.shape) + len(expr.attrs.axis)
        new = {int(x) % rank for x in expr.attrs.axis}
        kept = [axis for axis in range(rank) if axis not in new]
        dims, source = [], iter(a.shape)
        for axis in range(rank):
            dims.append(tvm.tirx.IntImm("int64", 1) if axis in new else next(source))
        return _Lazy(dims, lambda index: a.at([index[axis] for axis in kept]))
    if name == "relax.broadcast_to":
        a = _lazy(args[0], bindings, depth + 1)
        if a is None or not isinstance(args[1], relax.ShapeExpr):
            return None
        target = _Lazy(args[1].values, lambda index: None)
        dims, (mapping, _) = _broadcast(a, target)
        return _Lazy(dims, lambda index: a.at(mapping(index)))
    return None


def _prim_expr(expr):
    """The TIR value of a PrimValue (an int or a symbolic dim), else None."""
    return expr.value if isinstance(expr, relax.PrimValue) else None


def _causal_symbolic(mask, bindings, s_q, s_k) -> bool | None:
    """:func:`_causal` for a mask whose shape is dynamic: True when TVM's arithmetic proves the mask
    0 for every key at or before its query and -inf after it, False when it proves it 0 everywhere,
    None otherwise (not rewritten)."""
    lazy = _lazy(mask, bindings)
    if lazy is None or len(lazy.shape) < 2:
        return None
    s_q, s_k = (d.expr if isinstance(d, _Sym) else tvm.tirx.IntImm("int64", d) for d in (s_q, s_k))
    analyzer = tvm.arith.Analyzer()
    for dim, extent in zip(lazy.shape[-2:], (s_q, s_k), strict=True):
        if not (_is_one(dim) or analyzer.can_prove_equal(dim, extent)):
            return None
    index = [tvm.tirx.Var(f"i{axis}", "int64") for axis in range(len(lazy.shape))]
    for var, extent in zip(index, (*lazy.shape[:-2], s_q, s_k), strict=True):
        analyzer.bind(var, tvm.ir.Range.from_min_extent(tvm.tirx.IntImm("int64", 0), extent))
    value = lazy.at(
        [i if not _is_one(d) else tvm.tirx.IntImm("int64", 0) for i, d in zip(index, lazy.shape, strict=True)]
    )
    query, key = index[-2], index[-1]
    # The key as the query minus a distance >= 0 (visible) or plus one and a distance (hidden): the
    # query cancels out of the mask's comparisons, and the distance's bound decides them.
    distance = tvm.tirx.Var("distance", "int64")
    analyzer.bind(distance, tvm.ir.Range.from_min_extent(tvm.tirx.IntImm("int64", 0), s_k))

    def is_(expr, constant: float, key_at=None) -> bool:
        if key_at is not None:
            expr = tvm.tirx.stmt_functor.substitute(expr, {key: key_at})
        expr = analyzer.simplify(expr)
        return isinstance(expr, tvm.tirx.FloatImm) and float(expr.value) == constant

    if is_(value, 0.0):
        return False
    visible = is_(value, 0.0, query - distance)
    hidden = is_(value, -np.inf, query + 1 + distance)
    return True if visible and hidden else None


def _prim(expr) -> int | None:
    if isinstance(expr, relax.PrimValue) and isinstance(expr.value, tvm.tirx.IntImm):
        return int(expr.value)
    return None


def _shape_value(expr) -> tuple[int, ...] | None:
    if isinstance(expr, relax.ShapeExpr) and all(isinstance(d, tvm.tirx.IntImm) for d in expr.values):
        return tuple(int(d) for d in expr.values)
    return None


# ---------------------------------------------------------------------------------------------
# Element-wise ops moved in front of a reshape
# ---------------------------------------------------------------------------------------------

#: Element-wise ops a GEMM epilogue can take, which commute with any reshape.
#: A cast sinks too: a half-precision model computes its activation in float32 between two casts
#: (``astype(f32)``, SiLU, ``astype(bf16)`` after the linear's reshape back to 3-D).
_UNARY = (*(f"relax.{op.relax}" for op in op_table.UNARY if op.sinks_reshape and op.relax), "relax.astype")
_BINARY_EPILOGUE = ("relax.add", "relax.multiply")


def sink_reshapes(mod) -> tuple[Any, int]:
    """``op(reshape(x))`` -> ``reshape(op(x))`` for a 2-D ``x`` (a linear on a 3-D input is imported
    as reshape, 2-D matmul + bias, reshape back), so that the GELU or the residual add after it meets
    the matmul and fuses as its epilogue. A binary op's other operand must have the reshaped shape
    (it is reshaped too) or broadcast along the last dim only, which the reshape keeps."""
    reshape = dpl.is_op("relax.reshape")(dpl.wildcard(), dpl.wildcard())
    other = dpl.wildcard()
    unary = dpl.is_op(_UNARY[0])(reshape)
    for name in _UNARY[1:]:
        unary = unary | dpl.is_op(name)(reshape)
    binary = None
    for name in _BINARY_EPILOGUE:
        for pattern in (dpl.is_op(name)(reshape, other), dpl.is_op(name)(other, reshape)):
            binary = pattern if binary is None else binary | pattern
    # x * sigmoid(beta x) (quick GELU), x read twice: moved whole
    beta = dpl.is_const()
    gate = dpl.is_op("relax.sigmoid")(_either("relax.multiply", reshape, beta))
    swish = _either("relax.multiply", reshape, gate)

    def rewrite(orig, matched, bindings):
        inner = matched[reshape]
        x = inner.args[0]
        x_shape, out_shape = _shape(x), _shape(orig)
        if x_shape is None or out_shape is None or len(x_shape) != 2 or len(out_shape) < 3:
            return None
        if x_shape[-1] != out_shape[-1]:
            return None  # the reshape must keep the last dim (a linear's output features)
        if _shape(inner) != out_shape:
            return None  # the reshaped operand is broadcast (BERT's [1, S, D] position embeddings)
        if gate in matched:
            c = _scalar(matched[beta])
            op = None if c is None else op_table.swish_op(c)
            if op is None or not op.sinks_reshape:
                return None
            new = relax.op.multiply(x, relax.op.sigmoid(relax.op.multiply(x, matched[beta])))
        elif len(orig.args) == 1:
            new = relax.Call(orig.op, [x], orig.attrs)
        else:
            r = matched[other]
            r_shape = _shape(r)
            if r_shape is None:
                return None
            if r_shape == out_shape:
                r = relax.op.reshape(r, _relax_shape(x_shape))
            elif not (len(r_shape) >= 1 and r_shape[-1] == x_shape[-1] and all(d == 1 for d in r_shape[:-1])):
                return None
            elif len(r_shape) > 2:
                r = relax.op.reshape(r, (x_shape[-1],))
            first = orig.args[0]
            args = [x, r] if bindings.get(first, first).same_as(inner) else [r, x]
            new = relax.Call(orig.op, args, orig.attrs)
        return relax.op.reshape(new, _relax_shape(out_shape))

    return rewrite_functions(mod, swish | unary | binary, rewrite, rounds=4)  # a unary op, then the add after it


# ---------------------------------------------------------------------------------------------
# RMSNorm and SiLU written out
# ---------------------------------------------------------------------------------------------


def _either(op: str, a, b):
    return dpl.is_op(op)(a, b) | dpl.is_op(op)(b, a)


def recover_rms_norm(mod) -> tuple[Any, int]:
    """``x * rsqrt(mean(x^2, -1) + eps) * w`` (by hand, or torch.nn.RMSNorm decomposed) ->
    ``R.nn.rms_norm(x, w, axes=[-1], epsilon=eps)``. A cast to x's own dtype before the weight is
    allowed: transformers' RMSNorms (LLaMA, Qwen, Mistral) cast back to the input's dtype, which a
    float32 model imported without decomposition keeps as ``astype`` to float32."""
    x, w, eps, two = dpl.wildcard(), dpl.wildcard(), dpl.is_const(), dpl.is_const()
    square = dpl.is_op("relax.power")(x, two) | dpl.is_op("relax.multiply")(x, x)
    mean = dpl.is_op("relax.mean")(square)
    inverse = dpl.is_op("relax.rsqrt")(_either("relax.add", mean, eps))
    normed = _either("relax.multiply", x, inverse)
    pattern = _either("relax.multiply", normed | dpl.is_op("relax.astype")(normed), w)  # the dtype check below

    def rewrite(orig, m, bindings):
        data, weight = m[x], m[w]
        shape, w_shape = _shape(data), _shape(weight)
        if shape is None or w_shape != shape[-1:]:
            return None
        if two in m and _scalar(m[two]) != 2.0:
            return None
        axes = [int(a) for a in m[mean].attrs.axis] if m[mean].attrs.axis is not None else []
        if axes not in ([-1], [len(shape) - 1]) or not bool(m[mean].attrs.keepdims):
            return None
        epsilon = _scalar(m[eps])
        dtypes = {str(t.struct_info.dtype) for t in (data, weight, orig)}
        if epsilon is None or len(dtypes) != 1:
            return None
        return relax.op.nn.rms_norm(data, weight, axes=[-1], epsilon=epsilon)

    return rewrite_functions(mod, pattern, rewrite)


def recover_silu(mod) -> tuple[Any, int]:
    """``x * sigmoid(x)`` -> ``R.nn.silu(x)`` (torch's decomposition of SiLU), so a GEMM takes it
    as its epilogue."""
    x = dpl.wildcard()
    pattern = _either("relax.multiply", x, dpl.is_op("relax.sigmoid")(x))
    return rewrite_functions(mod, pattern, lambda orig, m, bindings: relax.op.nn.silu(m[x]))


def recover_gelu_tanh(mod) -> tuple[Any, int]:
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`` (GPT-2's ``gelu_new``, and
    transformers' ``NewGELUActivation`` and ``gelu_pytorch_tanh`` written out) -> ``R.nn.gelu_tanh(x)``,
    so that a GEMM takes it as its epilogue instead of TVM computing ``power`` and Tessera two
    element-wise kernels. ``x**3`` as ``power(x, 3)`` or ``x * x * x``; each product and sum in
    either order; the constants within 1e-6 of their values, or their values rounded to a half-precision
    model's dtype (:func:`_holds`)."""
    x = dpl.wildcard()
    three, a, s, one, half = (dpl.is_const() for _ in range(5))
    square = _either("relax.multiply", x, x)
    cube = dpl.is_op("relax.power")(x, three) | _either("relax.multiply", square, x)
    inner = _either("relax.add", x, _either("relax.multiply", cube, a))
    t = dpl.is_op("relax.tanh")(_either("relax.multiply", inner, s))
    one_plus = _either("relax.add", t, one)
    pattern = _either("relax.multiply", _either("relax.multiply", x, half), one_plus) | _either(
        "relax.multiply", x, _either("relax.multiply", one_plus, half)
    )
    want = {three: 3.0, a: 0.044715, s: math.sqrt(2.0 / math.pi), one: 1.0, half: 0.5}

    def rewrite(orig, m, bindings):
        if any(const in m and not _holds(m[const], value) for const, value in want.items()):
            return None
        if str(m[x].struct_info.dtype) != str(orig.struct_info.dtype):
            return None
        return relax.op.nn.gelu_tanh(m[x])

    return rewrite_functions(mod, pattern, rewrite)


# ---------------------------------------------------------------------------------------------
# Inference batch norms folded into the convolution before them
# ---------------------------------------------------------------------------------------------


def fold_batch_norms(mod) -> tuple[Any, int]:
    """tessera_tvm.relax_rewrites.fold_batch_norms in TileLang's TVM."""
    return relax_rewrites.fold_batch_norms(mod, tvm)


def fold_constant_slices(mod) -> tuple[Any, int]:
    """tessera_tvm.relax_rewrites.fold_constant_slices in TileLang's TVM."""
    return relax_rewrites.fold_constant_slices(mod, tvm)
