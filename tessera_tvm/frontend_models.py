"""Converters for ops that Hugging Face architectures beyond the first ones (MPT, ...) reach and TVM's
torch importer gets wrong (installed by :mod:`tessera_tvm.frontend_fixes`, in both TVMs):

- ``F.layer_norm`` with a weight or bias of None in the call (MPT's ``nn.LayerNorm(bias=False)``)
  stopped the import without decomposition with ``KeyError: None``: the converter looked every
  argument present up as a graph value.
- ``torch._weight_norm`` (``nn.utils.parametrizations.weight_norm``: Wav2Vec2's and HuBERT's
  positional convolution) had no converter without decomposition.
- ``nn.Conv2d(padding="valid")`` and ``padding="same"`` (``aten.conv2d.padding``, SigLIP's patch
  embedding; conv1d and conv3d alike) had no converter without decomposition."""

from __future__ import annotations

import numpy as np

from .frontend_fixes import _arg, _dtype
from .relax_rewrites import _type


def _layer_norm(importer, node, plain, relax):
    """``aten.layer_norm(x, normalized_shape, weight, bias, eps)`` with ``weight`` or ``bias`` None:
    ones or zeros of the normalized shape in x's dtype, as without them. The rest stays with the
    importer's own converter."""
    weight, bias = _arg(node, 2, "weight", None), _arg(node, 3, "bias", None)
    if weight is not None and bias is not None:
        return plain(node)
    x = importer.env[node.args[0]]
    shape = [int(d) for d in node.args[1]]
    dtype = _dtype(x)

    def given(value, fill):
        return importer.env[value] if value is not None else relax.const(np.full(shape, fill, dtype), dtype)

    return importer.block_builder.emit(
        relax.op.nn.layer_norm(
            x,
            given(weight, 1.0),
            given(bias, 0.0),
            axes=list(range(-len(shape), 0)),
            epsilon=float(_arg(node, 4, "eps", 1e-5)),
        )
    )


def install_model_converters(importer, table: dict, relax) -> None:
    """Put this module's converters in ``importer``'s table (``create_convert_map``'s), each around
    the importer's own where it has one."""
    if "layer_norm.default" in table:
        table["layer_norm.default"] = lambda node, plain=table["layer_norm.default"]: _layer_norm(
            importer, node, plain, relax
        )
    if "cat.default" in table:
        table["cat.default"] = lambda node, plain=table["cat.default"]: _cat(importer, node, plain, relax)
    table.setdefault("_weight_norm.default", lambda node: _weight_norm(importer, node, relax))
    for spatial in (1, 2, 3):
        table.setdefault(f"conv{spatial}d.padding", lambda node, n=spatial: _conv_padded_by_name(importer, node, n))


def _weight_norm(importer, node, relax):
    """``torch._weight_norm(v, g, dim)`` (``nn.utils.parametrizations.weight_norm``, Wav2Vec2's and
    HuBERT's positional convolution): ``v * g / ||v||``, the norm over every axis but ``dim`` (over
    all of ``v`` for dim -1). No converter in either TVM without decomposition."""
    v, g = importer.env[node.args[0]], importer.env[node.args[1]]
    dim = int(_arg(node, 2, "dim", 0))
    emit, op, rank = importer.block_builder.emit, relax.op, len(_type(v).shape.values)
    axes = list(range(rank)) if dim == -1 else [a for a in range(rank) if a != dim % rank]
    norm = emit(op.sqrt(emit(op.sum(emit(op.multiply(v, v)), axis=axes, keepdims=True))))
    return emit(op.multiply(v, emit(op.divide(g, norm))))


def _conv_padded_by_name(importer, node, spatial: int):
    """``conv{1,2,3}d(x, w, bias, stride, padding="valid" | "same", dilation, groups)``: the padding
    written out (torch's "same" puts the odd one of an axis's ``dilation * (k - 1)`` at its end), then
    the importer's own convolution."""
    x, weight = importer.env[node.args[0]], importer.env[node.args[1]]
    bias = _arg(node, 2, "bias", None)
    bias = importer.env[bias] if bias is not None else None

    def per_axis(value, default):
        value = default if value is None else value
        return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)] * spatial

    stride = per_axis(_arg(node, 3, "stride", 1), 1)
    mode = _arg(node, 4, "padding", "valid")
    dilation = per_axis(_arg(node, 5, "dilation", 1), 1)
    groups = int(_arg(node, 6, "groups", 1))
    kernel = [int(k) for k in _type(weight).shape.values[2:]]
    if mode == "valid":
        before = after = [0] * spatial
    else:  # "same" (torch allows it at stride 1 only)
        totals = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
        before = [t // 2 for t in totals]
        after = [t - b for t, b in zip(totals, before, strict=True)]
    impl = {1: importer._conv1d_impl, 2: importer._conv2d_impl, 3: importer._conv3d_impl}[spatial]
    return impl(x, weight, bias=bias, strides=stride, padding=before + after, dilation=dilation, groups=groups)


def _cat(importer, node, plain, relax):
    """``torch.cat(tensors, dim)`` where some operands are 1-D with no elements and others are not:
    those left out, as torch does (its legacy rule for ``torch.tensor([])``). A single operand left
    is the result."""
    tensors = node.args[0]

    def empty_vector(value) -> bool:
        shape = getattr(_type(importer.env[value]), "shape", None)
        values = getattr(shape, "values", None)
        return values is not None and len(values) == 1 and _is_zero(values[0])

    kept = [t for t in tensors if not empty_vector(t)]
    if len(kept) == len(tensors) or not kept:
        return plain(node)
    if len(kept) == 1:
        return importer.env[kept[0]]
    dim = _arg(node, 1, "dim", 0)
    return importer.block_builder.emit(relax.op.concat([importer.env[t] for t in kept], axis=dim))


def _is_zero(extent) -> bool:
    return (extent if isinstance(extent, int) else getattr(extent, "value", None)) == 0
