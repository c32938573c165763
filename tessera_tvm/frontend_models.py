"""Converters for ops that Hugging Face architectures beyond the first ones (MPT, ...) reach and TVM's
torch importer gets wrong (installed by :mod:`tessera_tvm.frontend_fixes`, in both TVMs):

- ``F.layer_norm`` with a weight or bias of None in the call (MPT's ``nn.LayerNorm(bias=False)``)
  stopped the import without decomposition with ``KeyError: None``: the converter looked every
  argument present up as a graph value.
- ``torch._weight_norm`` (``nn.utils.parametrizations.weight_norm``: Wav2Vec2's and HuBERT's
  positional convolution) had no converter without decomposition."""

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
    table.setdefault("_weight_norm.default", lambda node: _weight_norm(importer, node, relax))


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
