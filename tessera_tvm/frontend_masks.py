"""Converters for reads and writes through indices that TVM's torch importer gets wrong or refuses
(installed by :mod:`tessera_tvm.frontend_fixes`, in both TVMs): advanced indexing with several index
tensors (``x[rows, cols]`` pairs them), writes through a bool mask (``y[mask] = v``, ``y[mask] += 1``,
``y[mask] = f(x[mask])``: ``where``), and a named refusal of any other read through a mask, whose
shape is known only when the model runs."""

from __future__ import annotations

from .frontend_fixes import _arg, _dtype, _rank
from .relax_rewrites import _type


def _index(importer, node, plain, relax):
    """``x[i, j]``, ``x[i, :, j]``: index tensors broadcast together (right-aligned, as NumPy's) and
    pick one element per position (torch's advanced indexing). Where they sit on adjacent axes the
    result keeps their place (``x[:, i, j]``: [B, *broadcast]); otherwise its broadcast axes come
    first (``x[i, :, j]``: [*broadcast, C]). The importers got both wrong in part: TileLang's TVM took
    two indices one after the other, an outer product (``x[i, j]`` with two 1-D indices of length 3
    came out [3, 3], no error); both TVMs kept a slice between two indices as an axis of its own
    (``x[i, :, j]`` of [3, 4, 5] came out [2, 4, 2] where torch gives [2, 4]) and could not broadcast
    indices of different ranks (F.unfold's ``x[:, :, i[..., None, None], j]``). A negative index on
    an axis of static size counts from the end (both TVMs read before the axis). One index tensor
    stays with the importer's own converter (a ``take``)."""
    indices = list(node.args[1])
    if any(_is_bool(index) for index in indices):
        return _gathered_by_mask(importer, node)
    axes = [axis for axis, index in enumerate(indices) if index is not None]
    shapes = [getattr(indices[axis], "meta", {}).get("val") for axis in axes]
    if len(axes) < 2 or any(shape is None for shape in shapes):
        return plain(node)
    import torch

    try:
        common = [int(d) for d in torch.broadcast_shapes(*(shape.shape for shape in shapes))]
    except (RuntimeError, TypeError):  # a symbolic index shape: the importer's converter
        return plain(node)
    data = importer.env[node.args[0]]
    bb = importer.block_builder
    rank = len(_type(data).shape.values)
    rest = [axis for axis in range(rank) if axis not in axes]
    if axes + rest != list(range(rank)):  # the indexed axes first
        data = bb.emit(relax.op.permute_dims(data, axes + rest))
    normalised = []
    for position, axis in enumerate(axes):
        index = importer.env[indices[axis]]
        size = _type(importer.env[node.args[0]]).shape.values[axis]
        if isinstance(size, int) or hasattr(size, "value"):  # a negative index counts from the end, as in torch
            size = relax.const(int(size), _dtype(index))
            index = bb.emit(relax.op.where(relax.op.less(index, relax.const(0, _dtype(index))), index + size, index))
        if [int(d) for d in shapes[position].shape] != common:
            index = bb.emit(relax.op.broadcast_to(index, common))
        normalised.append(index)
    out = bb.emit(relax.op.index_tensor(data, normalised))  # [*common, *rest]
    first, width = axes[0], len(common)
    if axes == list(range(first, first + len(axes))) and first > 0:  # adjacent: the result keeps their place
        order = [*range(width, width + first), *range(width), *range(width + first, width + len(rest))]
        out = bb.emit(relax.op.permute_dims(out, order))
    return out


def _is_bool(index) -> bool:
    """Whether an index of ``x[...]`` is a bool tensor (a mask) rather than integer positions or None."""
    import torch

    val = getattr(index, "meta", {}).get("val")
    return isinstance(val, torch.Tensor) and val.dtype == torch.bool


def _where_written(node) -> str:
    """The user's line that made ``node`` (torch.export's stack trace), for an error."""
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    lines = [line.strip() for line in trace if line.strip().startswith("File ")]
    return f" ({lines[-1]})" if lines else ""


#: Ops through which a tensor gathered by a bool mask (``x[mask]``) may flow on its way to a write
#: through the same mask (``y[mask] = f(x[mask])``): element-wise ops (torch's pointwise tag) and
#: dtype casts.
_CASTS = frozenset({"_to_copy.default", "to.dtype", "to.dtype_layout", "type_as.default"})


def _masked_write_error(node, why: str):
    from .errors import TesseraError

    return TesseraError(
        f"{node.target}{_where_written(node)}: {why}. A bool-mask index has as many elements as the mask "
        "has True values, a shape known only when the model runs, which Relax cannot compile. What "
        "imports: a write through the mask of a value that does not depend on that count (y[mask] = 0.5, "
        "y[mask] = row, y[mask] += 1) or of element-wise ops on tensors read through the same mask "
        "(y[mask] = x[mask] * 3); or torch.where(mask, new, y)"
    )


def _gathered_by_mask(importer, node):
    """``x[mask]`` read only to be written back through the same mask (``y[mask] = f(x[mask])``, and
    what ``y[mask] += 1`` functionalizes to): the whole of ``x`` stands for it, since the element-wise
    ops between compute the same values at the mask's positions, and :func:`_index_put` writes only
    those. Any other use of ``x[mask]`` (a sum, a matmul, a result) needs its data-dependent shape:
    refused by name."""
    import torch

    indices = list(node.args[1])
    mask = indices[0]
    if len(indices) != 1 or not _is_bool(mask):
        raise _masked_write_error(node, "a bool mask mixed with other indices or slices is not supported")
    kept = len(node.args[0].meta["val"].shape) - len(mask.meta["val"].shape)
    seen, todo = set(), list(node.users)
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        name = _packet_name(user)
        if name == "sym_size.int" and _only_checked(user):  # torch.export's checks of the count
            continue
        if name in ("index_put.default", "index_put_.default"):
            if len(user.args[1]) != 1 or not _same_value(user.args[1][0], mask) or user.args[0] in seen:
                raise _masked_write_error(node, "its value is written through another index")
            continue
        pointwise = isinstance(user.target, torch._ops.OpOverload) and torch.Tag.pointwise in user.target.tags
        if not (pointwise or name in _CASTS):
            raise _masked_write_error(node, f"its value is used by {user.target}, not only written back")
        for other in user.all_input_nodes:  # an operand that is not gathered must broadcast over the rows
            val = other.meta.get("val")
            if other in seen or other is node or not isinstance(val, torch.Tensor):
                continue
            if _one_per_row(list(val.shape), kept):
                raise _masked_write_error(node, f"{user.target} combines it with a tensor of shape {list(val.shape)}")
        todo.extend(user.users)
    return importer.env[node.args[0]]


def _size_checked(importer, node, plain):
    """``x[mask].size(0)`` that torch.export only checks (``u0 >= 0``, ``u0 <= numel``): the whole
    axis's size as a number (:func:`_gathered_by_mask` gives ``x`` for ``x[mask]``), for which the checks
    hold; apache-tvm's comparisons take a number, not the constant its own converter makes."""
    read = node.args[0]
    if _packet_name(read) == "index.Tensor" and any(_is_bool(i) for i in read.args[1]) and _only_checked(node):
        return int(_type(importer.env[read]).shape.values[node.args[1]])
    return plain(node)


def _only_checked(node) -> bool:
    """Whether ``node``'s value (a size) is used only by torch.export's runtime checks (comparisons
    and ``_assert_scalar``), which need not hold the size itself."""
    import operator

    for user in node.users:
        if user.target in (operator.ge, operator.le, operator.gt, operator.lt, operator.eq, operator.ne):
            if not _only_checked(user):
                return False
        elif _packet_name(user) != "_assert_scalar.default":
            return False
    return True


def _same_value(a, b) -> bool:
    """Whether two graph values are the same computation (``x < 0`` written twice: two nodes)."""
    if a is b:
        return True
    if not (hasattr(a, "target") and hasattr(b, "target")) or a.op != "call_function" or a.target != b.target:
        return not hasattr(a, "target") and not hasattr(b, "target") and a == b
    if len(a.args) != len(b.args) or a.kwargs != b.kwargs:
        return False
    return all(_same_value(x, y) for x, y in zip(a.args, b.args, strict=True))


def _packet_name(node) -> str:
    """The name TVM's importer keys its converters by (``index.Tensor``, ``ge``)."""
    return getattr(node.target, "__name__", str(node.target))


def _index_put(importer, node, plain, relax):
    """``y[mask] = v`` (``aten.index_put`` with one bool index, ``accumulate`` for ``+=``): ``where(mask,
    v, y)`` with the mask given y's trailing axes (TVM's converter refused a bool index). ``v`` is a
    value that broadcasts over the masked rows, or was computed element-wise from tensors read through
    the same mask (:func:`_gathered_by_mask`); other index lists stay with TVM's converter."""
    indices = list(node.args[1])
    if not any(_is_bool(index) for index in indices):
        return plain(node)
    if len(indices) != 1:
        raise _masked_write_error(node, "a bool mask mixed with other indices or slices is not supported")
    y, values = importer.env[node.args[0]], node.args[2]
    mask = importer.env[indices[0]]
    kept = _rank(y) - _rank(mask)
    if not _gathered_from(values, indices[0]):
        val = getattr(values, "meta", {}).get("val")
        shape = list(val.shape) if val is not None else []
        if _one_per_row(shape, kept):
            raise _masked_write_error(node, f"the value written has shape {shape}, one row per True value")
    bb = importer.block_builder
    v = importer.env[values] if hasattr(values, "meta") else relax.const(values, _dtype(y))
    if _dtype(v) != _dtype(y):
        v = bb.emit(relax.op.astype(v, _dtype(y)))
    if _arg(node, 3, "accumulate", False):
        v = bb.emit(relax.op.add(y, v))
    for _ in range(kept):
        mask = bb.emit(relax.op.expand_dims(mask, -1))
    return bb.emit(relax.op.where(mask, v, y))


def _one_per_row(shape: list, kept: int) -> bool:
    """Whether a value of ``shape`` has a leading axis for the rows a mask picks (one per True value,
    a count known only at run time) rather than broadcasting over them: more axes than the ``kept``
    ones the mask leaves, or exactly one more that is not 1."""
    return len(shape) > kept + 1 or (len(shape) == kept + 1 and shape[0] != 1)


def _gathered_from(value, mask) -> bool:
    """Whether ``value`` (a graph node) depends on a tensor read through ``mask`` (``x[mask]``)."""
    seen, todo = set(), [value] if hasattr(value, "meta") else []
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if _packet_name(node) == "index.Tensor" and len(node.args[1]) == 1 and _same_value(node.args[1][0], mask):
            return True
        todo.extend(node.all_input_nodes)
    return False
