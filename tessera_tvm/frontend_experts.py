"""Converters for transformers' mixture-of-experts layers (installed by
:mod:`tessera_tvm.frontend_fixes`, in both TVMs): ``torch.histc`` (tokens per expert) and
transformers' own ``grouped_mm_fallback`` (each expert's rows times its weight, Mixtral's default
experts)."""

from __future__ import annotations

import numpy as np

from .frontend_fixes import _arg, _dtype
from .frontend_masks import _packet_name, _where_written
from .relax_rewrites import _type


def _histc(importer, node, relax):
    """``torch.histc(x, bins, min, max)``: how many elements fall in each of ``bins`` equal bins over
    [min, max] (the last bin includes max; elements outside are not counted), in x's dtype (Mixtral's
    tokens per expert). A range taken from the data (min == max) is refused by name."""
    x = importer.env[node.args[0]]
    bins, low, high = (_arg(node, i, name, d) for i, name, d in ((1, "bins", 100), (2, "min", 0), (3, "max", 0)))
    if low == high:
        from .errors import TesseraError

        raise TesseraError(
            f"{node.target}{_where_written(node)}: min == max ({low}) takes the range from the data, "
            "which is not supported; pass the range (histc(x, bins, min, max))"
        )
    emit, op, dtype = importer.block_builder.emit, relax.op, _dtype(x)
    flat = emit(op.reshape(x, [-1, 1]))
    offset = emit(op.subtract(flat, relax.const(low, dtype)))
    index = emit(op.floor(op.divide(offset, relax.const((high - low) / bins, dtype))))
    index = emit(op.minimum(index, relax.const(bins - 1, dtype)))  # max itself: the last bin
    above, below = (
        emit(op.greater_equal(flat, relax.const(low, dtype))),
        emit(op.less_equal(flat, relax.const(high, dtype))),
    )
    each = emit(op.reshape(emit(op.arange(0, bins, 1, dtype)), [1, bins]))
    hits = emit(op.logical_and(emit(op.equal(index, each)), emit(op.logical_and(above, below))))
    return emit(op.sum(emit(op.astype(hits, dtype)), axis=0))


def _grouped_mm(importer, node, relax):
    """transformers' ``grouped_mm_fallback(input [S, K], weight [E, K, N], offs [E])``: the input's rows
    sorted by expert, ``offs`` the running ends of each expert's rows; each expert's rows times its
    weight, rows past the last end zero. Each expert's rows are cut out at run time
    (``dynamic_strided_slice``) and given a symbolic row count, so its matmul is a GEMM of that many
    rows (offloaded as a kernel with a dynamic M); the products and the zero rows are concatenated."""
    x, weight, offs = (importer.env[a] for a in node.args[:3])
    emit, op = importer.block_builder.emit, relax.op
    rows, depth = _type(x).shape.values
    experts = int(_type(weight).shape.values[0])
    ends = emit(op.astype(offs, "int64"))
    # transformers passes its [E, N, K] weights transposed: slicing the transpose would copy all of
    # it on every call (TVM's transpose, 30% of a Mixtral MoE block), so the stored weight is sliced
    transposed = _transposed_source(importer, node.args[1])
    zero, depth_end, one = (relax.const(np.array(v, "int64"), "int64") for v in ([0], [int(depth)], [1, 1]))
    products, counts = [], []
    for e in range(experts):
        start = zero if e == 0 else emit(op.strided_slice(ends, [0], [e - 1], [e]))
        end = emit(op.strided_slice(ends, [0], [e], [e + 1]))
        begin, stop = emit(op.concat([start, zero])), emit(op.concat([end, depth_end]))
        count = _size_var(relax, f"expert{e}_rows")
        part = emit(op.dynamic_strided_slice(x, begin, stop, one))
        part = importer.block_builder.match_cast(part, _tensor_type(relax, [count, depth], _dtype(x)))
        own = emit(
            op.squeeze(emit(op.strided_slice(weight if transposed is None else transposed, [0], [e], [e + 1])), [0])
        )
        if transposed is not None:  # the stored weight's slice, transposed next to its matmul (a GEMM's transposed B)
            own = emit(op.permute_dims(own))
        products.append(emit(op.matmul(part, own)))
        counts.append(count)
    past_end = relax.ShapeExpr([rows - sum(counts[1:], counts[0]), _type(weight).shape.values[2]])
    products.append(emit(op.zeros(past_end, _dtype(x))))
    return emit(op.concat(products, axis=0))


def _transposed_source(importer, node):
    """The Relax value of ``w`` where the graph ``node`` is ``w`` of rank 3 with its last two axes
    swapped (``transpose(-2, -1)``, or ``permute(0, 2, 1)`` after the decomposition), else None."""
    name = _packet_name(node) if getattr(node, "op", None) == "call_function" else ""
    if name == "transpose.int" and sorted(d % 3 for d in node.args[1:3]) == [1, 2]:
        return importer.env[node.args[0]]
    if name == "permute.default" and list(node.args[1]) in ([0, 2, 1], [0, -1, -2]):
        return importer.env[node.args[0]]
    return None


def _tensor_type(relax, shape, dtype: str):
    """A tensor's type (``relax.TensorStructInfo`` in TileLang's TVM, ``relax.TensorType`` in
    apache-tvm 0.27)."""
    return (getattr(relax, "TensorStructInfo", None) or relax.TensorType)(shape, dtype)


def _size_var(relax, name: str):
    """A symbolic int64 size, in the TIR of the TVM that ``relax`` belongs to (``tvm.tirx`` in
    TileLang's, ``tvm.tir`` in apache-tvm's)."""
    import sys

    tvm = sys.modules[relax.__name__.split(".")[0]]
    tir = getattr(tvm, "tirx", None) or tvm.tir
    return tir.Var(name, "int64")
