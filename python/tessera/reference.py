"""The reference semantics of every op in ``tessera.ops``, in numpy.

This module is the definition of what the ops compute; the compiled kernels are tested against it.
The rules:

- Every op computes in float32 (integer ops in int32) from its inputs converted to that type, and
  rounds its result to its output dtype (the input dtype unless the op says otherwise). bf16 and fp8
  arrays are ``ml_dtypes`` arrays.
- A fused kernel keeps intermediate values in float32 and rounds only where the graph casts and at
  its output, so it may be *more* accurate than this op-by-op reference; tests allow for that with a
  per-dtype tolerance.

``tessera.ops`` functions called on numpy arrays run these functions and return
:class:`ReferenceArray` s, numpy arrays whose Python operators (``+ - * / @``, unary ``-``) are
these ops too (plain numpy would promote ``bf16 * 0.5`` to float32), so a kernel body runs
unchanged on numpy arrays with the ops' semantics: ``kernel.reference(a, b)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .types import DType
from .types import dtype as as_dtype

__all__ = [
    "ReferenceArray",
    "wrap",
    "add",
    "sub",
    "mul",
    "div",
    "neg",
    "cast",
    "relu",
    "gelu",
    "silu",
    "sigmoid",
    "exp",
    "tanh",
    "clip",
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

_erf = np.vectorize(math.erf, otypes=[np.float64])


class ReferenceArray(np.ndarray):
    """A numpy array whose Python operators follow Tessera's op semantics (see the module docstring)."""

    def __add__(self, other):
        return wrap(add(self, other))

    def __radd__(self, other):
        return wrap(add(other, self))

    def __sub__(self, other):
        return wrap(sub(self, other))

    def __rsub__(self, other):
        return wrap(sub(other, self))

    def __mul__(self, other):
        return wrap(mul(self, other))

    def __rmul__(self, other):
        return wrap(mul(other, self))

    def __truediv__(self, other):
        return wrap(div(self, other))

    def __rtruediv__(self, other):
        return wrap(div(other, self))

    def __neg__(self):
        return wrap(neg(self))

    def __matmul__(self, other):
        return wrap(matmul(self, other))


def wrap(x):
    """``x`` as a :class:`ReferenceArray` (tuples element-wise)."""
    if isinstance(x, tuple):
        return tuple(wrap(v) for v in x)
    return np.asarray(x).view(ReferenceArray)


def unwrap(x):
    """``x`` as plain numpy arrays (tuples element-wise)."""
    if isinstance(x, tuple):
        return tuple(unwrap(v) for v in x)
    return np.asarray(x)


def _dtype_of(x) -> DType:
    return as_dtype(np.asarray(x).dtype)


def _compute(x) -> np.ndarray:
    """``x`` in the compute type: float32 for floats, int32 for integers."""
    x = np.asarray(x)
    return x.astype(np.float32) if _dtype_of(x).is_float else x.astype(np.int32)


def _round(x: np.ndarray, dtype: DType) -> np.ndarray:
    return np.asarray(x).astype(dtype.numpy)


def _binary(a, b, fn) -> np.ndarray:
    ta = np.asarray(a) if isinstance(a, np.ndarray) else None
    tb = np.asarray(b) if isinstance(b, np.ndarray) else None
    out = _dtype_of(ta if ta is not None else tb)
    xa = _compute(ta) if ta is not None else np.float32(a) if out.is_float else np.int32(a)
    xb = _compute(tb) if tb is not None else np.float32(b) if out.is_float else np.int32(b)
    return _round(fn(xa, xb), out)


def add(a, b):
    """``a + b`` with numpy broadcasting."""
    return _binary(a, b, np.add)


def sub(a, b):
    """``a - b`` with numpy broadcasting."""
    return _binary(a, b, np.subtract)


def mul(a, b):
    """``a * b`` with numpy broadcasting."""
    return _binary(a, b, np.multiply)


def div(a, b):
    """``a / b`` with numpy broadcasting (floats only)."""
    return _binary(a, b, np.divide)


def neg(x):
    """``-x``."""
    return _round(-_compute(x), _dtype_of(x))


def cast(x, dtype):
    """``x`` converted to ``dtype`` (round to nearest even; float -> int truncates toward zero)."""
    return _round(np.asarray(x), as_dtype(dtype))


def _unary(x, fn):
    return _round(fn(_compute(x)), _dtype_of(x))


def relu(x):
    """``max(x, 0)``."""
    return _unary(x, lambda v: np.maximum(v, 0))


def clip(x, lo=None, hi=None):
    """``min(max(x, lo), hi)`` (a None bound: none on that side)."""
    return _unary(x, lambda v: np.clip(v, lo, hi))


def gelu(x, approximate: str = "none"):
    """``x * Phi(x)``: ``0.5 x (1 + erf(x / sqrt 2))``; with ``approximate="tanh"``,
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    if approximate == "tanh":
        return _unary(x, lambda v: 0.5 * v * (1 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * (v + 0.044715 * v**3))))
    return _unary(x, lambda v: (0.5 * v.astype(np.float64) * (1 + _erf(v / math.sqrt(2)))).astype(np.float32))


def sigmoid(x):
    """``1 / (1 + exp(-x))``."""
    return _unary(x, lambda v: 1 / (1 + np.exp(-v)))


def silu(x):
    """``x * sigmoid(x)``."""
    return _unary(x, lambda v: v / (1 + np.exp(-v)))


def exp(x):
    """``e ** x``."""
    return _unary(x, np.exp)


def tanh(x):
    """``tanh(x)``."""
    return _unary(x, np.tanh)


def scale(x, s: float):
    """``x * s`` for a Python number ``s``."""
    return _unary(x, lambda v: v * np.float32(s))


def _default_matmul_dtypes(dtype: DType, accumulate, out_dtype) -> tuple[DType, DType]:
    acc = as_dtype(accumulate) if accumulate is not None else (as_dtype("f32") if dtype.is_float else as_dtype("int32"))
    if out_dtype is not None:
        return acc, as_dtype(out_dtype)
    return acc, dtype if dtype.name in ("f32", "f16", "bf16") else acc


def matmul(a, b, *, transpose_a: bool = False, transpose_b: bool = False, accumulate=None, out_dtype=None):
    """``a @ b`` over the last two axes (batch axes broadcast), accumulated in ``accumulate``
    (float32 for floats, int32 for int8/int32), rounded to ``out_dtype`` (default: the input dtype for
    f32/f16/bf16, the accumulate dtype for fp8/int8/int32). ``transpose_a``/``transpose_b`` swap the
    last two axes of an operand first."""
    a, b = np.asarray(a), np.asarray(b)
    acc, out = _default_matmul_dtypes(_dtype_of(a), accumulate, out_dtype)
    xa = a.astype(acc.numpy)
    xb = b.astype(acc.numpy)
    if transpose_a:
        xa = np.swapaxes(xa, -1, -2)
    if transpose_b:
        xb = np.swapaxes(xb, -1, -2)
    return _round(np.matmul(xa, xb), out)


def softmax(x, axis: int = -1):
    """``exp(x - max(x)) / sum(exp(x - max(x)))`` along ``axis`` (subtracting the max keeps it finite)."""
    v = _compute(x)
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return _round(e / e.sum(axis=axis, keepdims=True), _dtype_of(x))


def layer_norm(x, weight=None, bias=None, *, eps: float = 1e-5):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (biased variance, as
    PyTorch); ``weight``/``bias`` are ``[N]`` vectors, omitted means 1 and 0."""
    v = _compute(x)
    mean = v.mean(axis=-1, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (v - mean) / np.sqrt(var + np.float32(eps))
    if weight is not None:
        y = y * _compute(weight)
    if bias is not None:
        y = y + _compute(bias)
    return _round(y, _dtype_of(x))


def rms_norm(x, weight=None, *, eps: float = 1e-6):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis; ``weight`` omitted means 1."""
    v = _compute(x)
    y = v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + np.float32(eps))
    if weight is not None:
        y = y * _compute(weight)
    return _round(y, _dtype_of(x))


def _axes(axis, ndim) -> tuple[int, ...] | None:
    if axis is None:
        return None
    return tuple(a % ndim for a in (axis if isinstance(axis, Sequence) else (axis,)))


def sum(x, axis=None, keepdims: bool = False):  # noqa: A001  (the op's name)
    """Sum over ``axis`` (an int, a tuple of consecutive axes, or None = all), accumulated in float32."""
    return _round(_compute(x).sum(axis=_axes(axis, np.ndim(x)), keepdims=keepdims), _dtype_of(x))


def max(x, axis=None, keepdims: bool = False):  # noqa: A001
    """Maximum over ``axis`` (as :func:`sum`)."""
    return _round(_compute(x).max(axis=_axes(axis, np.ndim(x)), keepdims=keepdims), _dtype_of(x))


def mean(x, axis=None, keepdims: bool = False):
    """Mean over ``axis`` (as :func:`sum`), accumulated in float32."""
    return _round(_compute(x).mean(axis=_axes(axis, np.ndim(x)), keepdims=keepdims), _dtype_of(x))


def flash_attention(
    q, k, v, *, causal: bool = False, scale: float | None = None, causal_align: str = "top_left", bias=None
):
    """``softmax(scale * Q K^T + bias + mask) V`` on ``[B, H, S, D]`` tensors (``bias`` broadcast to
    ``[B, H, S_q, S_kv]``).

    K and V may have fewer heads than Q (grouped-query attention): query head ``h`` uses kv head
    ``h // (H // H_kv)``. ``scale`` defaults to ``1/sqrt(D)``. With ``causal``, query ``i`` sees
    key ``j`` only when ``j <= i + offset``, offset 0 for ``causal_align="top_left"`` (PyTorch's
    ``is_causal``) and ``S_kv - S_q`` for ``"bottom_right"``; a query that sees no key outputs zeros.
    """
    dtype = _dtype_of(q)
    q, k, v = _compute(q), _compute(k), _compute(v)
    groups = q.shape[1] // k.shape[1]
    k = np.repeat(k, groups, axis=1)
    v = np.repeat(v, groups, axis=1)
    s = np.float32(scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * s
    if bias is not None:
        scores = scores + _compute(bias)
    if causal:
        s_q, s_kv = q.shape[2], k.shape[2]
        offset = s_kv - s_q if causal_align == "bottom_right" else 0
        visible = np.arange(s_kv)[None, :] <= np.arange(s_q)[:, None] + offset
        scores = np.where(visible, scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    e = np.exp(scores - peak)
    total = e.sum(axis=-1, keepdims=True)
    out = np.matmul(e / np.where(total > 0, total, 1), v)
    return _round(out, dtype)
