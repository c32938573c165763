"""Converters for element-wise math that TVM's torch importer gets wrong with no error (installed by
:mod:`tessera_tvm.frontend_fixes`, in both TVMs unless said otherwise). Found by comparing ordinary
torch ops on edge values (NaN, +-inf, -0.0, large magnitudes) with torch:

- Float ``a // b`` and ``a % b`` (``floor_divide``, ``div(rounding_mode="floor")``, ``remainder``):
  TVM computes ``floor(a / b)`` and ``a - floor(a / b) * b``. ``1.0 // 0.1`` gave 10 (torch and
  Python: 9, as 0.1 is a little more than a tenth), ``1e10 % 1.5`` gave 256 (torch: 1, exact),
  ``inf // 1.5`` inf (torch: NaN), ``-1 // inf`` -0.0 (torch: -1) and ``-1 % inf`` NaN (torch: inf).
  Now torch's own formulas, from ``fmod`` (exact): :func:`_floor_divided`.
- ``torch.flip`` over several dims flipped only the first (TileLang's TVM; ``x.flip(0, 1)`` of a
  matrix came out upside down only).
- ``F.celu(x, alpha)`` without the decomposition computed ``exp(x) / alpha - 1`` for
  ``exp(x / alpha) - 1``: wrong for every negative x when alpha is not 1.
- ``torch.logaddexp`` without the decomposition was ``log(exp(a) + exp(b))``: inf from a or b
  above 88 (float32), where torch gives ``max(a, b) + log1p(exp(-|a - b|))``.
- ``F.cross_entropy`` without the decomposition read ``reduction`` and ``ignore_index`` as keywords
  (torch.export passes them by position): ``reduction="sum"`` gave the mean, ``"none"`` a scalar, an
  ``ignore_index`` other than -100 was not ignored; ``label_smoothing`` was dropped, and probability
  targets were read as class indices. Now torch's formulas (:func:`_cross_entropy`).
- ``F.max_pool1d`` without the decomposition (TVM's pool, which skips a NaN followed by a number)
  gave the window's largest number where torch gives NaN: a window with a NaN is NaN now.
- ``mask * mask`` (two bool tensors; torch's decomposition of ``logaddexp`` has one) did not build
  in apache-tvm 0.27 ("Check failed: t.MatchesCode(kDLFloat)"): it is ``logical_and``.
- ``F.softshrink`` without the decomposition multiplied ``x - lambda`` by a 0/1 mask: NaN for
  x = +-inf (``inf * 0``), where torch gives +-inf.
"""

from __future__ import annotations

import numpy as np

from .frontend_fixes import _arg, _dtype, _is_tensor
from .frontend_order import _is_float
from .relax_rewrites import _type


def install_math_converters(importer, table: dict, relax) -> None:
    """Put this module's converters in ``importer``'s ``table``, each around the importer's own."""
    for name in ("floor_divide.default", "floordiv", "remainder.Tensor", "remainder.Scalar", "div.Tensor_mode"):
        if name in table:
            table[name] = lambda node, name=name, plain=table[name]: _floor_divided(importer, node, name, plain, relax)
    if "flip.default" in table:
        table["flip.default"] = lambda node: _flip(importer, node, relax)
    if "celu.default" in table:
        table["celu.default"] = lambda node: _celu(importer, node, relax)
    if "logaddexp.default" in table:
        table["logaddexp.default"] = lambda node: _logaddexp(importer, node, relax)
    if "cross_entropy_loss.default" in table:
        table["cross_entropy_loss.default"] = lambda node: _cross_entropy(importer, node, relax)
    if "max_pool1d.default" in table:
        table["max_pool1d.default"] = lambda node: _max_pool1d(importer, node, relax)
    if "mul.Tensor" in table:
        table["mul.Tensor"] = lambda node, plain=table["mul.Tensor"]: _bool_product(importer, node, plain, relax)
    if "softshrink.default" in table:
        table["softshrink.default"] = lambda node: _softshrink(importer, node, relax)


def _floor_divided(importer, node, name: str, plain, relax):
    """Float ``a // b`` or ``a % b`` as torch computes them (``div_floor_floating`` and
    ``remainder``): ``m = fmod(a, b)``, exact; ``a % b`` is ``m``, plus ``b`` where ``m`` is nonzero
    and of the other sign than ``b``; ``a // b`` is ``(a - m) / b``, less 1 where ``m`` was moved,
    rounded to the nearest integer (it is one but for rounding), and ``a / b`` where ``b`` is 0.
    Integer operands stay with the importer's converter."""
    out = plain(node)
    if name == "div.Tensor_mode" and _arg(node, 2, "rounding_mode", None) != "floor":
        return out
    if not _is_tensor(out, relax) or not _is_float(out):
        return out
    bb, op, dtype = importer.block_builder, relax.op, _dtype(out)

    def tensor(value):
        if not _is_tensor(value, relax):
            return relax.const(float(value), dtype)
        return value if _dtype(value) == dtype else bb.emit(op.astype(value, dtype))

    a, b = (tensor(importer.env[x] if hasattr(x, "meta") else x) for x in node.args[:2])
    zero = relax.const(0.0, dtype)
    m = bb.emit(op.mod(a, b))
    moved = bb.emit(op.logical_and(op.not_equal(m, zero), op.logical_xor(op.less(m, zero), op.less(b, zero))))
    if name.startswith("remainder"):
        return bb.emit(op.where(moved, op.add(m, b), m))
    div = bb.emit(op.divide(op.subtract(a, m), b))
    div = bb.emit(op.where(moved, op.subtract(div, relax.const(1.0, dtype)), div))
    floor = bb.emit(op.floor(div))
    nearest = op.where(
        op.greater(op.subtract(div, floor), relax.const(0.5, dtype)), op.add(floor, relax.const(1.0, dtype)), floor
    )
    return bb.emit(op.where(op.equal(b, zero), op.divide(a, b), nearest))


def _flip(importer, node, relax):
    """``aten.flip(x, dims)``: one ``flip`` per dim (Relax's flips one axis)."""
    out = importer.env[node.args[0]]
    for dim in _arg(node, 1, "dims", ()):
        out = importer.block_builder.emit(relax.op.flip(out, int(dim)))
    return out


def _celu(importer, node, relax):
    """``aten.celu(x, alpha)``: ``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""
    x = importer.env[node.args[0]]
    dtype = _dtype(x)
    alpha = relax.const(float(_arg(node, 1, "alpha", 1.0)), dtype)
    op = relax.op
    negative = op.multiply(alpha, op.subtract(op.exp(op.divide(x, alpha)), relax.const(1.0, dtype)))
    return importer.block_builder.emit(op.add(op.nn.relu(x), op.minimum(relax.const(0.0, dtype), negative)))


def _logaddexp(importer, node, relax):
    """``aten.logaddexp(a, b)``: ``max(a, b) + log1p(exp(-|a - b|))``, and ``a`` where a and b are
    the same infinity (whose difference is NaN), as torch."""
    a, b = (importer.env[x] for x in node.args[:2])
    op, bb = relax.op, importer.block_builder
    a, b = bb.emit(a), bb.emit(b)
    dtype = _dtype(a)
    spread = op.exp(op.negative(op.abs(op.subtract(a, b))))
    # log1p(y) = log(1 + y), accurate enough here: 1 + y lies in [1, 2]
    out = op.add(op.maximum(a, b), op.log(op.add(relax.const(1.0, dtype), spread)))
    same_infinity = op.logical_and(op.isinf(a), op.equal(a, b))
    return bb.emit(op.where(same_infinity, a, out))


def _softshrink(importer, node, relax):
    """``aten.softshrink(x, lambd)``: ``x - lambd`` above lambd, ``x + lambd`` below -lambd, else 0."""
    x = importer.env[node.args[0]]
    dtype = _dtype(x)
    lambd = float(_arg(node, 1, "lambd", 0.5))
    op = relax.op
    shrunk = op.where(
        op.greater(x, relax.const(lambd, dtype)),
        op.subtract(x, relax.const(lambd, dtype)),
        op.add(x, relax.const(lambd, dtype)),
    )
    kept = op.logical_or(op.greater(x, relax.const(lambd, dtype)), op.less(x, relax.const(-lambd, dtype)))
    kept = op.logical_or(kept, op.isnan(x))  # NaN stays NaN
    return importer.block_builder.emit(op.where(kept, shrunk, relax.const(0.0, dtype)))


_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _cross_entropy(importer, node, relax):
    """``aten.cross_entropy_loss(x, target, weight, reduction, ignore_index, label_smoothing)`` as
    torch: ``log_softmax`` over the class axis (1, or 0 for an unbatched x), then class indices through
    ``nll_loss`` plus ``label_smoothing / C`` of the smoothing term (``-sum(weight * log p)`` over the
    classes, 0 where ignored, its mean over the weights of the targets kept), or probability targets
    (smoothed) as ``-sum(weight * target * log p)``, whose mean is over the batch's positions."""
    bb, op = importer.block_builder, relax.op
    x, target = (importer.env[a] for a in node.args[:2])
    weight = _arg(node, 2, "weight", None)
    weight = importer.env[weight] if weight is not None else None
    reduction = _arg(node, 3, "reduction", 1)
    reduction = _REDUCTIONS.get(reduction, reduction)
    ignore_index = int(_arg(node, 4, "ignore_index", -100))
    smoothing = float(_arg(node, 5, "label_smoothing", 0.0))
    dtype, rank = _dtype(x), len(_type(x).shape.values)
    axis = 1 if rank > 1 else 0
    classes = int(_type(x).shape.values[axis])
    logp = bb.emit(op.nn.log_softmax(x, axis=axis))
    if weight is not None:  # [C] along the class axis
        weight = bb.emit(op.reshape(weight, [classes] + [1] * (rank - axis - 1)))

    def weighted(t):
        return t if weight is None else op.multiply(t, weight)

    def reduced(t, mean_over):
        if reduction == "none":
            return t
        total = op.sum(t)
        return total if reduction == "sum" else op.divide(total, mean_over)

    if _is_float(target):
        if smoothing:
            target = op.add(
                op.multiply(target, relax.const(1.0 - smoothing, dtype)), relax.const(smoothing / classes, dtype)
            )
        loss = op.negative(op.sum(weighted(op.multiply(logp, target)), axis=[axis]))
        count = relax.const(float(np.prod([int(d) for d in _type(x).shape.values]) / classes), dtype)
        return bb.emit(reduced(loss, count))
    nll = bb.emit(
        op.nn.nll_loss(
            logp, target, weight if weight is None else op.reshape(weight, [classes]), reduction, ignore_index
        )
    )
    if not smoothing:
        return nll
    ignored = op.equal(target, relax.const(ignore_index, _dtype(target)))
    smooth = op.where(ignored, relax.const(0.0, dtype), op.negative(op.sum(weighted(logp), axis=[axis])))
    kept = op.astype(op.logical_not(ignored), dtype)
    if weight is None:
        over = op.sum(kept)
    else:
        safe = op.where(ignored, relax.const(0, _dtype(target)), target)
        over = op.sum(op.multiply(op.take(op.reshape(weight, [classes]), safe, axis=0), kept))
    smooth = reduced(smooth, over)
    return bb.emit(
        op.add(
            op.multiply(nll, relax.const(1.0 - smoothing, dtype)),
            op.multiply(smooth, relax.const(smoothing / classes, dtype)),
        )
    )


def _max_pool1d(importer, node, relax):
    """``aten.max_pool1d(x, kernel, stride, padding, dilation, ceil_mode)`` of ``[N, C, W]`` or
    ``[C, W]``: ``max_pool2d`` of ``[N, C, 1, W]``, NaN where the window holds one."""
    bb, op = importer.block_builder, relax.op
    x = importer.env[node.args[0]]
    unbatched = len(_type(x).shape.values) == 2

    def one(value, default):
        value = default if value is None or value == [] else value
        return int(value[0]) if isinstance(value, (list, tuple)) else int(value)

    kernel = one(node.args[1], None)
    stride = one(_arg(node, 2, "stride", None), kernel)
    padding = one(_arg(node, 3, "padding", 0), 0)
    dilation = one(_arg(node, 4, "dilation", 1), 1)
    ceil_mode = bool(_arg(node, 5, "ceil_mode", False))
    if unbatched:
        x = bb.emit(op.expand_dims(x, 0))

    def pool(t):
        return op.nn.max_pool2d(
            op.expand_dims(t, 2),
            pool_size=(1, kernel),
            strides=(1, stride),
            padding=(0, padding, 0, padding),
            dilation=(1, dilation),
            ceil_mode=ceil_mode,
        )

    out = op.squeeze(pool(x), [2])
    if _is_float(x):
        # a window with a NaN is NaN (TVM's pool skips one followed by a number): the same pool of
        # x's NaN mask says which
        nans = op.greater(op.squeeze(pool(op.astype(op.isnan(x), _dtype(x))), [2]), relax.const(0.0, _dtype(x)))
        out = op.where(nans, relax.const(float("nan"), _dtype(x)), out)
    return bb.emit(op.squeeze(out, [0]) if unbatched else out)


def _bool_product(importer, node, plain, relax):
    """``aten.mul.Tensor`` of two bool tensors: ``logical_and`` (the rest: the importer's own)."""
    a, b = (importer.env.get(x) if hasattr(x, "meta") else x for x in node.args[:2])
    if not all(_is_tensor(v, relax) and _dtype(v) == "bool" for v in (a, b)):
        return plain(node)
    return importer.block_builder.emit(relax.op.logical_and(a, b))
