"""Converters for order statistics that TVM's torch importer lacks in both TVMs (installed by
:mod:`tessera_tvm.frontend_fixes`): ``torch.fmax``/``fmin`` (which ignore a NaN where
``maximum``/``minimum`` keep it), ``torch.cummax``/``cummin`` (running extrema and their indices),
``F.adaptive_max_pool1d``/``2d`` (with their indices), ``torch.sort(stable=True)``, ``torch.msort``
and ``torch.kthvalue``, ``torch.nanmedian``; ``torch.nan_to_num``, ``nansum``, ``nanmean`` (without
the decomposition); and ``torch.exp2``, ``torch.atan2`` (TileLang's TVM). Each stopped the import
with "Unsupported function types". And ``x != x`` (torch's NaN test), which apache-tvm 0.27 made false. Torch's NaN rules are kept: a running extreme and a pooled
maximum are NaN from a NaN on; the sorts are argsorts, which ``partition_for_tessera`` orders NaN in
as torch (tessera_tvm/relax/torch_frontend.py).
"""

from __future__ import annotations

import numpy as np

from .frontend_fixes import _dtype, _rank
from .relax_rewrites import _type


def install_order_converters(importer, table: dict, relax) -> None:
    """Put this module's converters in the importer's ``table`` (where it has none), and ``exp2`` and
    ``atan2`` (none in apache-tvm 0.27; TileLang's has no ``atan2``)."""
    for name, largest in (("fmax", True), ("fmin", False)):
        table.setdefault(
            f"{name}.default", lambda node, largest=largest: _nan_ignoring(importer, node, relax, largest=largest)
        )
    for name, largest in (("cummax", True), ("cummin", False)):
        table.setdefault(
            f"{name}.default", lambda node, largest=largest: _running_extreme(importer, node, relax, largest=largest)
        )
    for name in ("adaptive_max_pool1d.default", "adaptive_max_pool2d.default"):
        table.setdefault(name, lambda node: _adaptive_max_pool(importer, node, relax))
    table.setdefault("sort.stable", lambda node: _stable_sort(importer, node, relax))
    table.setdefault("msort.default", lambda node: _msort(importer, node, relax))
    table.setdefault("kthvalue.default", lambda node: _kthvalue(importer, node, relax))
    for name in ("nanmedian.default", "nanmedian.dim"):
        table.setdefault(name, lambda node: _nanmedian(importer, node, relax))
    table.setdefault("nan_to_num.default", lambda node: _nan_to_num(importer, node, relax))
    if "ne.Tensor" in table:
        table["ne.Tensor"] = lambda node, plain=table["ne.Tensor"]: _self_unequal(importer, node, plain, relax)
    for name, mean in (("nansum", False), ("nanmean", True)):
        table.setdefault(f"{name}.default", lambda node, mean=mean: _nan_sum(importer, node, relax, mean=mean))
    # the inputs arrive in the float result's dtype (_COMPUTE_IN_RESULT)
    table.setdefault("exp2.default", lambda node: _exp2(importer, node, relax))
    table.setdefault(
        "atan2.default",
        lambda node: importer.block_builder.emit(relax.op.atan2(*(importer.env[a] for a in node.args[:2]))),
    )


def _exp2(importer, node, relax):
    """``aten.exp2`` ``(x)``: ``2 ** x``."""
    x = importer.env[node.args[0]]
    return importer.block_builder.emit(relax.op.power(relax.const(2.0, _dtype(x)), x))


def _is_float(expr) -> bool:
    return _dtype(expr).startswith(("float", "bfloat"))


def _isnan(relax, x):
    """``isnan(x)``; a half-precision ``x`` tested in float32 (TVM has no bfloat16 isnan)."""
    return relax.op.isnan(relax.op.astype(x, "float32") if _dtype(x) in ("float16", "bfloat16") else x)


def _nan_ignoring(importer, node, relax, *, largest: bool):
    """``torch.fmax`` / ``torch.fmin`` ``(x, y)``: ``maximum``/``minimum`` where both are numbers, the
    other operand where one is NaN (NaN only where both are)."""
    x, y = (importer.env[a] for a in node.args[:2])
    op = relax.op
    plain = (op.maximum if largest else op.minimum)(x, y)
    if not _is_float(x):
        return importer.block_builder.emit(plain)
    return importer.block_builder.emit(op.where(_isnan(relax, x), y, op.where(_isnan(relax, y), x, plain)))


def _running_extreme(importer, node, relax, *, largest: bool):
    """``aten.cummax`` / ``aten.cummin`` ``(x, dim)``: (the running maximum or minimum along ``dim``,
    the int64 index where it was last reached). Torch keeps the later index of equal values and a
    NaN from the first NaN on (its index the latest NaN's).

    A log-step scan over a static axis of n: ceil(log2 n) steps, each comparing every position with
    the one ``2**s`` before it and taking that one where it is strictly better (a NaN over a number,
    a later NaN over an earlier one: ties keep the later index)."""
    x = importer.env[node.args[0]]
    axis = int(node.args[1]) % max(_rank(x), 1)
    size = _type(x).shape.values[axis] if _rank(x) else 1
    if not isinstance(size, int) and not hasattr(size, "value"):
        raise _refused(node, f"a running {'maximum' if largest else 'minimum'} over a dim of symbolic size")
    bb, op = importer.block_builder, relax.op
    if _rank(x) == 0:
        return bb.emit(relax.Tuple([x, relax.const(0, "int64")]))
    n = int(size)
    shape = [int(d) if hasattr(d, "value") else d for d in _type(x).shape.values]
    positions = np.arange(n, dtype="int64").reshape([n if d == axis else 1 for d in range(len(shape))])
    index = bb.emit(op.broadcast_to(relax.const(positions, "int64"), shape))
    value = x
    nan = bb.emit(_isnan(relax, x)) if _is_float(x) else None
    better = op.greater if largest else op.less
    step = 1
    while step < n:
        # each position's best so far and the best of the window `step` before it (none for the first `step`)
        earlier_value = _shifted(bb, relax, value, axis, step, n)
        earlier_index = _shifted(bb, relax, index, axis, step, n, fill=-1)
        take = op.greater_equal(earlier_index, relax.const(0, "int64"))
        wins = better(earlier_value, value)
        if nan is not None:
            earlier_nan = _shifted(bb, relax, nan, axis, step, n)
            # a NaN wins over a number; between NaNs, the later (this one)
            wins = op.logical_or(
                op.logical_and(earlier_nan, op.logical_not(nan)), op.logical_and(wins, op.logical_not(nan))
            )
            nan = bb.emit(op.logical_or(nan, op.logical_and(take, earlier_nan)))
        take = bb.emit(op.logical_and(take, wins))
        value = bb.emit(op.where(take, earlier_value, value))
        index = bb.emit(op.where(take, earlier_index, index))
        step *= 2
    return bb.emit(relax.Tuple([value, index]))


def _shifted(bb, relax, t, axis: int, step: int, n: int, fill: int | None = None):
    """``t`` moved ``step`` places later along ``axis``: position i holds ``t[i - step]``; the first
    ``step`` positions hold ``fill`` (-1 for an index), else ``t``'s own first elements (never taken:
    their index is -1)."""
    op = relax.op
    head = op.strided_slice(t, axes=[axis], begin=[0], end=[step])
    if fill is not None:
        shape = list(_type(t).shape.values)
        shape[axis] = step  # a broadcast constant: apache-tvm 0.27 cannot legalize a full_like of a computed tensor
        head = op.broadcast_to(relax.const(fill, _dtype(t)), shape)
    body = op.strided_slice(t, axes=[axis], begin=[0], end=[n - step])
    return bb.emit(op.concat([head, body], axis=axis))


def _adaptive_max_pool(importer, node, relax):
    """``aten.adaptive_max_pool1d`` / ``adaptive_max_pool2d`` ``(x, output_size)``: (values, int64
    indices into each input plane), over ``[N, C, L]`` / ``[C, L]`` or ``[N, C, H, W]`` / ``[C, H, W]``.
    Output cell i along an axis of n covers ``floor(i * n / out)`` to ``ceil((i + 1) * n / out)``,
    as torch. Every window's elements are gathered (a constant table of flat positions, each window
    padded with its own first element), and the kept position is the first largest one in row-major
    order, or the last NaN where the window holds one (torch's rule)."""
    x = importer.env[node.args[0]]
    spatial = 2 if "2d" in str(node.target) else 1
    sizes = _type(x).shape.values[-spatial:]
    if not all(hasattr(d, "value") or isinstance(d, int) for d in sizes):
        raise _refused(node, "an adaptive max pool over an image of symbolic size")
    sizes = [int(d) for d in sizes]
    outs = node.args[1]
    outs = [int(o) for o in (outs if isinstance(outs, (list, tuple)) else [outs] * spatial)]
    windows = [_windows(n, out) for n, out in zip(sizes, outs, strict=True)]
    if spatial == 1:
        windows = [[(0, 1)], *windows]
        sizes, outs = [1, *sizes], [1, *outs]
    height, width = sizes
    cells = [
        [h * width + w for h in range(h0, h1) for w in range(w0, w1)] for h0, h1 in windows[0] for w0, w1 in windows[1]
    ]
    widest = max(len(c) for c in cells)
    table = np.array([[c[0]] * (widest - len(c)) + c for c in cells], "int64")  # [cells, widest]
    bb, op = importer.block_builder, relax.op
    lead = [d for d in _type(x).shape.values[:-spatial]]
    plane = bb.emit(op.reshape(x, [*lead, height * width]))
    gathered = bb.emit(op.take(plane, relax.const(table.reshape(-1), "int64"), axis=len(lead)))
    windowed = bb.emit(op.reshape(gathered, [*lead, len(cells), widest]))
    last = len(lead) + 1
    if _is_float(x):
        wide = bb.emit(op.astype(windowed, "float32")) if _dtype(x) != "float64" else windowed
        nan = bb.emit(op.isnan(wide))
        largest = bb.emit(op.max(bb.emit(op.where(nan, op.zeros_like(wide), wide)), axis=[last], keepdims=True))
        first_largest = op.argmax(op.astype(op.equal(wide, largest), "int32"), axis=last, keepdims=True)
        ranks = relax.const(np.arange(1, widest + 1, dtype="int32"))
        last_nan = op.argmax(op.multiply(op.astype(nan, "int32"), ranks), axis=last, keepdims=True)
        has_nan = op.greater(op.max(op.astype(nan, "int32"), axis=[last], keepdims=True), relax.const(0, "int32"))
        kept = bb.emit(op.where(has_nan, last_nan, first_largest))
    else:
        kept = bb.emit(op.argmax(windowed, axis=last, keepdims=True))
    kept = bb.emit(op.astype(kept, "int64"))
    values = bb.emit(op.gather_elements(windowed, kept, axis=last))
    flat = bb.emit(op.broadcast_to(relax.const(table, "int64"), [*lead, len(cells), widest]))
    indices = bb.emit(op.gather_elements(flat, kept, axis=last))
    out_shape = [*lead, *outs[-spatial:]] if spatial == 2 else [*lead, outs[-1]]
    values = bb.emit(op.reshape(values, out_shape))
    indices = bb.emit(op.reshape(indices, out_shape))
    return bb.emit(relax.Tuple([values, indices]))


def _windows(n: int, out: int) -> list[tuple[int, int]]:
    """torch's adaptive windows of an axis of ``n`` into ``out`` cells: [floor(i n / out), ceil((i + 1) n / out))."""
    return [(i * n // out, -(-(i + 1) * n // out)) for i in range(out)]


def _refused(node, what: str):
    from .errors import TesseraError
    from .frontend_masks import _where_written

    return TesseraError(f"{node.target}{_where_written(node)}: {what} cannot be imported; give that dim a static size")


def _sorted(importer, node, relax, *, dim: int, descending: bool):
    """``x`` sorted along ``dim``: (values, int64 indices). TVM's sort is stable, as ``stable=True`` asks."""
    x = importer.env[node.args[0]]
    bb, op = importer.block_builder, relax.op
    indices = bb.emit(op.argsort(x, axis=dim, descending=descending, dtype="int64"))
    return bb.emit(relax.Tuple([bb.emit(op.gather_elements(x, indices, axis=dim)), indices]))


def _stable_sort(importer, node, relax):
    """``aten.sort.stable`` ``(x, *, stable, dim=-1, descending=False)``."""
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", -1)
    descending = node.args[3] if len(node.args) > 3 else node.kwargs.get("descending", False)
    return _sorted(importer, node, relax, dim=int(dim), descending=bool(descending))


def _msort(importer, node, relax):
    """``aten.msort`` ``(x)``: the values sorted along the first dim."""
    return importer.block_builder.emit(relax.TupleGetItem(_sorted(importer, node, relax, dim=0, descending=False), 0))


def _kthvalue(importer, node, relax):
    """``aten.kthvalue`` ``(x, k, dim=-1, keepdim=False)``: the k-th smallest along ``dim`` (from 1)
    and its int64 index."""
    x = importer.env[node.args[0]]
    k = int(node.args[1])
    dim = int(node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", -1)) % max(_rank(x), 1)
    keepdim = bool(node.args[3] if len(node.args) > 3 else node.kwargs.get("keepdim", False))
    bb, op = importer.block_builder, relax.op
    ordered = _sorted(importer, node, relax, dim=dim, descending=False)
    picked = []
    for i in range(2):
        item = bb.emit(op.strided_slice(bb.emit(relax.TupleGetItem(ordered, i)), axes=[dim], begin=[k - 1], end=[k]))
        picked.append(item if keepdim else bb.emit(op.squeeze(item, [dim])))
    return bb.emit(relax.Tuple(picked))


def _nanmedian(importer, node, relax):
    """``aten.nanmedian`` ``(x)`` / ``.dim`` ``(x, dim, keepdim=False)``: the lower median of the numbers,
    NaN (and the first NaN's index) where there are none: position ``max(m - 1, 0) // 2`` of the sort
    with NaN last, m the count of numbers. The sort is an argsort, which ``partition_for_tessera``
    orders as torch (NaN last)."""
    x = importer.env[node.args[0]]
    bb, op = importer.block_builder, relax.op
    by_dim = len(node.args) > 1 or "dim" in node.kwargs
    if by_dim:
        dim = int(node.args[1] if len(node.args) > 1 else node.kwargs["dim"]) % max(_rank(x), 1)
        keepdim = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))
    else:
        x, dim, keepdim = bb.emit(op.reshape(x, [-1])), 0, False
    order = bb.emit(op.argsort(x, axis=dim, dtype="int64"))
    numbers = op.sum(op.astype(op.logical_not(_isnan(relax, x)), "int64"), axis=[dim], keepdims=True)
    one = relax.const(1, "int64")
    middle = op.floor_divide(op.maximum(op.subtract(numbers, one), relax.const(0, "int64")), relax.const(2, "int64"))
    index = bb.emit(op.gather_elements(order, bb.emit(middle), axis=dim))
    value = bb.emit(op.gather_elements(x, index, axis=dim))
    if not by_dim:
        return bb.emit(op.reshape(value, []))
    if not keepdim:
        value, index = (bb.emit(op.squeeze(t, [dim])) for t in (value, index))
    return bb.emit(relax.Tuple([value, index]))


def _nan_to_num(importer, node, relax):
    """``aten.nan_to_num`` ``(x, nan=None, posinf=None, neginf=None)``: NaN as ``nan`` (0), +inf and
    -inf as ``posinf`` and ``neginf`` (the dtype's largest and lowest finite numbers). An integer x
    is returned as it is."""
    from .frontend_fixes import _arg, _lowest

    x = importer.env[node.args[0]]
    if not _is_float(x):
        return x
    dtype, op = _dtype(x), relax.op
    nan, posinf, neginf = (_arg(node, i, name, None) for i, name in enumerate(("nan", "posinf", "neginf"), 1))
    lowest = _lowest(dtype)
    bb = importer.block_builder
    wide = bb.emit(op.astype(x, "float32")) if dtype in ("float16", "bfloat16") else x  # TVM: no bfloat16 isinf
    infinite = bb.emit(op.isinf(wide))
    zero = relax.const(0, _dtype(wide))
    out = op.where(op.isnan(wide), relax.const(0.0 if nan is None else nan, dtype), x)
    out = op.where(
        op.logical_and(infinite, op.greater(wide, zero)), relax.const(-lowest if posinf is None else posinf, dtype), out
    )
    out = op.where(
        op.logical_and(infinite, op.less(wide, zero)), relax.const(lowest if neginf is None else neginf, dtype), out
    )
    return importer.block_builder.emit(out)


def _nan_sum(importer, node, relax, *, mean: bool):
    """``aten.nansum`` / ``aten.nanmean`` ``(x, dim=None, keepdim=False, *, dtype=None)``: the sum (the
    mean) of the numbers, NaN left out (the mean of none is NaN, 0 / 0)."""
    from .frontend_fixes import _arg

    x = importer.env[node.args[0]]
    dim = _arg(node, 1, "dim", None)
    axes = None if dim is None or (isinstance(dim, (list, tuple)) and not dim) else dim
    axes = [axes] if isinstance(axes, int) else axes
    keepdim = bool(_arg(node, 2, "keepdim", False))
    op, bb = relax.op, importer.block_builder
    if not _is_float(x):
        return bb.emit(op.sum(x, axes, keepdims=keepdim))
    nan = _isnan(relax, x)
    total = bb.emit(op.sum(op.where(nan, relax.const(0.0, _dtype(x)), x), axes, keepdims=keepdim))
    if not mean:
        return total
    count = op.sum(op.astype(op.logical_not(nan), _dtype(x)), axes, keepdims=keepdim)
    return bb.emit(op.divide(total, count))


def _self_unequal(importer, node, plain, relax):
    """``aten.ne.Tensor`` ``(x, x)`` of a float tensor: ``isnan(x)``, the idiom torch's own
    decompositions use (``nanmean``, ``nanmedian``). apache-tvm 0.27 simplifies ``x != x`` to false,
    so ``nanmean`` of a row of NaN gave 0 (torch NaN) and ``(x != x).sum()`` 0, with no error."""
    x = importer.env[node.args[0]]
    if node.args[0] is not node.args[1] or not _is_float(x):
        return plain(node)
    return importer.block_builder.emit(_isnan(relax, x))
