"""Converters for writes through integer indices that TVM's torch importer refuses or gets wrong
(installed by :mod:`tessera_tvm.frontend_fixes`, in both TVMs):

- ``aten.index_put`` with fewer index tensors than the tensor has axes (``y[:, idx] = v``,
  ``y[:, :, pos] = k``, ``y[i, j] += 1`` on a 3-D tensor: torch.export records None for a leading
  sliced axis and leaves trailing ones out) stopped the import ("IndexPut requires the number of
  index tensors (2) to match the data tensor dimensions (3)"), failed to build ("Cannot broadcast
  index shapes") or, with a slice between two index tensors (``y[i, :, k] = v``), wrote the wrong
  elements with no error. Each becomes one write through flat positions (:func:`_index_put`).
- ``index_copy`` (transformers' StaticCache: ``k_out.index_copy_(2, cache_position, k)``),
  ``index_add`` and ``scatter_add`` had no converter without the decomposition; with it,
  ``index_copy`` and ``index_add`` became the index_put above.
"""

from __future__ import annotations

import math

from .frontend_fixes import _arg, _dtype, _rank
from .frontend_masks import _is_bool, _where_written
from .relax_rewrites import _type


def install_write_converters(importer, table: dict, relax) -> None:
    """Put this module's converters in ``importer``'s ``table``, each around the importer's own (the
    bool-mask ``index_put`` of :mod:`tessera_tvm.frontend_masks` stays for mask indices)."""
    for name in ("index_put.default", "index_put_.default"):
        plain = table.get(name)
        table[name] = lambda node, plain=plain: _index_put(importer, node, plain, relax)
    for name in ("index_copy.default", "index_copy_.default"):
        table.setdefault(name, lambda node: _index_copy(importer, node, relax))
    for name in ("index_add.default", "index_add_.default"):
        table.setdefault(name, lambda node: _index_add(importer, node, relax))
    for name in ("scatter_add.default", "scatter_add_.default"):
        table.setdefault(name, lambda node: _scatter_add(importer, node, relax))


def _write_error(node, why: str):
    from .errors import TesseraError

    return TesseraError(
        f"{node.target}{_where_written(node)}: {why}. What imports: integer index tensors (or None for a "
        "sliced axis) on a tensor of static shape, or a bool mask alone"
    )


def _is_static(expr) -> bool:
    return all(isinstance(d, int) or hasattr(d, "value") for d in _type(expr).shape.values)


def _static_shape(node, expr) -> list[int]:
    """``expr``'s shape as ints (Relax's struct info), or a named error where an axis is symbolic."""
    if not _is_static(expr):
        raise _write_error(node, f"the tensor written has a symbolic shape {list(_type(expr).shape.values)}")
    return [int(d) for d in _type(expr).shape.values]


def _index_put(importer, node, plain, relax):
    """``aten.index_put(y, indices, v, accumulate)`` with integer index tensors: torch's meaning is
    ``y[indices] = v`` (``+=`` with accumulate, duplicates adding up). The index tensors broadcast
    together (right-aligned); an axis with None, or past the list's end, is sliced whole. The
    positions ``y[indices]`` reads have the shape of torch's result (the broadcast axes in the index
    tensors' place where they are adjacent, first otherwise: :func:`tessera_tvm.frontend_masks._index`),
    and ``v`` broadcasts to it. Each position is a flat offset into ``y``: an index tensor's value (a
    negative one counting from the end) times its axis's stride, plus an ``arange`` times the stride of
    each sliced axis. ``y`` flattened takes ``v`` at those offsets (``index_put`` with one index), or
    adds it (``scatter_elements`` with reduction "add", whose loop over one axis is serial, so that
    duplicates add up; one 1-D index tensor adds along its own axis: :func:`_added_along`)."""
    indices = list(node.args[1])
    if any(_is_bool(index) for index in indices):
        if plain is None:
            raise _write_error(node, "a bool mask index has no converter here")
        return plain(node)
    import torch

    y = importer.env[node.args[0]]
    axes = [axis for axis, index in enumerate(indices) if index is not None]
    if plain is not None and len(axes) == _rank(y) and not _is_static(y):  # every axis indexed
        return plain(node)
    shape = _static_shape(node, y)
    vals = [getattr(indices[axis], "meta", {}).get("val") for axis in axes]
    if not axes or any(not isinstance(v, torch.Tensor) for v in vals):
        raise _write_error(node, "its indices are not index tensors")
    try:
        common = [int(d) for d in torch.broadcast_shapes(*(v.shape for v in vals))]
    except (RuntimeError, TypeError) as exc:
        raise _write_error(node, f"its index tensors do not broadcast to one static shape ({exc})") from exc
    values = node.args[2]
    v = importer.env[values] if hasattr(values, "meta") else relax.const(values, _dtype(y))
    return _write_at(
        importer,
        y,
        shape,
        {a: importer.env[indices[a]] for a in axes},
        common,
        v,
        bool(_arg(node, 3, "accumulate", False)),
        relax,
    )


def _write_at(importer, y, shape, indexed: dict, common: list, v, accumulate: bool, relax):
    """``y`` (of static ``shape``) with ``v`` written (or added) at ``y[indices]``, ``indexed`` the
    index tensors by axis (the others sliced whole), ``common`` their broadcast shape."""
    bb = importer.block_builder
    axes = sorted(indexed)
    rank, width = len(shape), len(common)
    rest = [axis for axis in range(rank) if axis not in indexed]
    adjacent = axes == list(range(axes[0], axes[0] + len(axes)))
    before = len([axis for axis in rest if axis < axes[0]]) if adjacent else 0
    out_shape = [shape[a] for a in rest[:before]] + common + [shape[a] for a in rest[before:]]
    out_rank = len(out_shape)
    strides = [1] * rank
    for axis in range(rank - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    flat = None
    for axis in axes:
        index = indexed[axis]
        if _dtype(index) != "int64":
            index = bb.emit(relax.op.astype(index, "int64"))
        zero, size = relax.const(0, "int64"), relax.const(shape[axis], "int64")
        index = bb.emit(relax.op.where(relax.op.less(index, zero), relax.op.add(index, size), index))
        if accumulate and len(axes) == 1 and width == 1:  # index_add's: added along the axis itself
            return _added_along(importer, y, index, v, axis, out_shape, relax)
        lead = width - _rank(index)  # right-aligned in the broadcast axes, which sit at `before`
        index = bb.emit(
            relax.op.reshape(
                index,
                [1] * (before + lead) + [int(d) for d in _type(index).shape.values] + [1] * (out_rank - before - width),
            )
        )
        term = bb.emit(relax.op.multiply(index, relax.const(strides[axis], "int64")))
        flat = term if flat is None else bb.emit(relax.op.add(flat, term))
    for position, axis in enumerate(rest):
        place = position if position < before else position + width
        span = bb.emit(relax.op.arange(0, shape[axis], 1, "int64"))
        span = bb.emit(relax.op.reshape(span, [1] * place + [shape[axis]] + [1] * (out_rank - place - 1)))
        flat = bb.emit(relax.op.add(flat, bb.emit(relax.op.multiply(span, relax.const(strides[axis], "int64")))))
    count = math.prod(out_shape)
    flat = bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(flat, out_shape)), [count]))
    if _dtype(v) != _dtype(y):
        v = bb.emit(relax.op.astype(v, _dtype(y)))
    v = bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(v, out_shape)), [count]))
    data = bb.emit(relax.op.reshape(y, [math.prod(shape)]))
    if accumulate:
        out = bb.emit(relax.op.scatter_elements(data, flat, v, axis=0, reduction="add"))
    else:
        out = bb.emit(relax.op.index_put(data, relax.Tuple([flat]), v, False))
    return bb.emit(relax.op.reshape(out, shape))


def _added_along(importer, y, index, v, axis: int, out_shape: list, relax):
    """``y`` with ``v`` added at a 1-D ``index`` (non-negative) along ``axis``: ``scatter_elements``
    along that axis, with the index repeated over the others. Its loop over the other positions is
    parallel and its loop along the axis serial, so duplicates add up with no race."""
    bb = importer.block_builder
    rank = len(out_shape)
    index = bb.emit(relax.op.reshape(index, [1] * axis + [out_shape[axis]] + [1] * (rank - axis - 1)))
    index = bb.emit(relax.op.broadcast_to(index, out_shape))
    if _dtype(v) != _dtype(y):
        v = bb.emit(relax.op.astype(v, _dtype(y)))
    v = bb.emit(relax.op.broadcast_to(v, out_shape))
    return bb.emit(relax.op.scatter_elements(y, index, v, axis=axis, reduction="add"))


def _one_axis(importer, node, relax, accumulate: bool, scale=None):
    """``index_copy``/``index_add`` ``(y, dim, index, src)``: ``y`` with ``src`` written (added) at
    ``index`` (1-D, or a single number as 0-d) along ``dim``."""
    y = importer.env[node.args[0]]
    shape = _static_shape(node, y)
    dim = int(node.args[1]) % len(shape)
    index = importer.env[node.args[2]]
    src = importer.env[node.args[3]]
    if scale is not None and scale != 1:
        src = importer.block_builder.emit(relax.op.multiply(src, relax.const(scale, _dtype(src))))
    common = [int(d) for d in _type(index).shape.values]
    if len(common) == 0:  # a 0-d index: src has that axis of size 1 (or none, for a 0-d y)
        index = importer.block_builder.emit(relax.op.reshape(index, [1]))
        common = [1]
    return _write_at(importer, y, shape, {dim: index}, common, src, accumulate, relax)


def _index_copy(importer, node, relax):
    """``aten.index_copy(y, dim, index, src)`` (transformers' StaticCache writes its keys and values
    with ``index_copy_(2, cache_position, k)``): ``y`` with ``src`` at ``index`` along ``dim``."""
    return _one_axis(importer, node, relax, accumulate=False)


def _index_add(importer, node, relax):
    """``aten.index_add(y, dim, index, src, alpha=1)``: ``alpha * src`` added at ``index`` along
    ``dim``, duplicates adding up."""
    return _one_axis(importer, node, relax, accumulate=True, scale=_arg(node, 4, "alpha", 1))


def _scatter_add(importer, node, relax):
    """``aten.scatter_add(y, dim, index, src)``: ``y[..., index[p], ...] += src[p]`` along ``dim`` for
    each position p of ``index``, which may be smaller than ``src`` (its first ``index.shape`` part
    is read). ``scatter_elements`` with reduction "add" (serial along ``dim``: duplicates add up)."""
    bb = importer.block_builder
    y, index, src = (importer.env[a] for a in (node.args[0], node.args[2], node.args[3]))
    dim = int(node.args[1]) % max(_rank(y), 1)
    wanted = _static_shape(node, index)
    if _static_shape(node, src) != wanted:
        src = bb.emit(relax.op.strided_slice(src, list(range(len(wanted))), [0] * len(wanted), wanted))
    if _dtype(src) != _dtype(y):
        src = bb.emit(relax.op.astype(src, _dtype(y)))
    return bb.emit(relax.op.scatter_elements(y, index, src, axis=dim, reduction="add"))
