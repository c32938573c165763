"""The Tessera op set.

Inside a ``@tessera.kernel`` body the ops record Graph IR (a Relax function); on numpy arrays they
run their reference semantics (:mod:`tessera.reference`, the definition of what each op computes).
Python operators ``+ - * / @`` and unary ``-`` on traced tensors are these ops, with numpy
broadcasting. Every op checks its operands and reports a mistake at the caller's line:

    linear.py:12: ops.matmul: A is [M, K] = [128, 64] but W is [K, N] = [32, 256]; K differs (64 vs 32)

Shapes: names are symbolic dims, ints literal; dims that must match need the same name (or equal
values once shapes are bound); a literal 1 broadcasts. Dtypes: both operands of a binary op share
one dtype (Python numbers take the tensor's dtype); float ops reject integer tensors.
"""

from __future__ import annotations

import builtins
import math
from typing import Any

from tessera_tvm import op_table

from . import reference
from .errors import DTypeError, KernelError, ShapeError
from .reference import wrap
from .tracing import (
    Dim,
    TracedTensor,
    as_dtype_arg,
    broadcast_dims,
    current_trace,
    describe,
    differs,
    dims_agree,
    is_traced,
    normalize_axis,
    require_float,
    require_rank,
    require_same_dtype,
    require_tensor,
    same_symbol,
    tensor_name,
)
from .types import DType, f32, int32

__all__ = [
    "add",
    "sub",
    "mul",
    "div",
    "neg",
    "cast",
    "relu",
    "clip",
    "gelu",
    "silu",
    "sigmoid",
    "exp",
    "tanh",
    "scale",
    "matmul",
    "softmax",
    "layer_norm",
    "rms_norm",
    "sum",
    "max",
    "mean",
    "flash_attention",
]


def _trace(op: str):
    trace = current_trace()
    if trace is None:
        raise KernelError(
            "traced tensors exist only while their kernel is traced; call ops inside a @tessera.kernel body", op=op
        )
    return trace


def _label(op: str, *args: Any) -> str:
    names = ", ".join(tensor_name(a) if isinstance(a, TracedTensor) else repr(a) for a in args)
    text = f"{op}({names})"
    return text if len(text) <= 48 else f"{op}(...)"


# ---------------------------------------------------------------------------------------------
# Element-wise
# ---------------------------------------------------------------------------------------------

#: ``"ops.add"`` -> (graph op, reference), from the op table.
_BINARY = {
    f"ops.{op.frontend}": (op.graph_op, getattr(reference, op.reference)) for op in op_table.BINARY if op.frontend
}


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _binary(op: str, a: Any, b: Any) -> Any:
    graph_op, ref = _BINARY[op]
    if not is_traced(a, b):
        return wrap(ref(a, b))
    trace = _trace(op)
    for x, what in ((a, "left operand"), (b, "right operand")):
        if not isinstance(x, TracedTensor) and not _is_number(x):
            raise KernelError(f"{what} is {type(x).__name__} {x!r}; expected a tensor or a Python number", op=op)
    if isinstance(a, TracedTensor) and isinstance(b, TracedTensor):
        dtype = require_same_dtype(op, a, b)
        dims = broadcast_dims(op, a, b)
        inputs = [a, b]
    else:
        t = a if isinstance(a, TracedTensor) else b
        number = b if t is a else a
        dtype, dims = t.dtype, t.dims
        if dtype.name.startswith("fp8"):
            raise DTypeError(
                f"{tensor_name(t)} is {dtype}; fp8 tensors take no Python-number operands, cast to "
                f"ts.f16 or ts.f32 first (ops.cast({tensor_name(t)}, ts.f32))",
                op=op,
            )
        if not dtype.is_float and isinstance(number, float) and not float(number).is_integer():
            raise DTypeError(
                f"{tensor_name(t)} is {dtype} but the number is {number!r}; cast the tensor to a float dtype first",
                op=op,
            )
        const = trace.constant(number, dtype)
        inputs = [a, const] if t is a else [const, b]
    if op == "ops.div" and not dtype.is_float:
        raise DTypeError(f"{dtype} division: ops.div needs floating-point operands (cast first)", op=op)
    return trace.emit(op, graph_op, inputs, dims, dtype, _label(op[4:], a, b))


def add(a, b):
    """``a + b`` with numpy broadcasting (reference: :func:`tessera.reference.add`)."""
    return _binary("ops.add", a, b)


def sub(a, b):
    """``a - b`` with numpy broadcasting (reference: :func:`tessera.reference.sub`)."""
    return _binary("ops.sub", a, b)


def mul(a, b):
    """``a * b`` with numpy broadcasting (reference: :func:`tessera.reference.mul`)."""
    return _binary("ops.mul", a, b)


def div(a, b):
    """``a / b`` with numpy broadcasting, floats only (reference: :func:`tessera.reference.div`)."""
    return _binary("ops.div", a, b)


def _unary(op: str, graph_op: str, x: Any, ref, *, float_only: bool = True, **ref_kwargs):
    if not is_traced(x):
        return wrap(ref(x, **ref_kwargs))
    trace = _trace(op)
    x = require_tensor(op, "x", x)
    if float_only:
        require_float(op, x)
    return trace.emit(op, graph_op, [x], x.dims, x.dtype, _label(op[4:], x))


def neg(x):
    """``-x`` (reference: :func:`tessera.reference.neg`)."""
    return _unary("ops.neg", "negative", x, reference.neg, float_only=False)


def relu(x):
    """``max(x, 0)`` (reference: :func:`tessera.reference.relu`)."""
    return _unary("ops.relu", "relu", x, reference.relu)


def gelu(x, approximate: str = "none"):
    """GELU, ``x * Phi(x)`` with the erf form (``approximate="none"``) or the tanh form
    (``approximate="tanh"``) (reference: :func:`tessera.reference.gelu`)."""
    if approximate not in ("none", "tanh"):
        raise KernelError(f"approximate is {approximate!r}; expected 'none' (erf) or 'tanh'", op="ops.gelu")
    graph_op = "gelu" if approximate == "none" else "gelu_tanh"
    return _unary("ops.gelu", graph_op, x, reference.gelu, approximate=approximate)


def silu(x):
    """``x * sigmoid(x)`` (reference: :func:`tessera.reference.silu`)."""
    return _unary("ops.silu", "silu", x, reference.silu)


def sigmoid(x):
    """``1 / (1 + exp(-x))`` (reference: :func:`tessera.reference.sigmoid`)."""
    return _unary("ops.sigmoid", "sigmoid", x, reference.sigmoid)


def exp(x):
    """``e ** x`` (reference: :func:`tessera.reference.exp`)."""
    return _unary("ops.exp", "exp", x, reference.exp)


def tanh(x):
    """``tanh(x)`` (reference: :func:`tessera.reference.tanh`)."""
    return _unary("ops.tanh", "tanh", x, reference.tanh)


def clip(x, lo: float | None = None, hi: float | None = None):
    """``min(max(x, lo), hi)`` for Python numbers ``lo`` <= ``hi`` (either may be None: no bound), as
    torch.clamp; ``clip(x, 0, 6)`` is ReLU6. After a matmul it is a step of the GEMM's epilogue
    (reference: :func:`tessera.reference.clip`)."""
    op = "ops.clip"
    for name, bound in (("lo", lo), ("hi", hi)):
        if bound is not None and not _is_number(bound):
            raise KernelError(f"{name} is {type(bound).__name__} {bound!r}; expected a Python number or None", op=op)
        if bound is not None and math.isnan(bound):  # the kernels' compares would drop it; torch gives all NaN
            raise KernelError(f"{name} is NaN; expected a number or None (torch.clamp makes every element NaN)", op=op)
    if lo is None and hi is None:
        raise KernelError("clip needs lo, hi or both", op=op)
    if lo is not None and hi is not None and lo > hi:
        raise KernelError(f"lo={lo!r} is above hi={hi!r}", op=op)
    if not is_traced(x):
        return wrap(reference.clip(x, lo, hi))
    trace = _trace(op)
    x = require_tensor(op, "x", x)
    require_float(op, x)
    lo = -math.inf if lo is None else float(lo)
    hi = math.inf if hi is None else float(hi)
    return trace.emit(op, "clip", [x], x.dims, x.dtype, _label("clip", x), lo=lo, hi=hi)


def scale(x, s: float):
    """``x * s`` for a Python number ``s`` (reference: :func:`tessera.reference.scale`)."""
    op = "ops.scale"
    if not _is_number(s):
        raise KernelError(f"s is {type(s).__name__} {s!r}; expected a Python number (use ops.mul for tensors)", op=op)
    if not is_traced(x):
        return wrap(reference.scale(x, s))
    trace = _trace(op)
    x = require_tensor(op, "x", x)
    require_float(op, x)
    return trace.emit(op, "multiply", [x, trace.constant(float(s), x.dtype)], x.dims, x.dtype, _label("scale", x, s))


def cast(x, dtype):
    """``x`` converted to ``dtype`` (reference: :func:`tessera.reference.cast`)."""
    op = "ops.cast"
    target = as_dtype_arg(op, dtype)
    if not is_traced(x):
        return wrap(reference.cast(x, target))
    trace = _trace(op)
    x = require_tensor(op, "x", x)
    return trace.emit(op, "astype", [x], x.dims, target, _label("cast", x, target), dtype=target.tvm)


# ---------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------


def _matmul_dtypes(op: str, dtype: DType, accumulate, out_dtype) -> tuple[DType, DType]:
    acc = as_dtype_arg(op, accumulate) if accumulate is not None else (f32 if dtype.is_float else int32)
    if acc.name not in ("f32", "f16", "int32"):
        raise DTypeError(
            f"accumulate is {acc}; expected ts.f32 (or ts.f16 for float inputs, ts.int32 for integer inputs)", op=op
        )
    if acc.is_float != dtype.is_float:
        raise DTypeError(
            f"accumulate is {acc} but the operands are {dtype}; use {'ts.f32' if dtype.is_float else 'ts.int32'}", op=op
        )
    if out_dtype is not None:
        return acc, as_dtype_arg(op, out_dtype)
    return acc, dtype if dtype.name in ("f32", "f16", "bf16") else acc


def matmul(a, b, *, transpose_a: bool = False, transpose_b: bool = False, accumulate=None, out_dtype=None):
    """Matrix product over the last two axes: ``[..., M, K] @ [..., K, N] -> [..., M, N]``.

    Batch axes broadcast (numpy rules). ``transpose_a`` / ``transpose_b`` read an operand as its
    transpose (``[..., K, M]`` / ``[..., N, K]``). Products are accumulated in ``accumulate``
    (default float32; int32 for integer inputs) and rounded to ``out_dtype`` (default: the input
    dtype for f32/f16/bf16, the accumulate dtype for fp8/int8). Reference:
    :func:`tessera.reference.matmul`.
    """
    op = "ops.matmul"
    if not is_traced(a, b):
        return wrap(
            reference.matmul(
                a, b, transpose_a=transpose_a, transpose_b=transpose_b, accumulate=accumulate, out_dtype=out_dtype
            )
        )
    trace = _trace(op)
    a = require_tensor(op, "A", a)
    b = require_tensor(op, "B", b)
    for t in (a, b):
        if t.ndim < 2:
            raise ShapeError(f"{describe(t)} (rank {t.ndim}); matmul needs rank >= 2 ([..., rows, cols])", op=op)
    dtype = require_same_dtype(op, a, b)
    acc, out = _matmul_dtypes(op, dtype, accumulate, out_dtype)
    m, ka = (a.dims[-1], a.dims[-2]) if transpose_a else (a.dims[-2], a.dims[-1])
    kb, n = (b.dims[-1], b.dims[-2]) if transpose_b else (b.dims[-2], b.dims[-1])
    if dims_agree(ka, kb) is False:
        raise ShapeError(f"{describe(a)} but {describe(b)}; {differs(ka, kb)}", op=op)
    batch = _broadcast_batch(op, a, b)
    dims = (*batch, m, n)
    label = _label("matmul", a, b)
    result = trace.emit(
        op, "matmul", [a, b], dims, acc, label, out_dtype=acc.tvm, transpose_a=transpose_a, transpose_b=transpose_b
    )
    if out != acc:
        result = trace.emit(op, "astype", [result], dims, out, label, dtype=out.tvm)
    return result


def _broadcast_batch(op: str, a: TracedTensor, b: TracedTensor) -> tuple[Dim, ...]:
    ba, bb = a.dims[:-2], b.dims[:-2]
    n = builtins.max(len(ba), len(bb))
    ba = (None,) * (n - len(ba)) + ba
    bb = (None,) * (n - len(bb)) + bb
    out = []
    for i, (x, y) in enumerate(zip(ba, bb, strict=True)):
        if x is None or (x.name is None and x.value == 1 and y is not None):
            out.append(y)
        elif y is None or (y.name is None and y.value == 1):
            out.append(x)
        elif dims_agree(x, y) is False or not same_symbol(x, y):
            raise ShapeError(
                f"{describe(a)} but {describe(b)}: batch dim {i - n - 2} does not broadcast ({x.text()} vs {y.text()})",
                op=op,
            )
        else:
            out.append(x)
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Softmax, norms, reductions
# ---------------------------------------------------------------------------------------------


def softmax(x, axis: int = -1):
    """``exp(x - max) / sum(exp(x - max))`` along ``axis`` (any axis; numerically stable).
    Reference: :func:`tessera.reference.softmax`."""
    op = "ops.softmax"
    if not is_traced(x):
        return wrap(reference.softmax(x, axis=axis))
    trace = _trace(op)
    x = require_tensor(op, "x", x)
    require_float(op, x)
    ax = normalize_axis(op, x, axis)
    return trace.emit(op, "softmax", [x], x.dims, x.dtype, _label("softmax", x), axis=ax)


def _norm_vector(op: str, x: TracedTensor, v: Any, what: str) -> TracedTensor:
    v = require_tensor(op, what, v)
    require_rank(op, v, 1, f" ({what} is a [{x.dims[-1].text()}] vector)")
    last, vd = x.dims[-1], v.dims[0]
    if dims_agree(last, vd) is False or not same_symbol(last, vd):
        raise ShapeError(
            f"{describe(x)} but {describe(v)}; {what} must be [{last.text()}], the normalised dim"
            + (f": {differs(last, vd)}" if dims_agree(last, vd) is False else ""),
            op=op,
        )
    if v.dtype != x.dtype:
        raise DTypeError(
            f"{tensor_name(x)} is {x.dtype} but {tensor_name(v)} is {v.dtype}; {what} must have the "
            f"input's dtype (ops.cast({tensor_name(v)}, ts.{x.dtype}))",
            op=op,
        )
    return v


def _check_eps(op: str, eps: Any) -> float:
    if not _is_number(eps) or eps < 0:
        raise KernelError(f"eps is {eps!r}; expected a non-negative number", op=op)
    return float(eps)


def layer_norm(x, weight=None, bias=None, *, eps: float = 1e-5):
    """Layer normalisation over the last axis: ``(x - mean) / sqrt(var + eps) * weight + bias``
    (biased variance; ``weight``/``bias`` ``[N]`` vectors, optional). Reference:
    :func:`tessera.reference.layer_norm`."""
    op = "ops.layer_norm"
    eps = _check_eps(op, eps)
    if not is_traced(x, weight, bias):
        return wrap(reference.layer_norm(x, weight, bias, eps=eps))
    trace = _trace(op)
    x = require_tensor(op, "x", x)
    require_float(op, x)
    inputs = [x]
    if weight is not None:
        inputs.append(_norm_vector(op, x, weight, "weight"))
    if bias is not None:
        inputs.append(_norm_vector(op, x, bias, "bias"))
    return trace.emit(
        op,
        "layer_norm",
        inputs,
        x.dims,
        x.dtype,
        _label("layer_norm", x),
        eps=eps,
        has_weight=weight is not None,
        has_bias=bias is not None,
    )


def rms_norm(x, weight=None, *, eps: float = 1e-6):
    """RMS normalisation over the last axis: ``x / sqrt(mean(x^2) + eps) * weight`` (``weight``
    optional). Reference: :func:`tessera.reference.rms_norm`."""
    op = "ops.rms_norm"
    eps = _check_eps(op, eps)
    if not is_traced(x, weight):
        return wrap(reference.rms_norm(x, weight, eps=eps))
    trace = _trace(op)
    x = require_tensor(op, "x", x)
    require_float(op, x)
    inputs = [x] + ([_norm_vector(op, x, weight, "weight")] if weight is not None else [])
    return trace.emit(
        op, "rms_norm", inputs, x.dims, x.dtype, _label("rms_norm", x), eps=eps, has_weight=weight is not None
    )


def _reduce(op: str, kind: str, x, axis, keepdims: bool, ref):
    if not is_traced(x):
        return wrap(ref(x, axis=axis, keepdims=keepdims))
    trace = _trace(op)
    x = require_tensor(op, "x", x)
    if axis is None:
        axes = tuple(range(x.ndim))
    else:
        raw = axis if isinstance(axis, tuple | list) else (axis,)
        axes = tuple(sorted({normalize_axis(op, x, a) for a in raw}))
        if not axes:
            raise ShapeError("axis is empty; give at least one axis (or None for all)", op=op)
        if axes != tuple(range(axes[0], axes[-1] + 1)):
            raise ShapeError(
                f"axes {tuple(raw)} of {describe(x)} are not consecutive; reduce consecutive axes (or reduce twice)",
                op=op,
            )
    if kind != "max" and not x.dtype.is_float:
        raise DTypeError(
            f"{tensor_name(x)} is {x.dtype}; ops.{kind} accumulates in float32, cast to a float dtype first", op=op
        )
    if keepdims:
        dims = tuple(Dim(None, 1) if i in axes else d for i, d in enumerate(x.dims))
    else:
        dims = tuple(d for i, d in enumerate(x.dims) if i not in axes)
    return trace.emit(op, kind, [x], dims, x.dtype, _label(kind, x), axis=axes, keepdims=keepdims)


def sum(x, axis=None, keepdims: bool = False):  # noqa: A001  (the op's name)
    """Sum over ``axis`` (an int, a tuple of consecutive axes, or None for all), accumulated in
    float32. Reference: :func:`tessera.reference.sum`."""
    return _reduce("ops.sum", "sum", x, axis, keepdims, reference.sum)


def max(x, axis=None, keepdims: bool = False):  # noqa: A001
    """Maximum over ``axis`` (as :func:`sum`). Reference: :func:`tessera.reference.max`."""
    return _reduce("ops.max", "max", x, axis, keepdims, reference.max)


def mean(x, axis=None, keepdims: bool = False):
    """Mean over ``axis`` (as :func:`sum`). Reference: :func:`tessera.reference.mean`."""
    return _reduce("ops.mean", "mean", x, axis, keepdims, reference.mean)


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


def flash_attention(
    q, k, v, *, causal: bool = False, scale: float | None = None, causal_align: str = "top_left", bias=None
):
    """Attention ``softmax(scale * Q K^T + bias + mask) V`` on ``[B, H, S, D]`` tensors, computed as
    flash attention (online softmax, no ``S x S`` matrix in memory).

    ``K``/``V`` are ``[B, H_kv, S_kv, D]``; ``H_kv`` may divide ``H`` (grouped-query attention:
    query head ``h`` reads kv head ``h // (H // H_kv)``). ``scale`` defaults to ``1/sqrt(D)``. With
    ``causal`` query ``i`` sees keys ``j <= i`` (``causal_align="top_left"``, PyTorch's
    ``is_causal``) or ``j <= i + S_kv - S_q`` (``"bottom_right"``, flash-attn's). ``bias`` is an
    additive float tensor ``[B, H, S_q, S_kv]`` with B, H or S_q a literal 1 where it is broadcast
    (torch SDPA's float ``attn_mask``; not S_kv, which Relax's attention takes whole): a padding mask
    ``[B, 1, 1, S_kv]`` of 0 and -inf, ALiBi ``[1, H, S_q, S_kv]``. A query whose keys are all masked gets zeros. Reference:
    :func:`tessera.reference.flash_attention`.
    """
    op = "ops.flash_attention"
    if causal_align not in ("top_left", "bottom_right"):
        raise KernelError(f"causal_align is {causal_align!r}; expected 'top_left' or 'bottom_right'", op=op)
    if scale is not None and (not _is_number(scale) or scale <= 0):
        raise KernelError(f"scale is {scale!r}; expected a positive number (or None for 1/sqrt(D))", op=op)
    if not is_traced(q, k, v, *([] if bias is None else [bias])):
        return wrap(
            reference.flash_attention(q, k, v, causal=causal, scale=scale, causal_align=causal_align, bias=bias)
        )
    trace = _trace(op)
    q, k, v = (require_tensor(op, n, t) for n, t in (("Q", q), ("K", k), ("V", v)))
    for t in (q, k, v):
        require_rank(op, t, 4, " ([B, H, S, D])")
    dtype = require_same_dtype(op, q, k, v)
    require_float(op, q)

    def check(x: TracedTensor, i: int, y: TracedTensor, j: int, what: str) -> None:
        dx, dy = x.dims[i], y.dims[j]
        if dims_agree(dx, dy) is False or (
            dims_agree(dx, dy) is None and not same_symbol(dx, dy) and dx.name is not None and dy.name is not None
        ):
            detail = differs(dx, dy) if dims_agree(dx, dy) is False else f"{dx.text()} vs {dy.text()}"
            raise ShapeError(f"{describe(x)} but {describe(y)}; {what} must match: {detail}", op=op)

    check(q, 0, k, 0, "the batch B")
    check(q, 3, k, 3, "the head dim D")
    for i, what in ((0, "B"), (1, "the kv heads H_kv"), (2, "the kv length S_kv"), (3, "D")):
        check(k, i, v, i, f"K and V's {what}")
    h, h_kv = q.dims[1].value, k.dims[1].value
    if h is not None and h_kv is not None and h % h_kv:
        raise ShapeError(
            f"{describe(q)} has {h} heads but {describe(k)} has {h_kv}; grouped-query attention "
            "needs H to be a multiple of H_kv",
            op=op,
        )
    scale_value = float(scale) if scale is not None else None
    if bias is not None:
        bias = require_tensor(op, "bias", bias)
        require_rank(op, bias, 4, " ([B, H, S_q, S_kv], a dim 1 where it is broadcast)")
        require_float(op, bias)
        for i, what in enumerate(("the batch B", "the heads H", "the query length S_q", "the key length S_kv")):
            d = bias.dims[i]
            if i == 3 and d.value == 1 and k.dims[2].value != 1:
                raise ShapeError(
                    f"{describe(bias)}, broadcast over the keys (its dim 3 is 1), but {describe(k)}; Relax's "
                    "attention takes the bias's key dim S_kv whole. A bias constant "
                    "over the keys does not change the softmax (a query whose keys are all masked aside): "
                    "drop it, or give the bias the key length",
                    op=op,
                )
            if d.value == 1:
                continue  # broadcast (a literal 1, or a dim bound to 1)
            check(bias, i, q if i < 3 else k, i if i < 3 else 2, f"the bias's dim {i} (1, or {what})")
    return trace.emit(
        op,
        "attention",
        [q, k, v] + ([] if bias is None else [bias]),
        q.dims,
        dtype,
        _label("flash_attention", q, k, v),
        scale=scale_value,
        causal=causal_align if causal else None,
    )
