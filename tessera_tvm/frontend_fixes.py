"""Converters that TVM's torch importer (``from_exported_program``) lacks or gets wrong in both TVMs:
TileLang's and the user's apache-tvm 0.27. ``import tessera_tvm`` installs them in whichever the
process has (:func:`patch_exported_program_importer`); tessera_tvm/relax/torch_frontend.py holds
the fixes only TileLang's TVM needs.

Found by importing Hugging Face transformers models (GPT-2, LLaMA, Qwen2, BERT, ViT) and a
ResNet-18 on both import routes, then by comparing ~50 ordinary torch expressions with torch
(tests/torch_import_cases.py). On both routes (``run_ep_decomposition`` True and False):

- **Every result in torch's dtype.** torch.export records each node's dtype (``node.meta["val"]``);
  every converter is wrapped (:func:`_in_torchs_dtype`) so that its result has it. Ops that compute
  in their result's dtype (:data:`_COMPUTE_IN_RESULT`) get their tensor inputs cast first,
  comparisons compare in torch's promoted dtype, and ``where`` takes its two values in it. Before,
  with no error: ``int / 2`` divided as integers, ``int + 0.5`` stayed int, ``mask * 1.5`` stayed
  bool, ``mask.cumsum(-1)`` counted in bool, ``int < 1.5`` compared with 1, ``logical_and(bool,
  int)`` and ``any`` of ints worked bitwise (``where(mask, float, int)`` did not import),
  ``zeros_like``/``ones_like``/``full_like``/``full``/``new_ones``/``new_zeros`` ignored ``dtype=``
  (transformers' causal mask starts from ``position.new_ones((), dtype=torch.bool)``: the mask came
  out int64), sort indices were int32, ``softmax(x, dtype=torch.float64)`` stayed float32.
- In-place ops (``add_``, ``div_``, ``fill_``, ...), which torch.export keeps, changed only their own
  result: an alias (``y[0].add_(10)`` changes ``y``) kept the old value, with no error. A graph with
  in-place ops is functionalized before the import (:func:`_without_mutations`).
- ``expand`` counted a -1 from the left, where torch lines the sizes up with the input's axes from
  the right (new axes come first): CLIP's ``class_embedding.expand(batch, 1, -1)`` of a [H] weight
  did not import ("ShapeExpr index out of range"), and a [1, H] ``x.expand(B, -1, H)`` came out
  [B, H, H] instead of [B, 1, H], with no error. ``x.T``, ``x.t()`` and ``x.mT`` had no converter
  (Falcon's linear is ``x @ self.weight.T``).
- Writes through a bool mask (``y[mask] = 0.5``, ``y[mask] += 1``, ``y[mask] = x[mask] * 3``) were
  refused ("IndexPut requires each index tensor to have integer dtype"): they become ``where`` when
  the value does not depend on the mask's count of True values (:func:`_index_put`,
  :func:`_gathered_by_mask`); other reads through a mask are refused by name and line.
- transformers' grouped experts (Mixtral's default: its custom op ``grouped_mm_fallback``, and
  ``histc``) had no converter: each expert's rows, cut out at run time, times its weight.
- ``avg_pool2d``/``avg_pool3d`` dropped ``divisor_override`` (a mean where torch gives each window's
  sum over the divisor). An unbatched average pool did not import: the converter returns its squeeze
  unnormalized, whose type the dtype wrapper reads (it now normalizes a converter's call first).
- No converter for ``torch.exp2``, ``torch.fmax``/``fmin``, ``torch.cummax``/``cummin``,
  ``F.adaptive_max_pool1d``/``2d``, ``torch.sort(stable=True)``, ``torch.kthvalue``, ``torch.msort``
  without the decomposition (tessera_tvm/frontend_order.py), ``torch.atan2`` in TileLang's TVM.
- ``torch.einsum`` over an empty K did not import (the decomposition views empty tensors, and
  Relax's reshape reads a 0 in the new shape as "keep this dim") nor build without it: a result with
  no elements is zeros of its shape, and a product with an empty operand zeros (:func:`_empty_product`).
- apache-tvm 0.27 could not build a fill of a computed tensor with an infinite or NaN value
  (``scores.masked_fill(mask, float("-inf"))``: "argument of type 'PrimType' is not iterable"):
  it is a ``where`` with a 0-d constant (:func:`_non_finite_fill`).
- ``torch.add``/``sub``/``rsub`` dropped ``alpha``; an integer ``clamp`` with one bound clipped at
  an infinite other bound turned into a finite integer (``i.clamp(min=1)`` of 2 gave 1);
  ``div(rounding_mode=...)`` and ``rsub`` made int32/float32 constants that int64/float16 tensors
  refused.

Without the decomposition (``run_ep_decomposition=False``):

- ``aten.batch_norm`` (an eval-mode ``nn.BatchNorm2d``) was read with the argument list of
  ``_native_batch_norm_legit``: ``training`` taken for the momentum and the momentum (0.1) for eps,
  and training mode always. ResNet-18 came out wrong with no error (relative L2 error 0.7).
- ``scaled_dot_product_attention`` refused a bool ``attn_mask`` ("Only a float mask is supported"):
  BERT and ViT pass one. Torch's meaning: True takes part, False is left out, and a query whose
  keys are all left out gets zeros (not NaN). The mask becomes an additive one (0 and the dtype's
  lowest finite number, so that a row left out entirely stays finite) and the result is multiplied
  by whether the row has any key, which is what torch's own decomposition of SDPA does.
- ``scaled_dot_product_attention`` dropped ``scale``: it always scaled by 1/sqrt(head dim). OPT and
  T5 scale their queries themselves and pass ``scale=1.0``, and came out wrong with no error (T5's
  encoder off by up to 1.0). A 2-D ``[S, D]`` query was run as one query in each of S heads, each
  seeing only its own key (the output was ``v``), and a 3-D one was refused. Now one
  ``R.nn.attention`` with the scale, operands of rank 2 and 3 given leading 1s.
- No converter for ``diff`` (transformers' mask code, on the position ids), ``to.device`` (LLaMA's
  rotary embedding), ``new_full``, ``new_empty``, ``where`` with a number, ``all``, ``prod`` over a
  dim, ``var``/``std`` over a dim, ``logical_or``/``logical_xor``, ``_assert_async`` (``one_hot``).

The module imports no TVM itself: the caller passes its ``tvm`` (as tessera_tvm/relax_rewrites.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .relax_rewrites import _type

__all__ = ["patch_exported_program_importer"]

_PATCHED = "_tessera_shared_fixes"


def patch_exported_program_importer(tvm) -> bool:
    """Install the converters of the module docstring in ``tvm``'s exported-program importer (once).
    Returns False where ``tvm`` has no torch frontend (or torch is missing)."""
    try:
        from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter
    except ImportError:
        return False
    if getattr(ExportedProgramImporter, _PATCHED, False):
        return True
    relax = tvm.relax
    original = ExportedProgramImporter.create_convert_map

    def create_convert_map(self):
        from .frontend_experts import _grouped_mm, _histc
        from .frontend_masks import _index, _index_put, _size_checked
        from .frontend_math import install_math_converters
        from .frontend_models import install_model_converters
        from .frontend_order import install_order_converters
        from .frontend_writes import install_write_converters

        table = original(self)
        install_order_converters(self, table, relax)
        table["batch_norm.default"] = lambda node: _batch_norm(self, node, relax)
        table.setdefault("diff.default", lambda node: _diff(self, node, relax))
        table.setdefault("to.device", lambda node: _to_device(self, node, relax))
        for name, fill in (("new_ones", 1), ("new_zeros", 0), ("new_full", None), ("new_empty", 0)):
            table[f"{name}.default"] = lambda node, fill=fill: _new_filled(self, node, fill, relax)
        for name in ("where.ScalarOther", "where.ScalarSelf", "where.Scalar"):
            table.setdefault(name, lambda node: _where_scalar(self, node, relax))
        for name in ("all.default", "all.dim", "all.dims"):
            table.setdefault(name, lambda node: _all(self, node, relax))
        for name, op in (("logical_or", relax.op.logical_or), ("logical_xor", relax.op.logical_xor)):
            # the inputs arrive bool (_COMPUTE_IN_RESULT)
            table.setdefault(
                f"{name}.default",
                lambda node, op=op: self.block_builder.emit(op(*(self.env[a] for a in node.args[:2]))),
            )
        if "expand.default" in table:
            table["expand.default"] = lambda node, plain=table["expand.default"]: _expand(self, node, plain, relax)
        for name in ("numpy_T.default", "t.default"):  # x.T, x.t(): the axes reversed
            table.setdefault(name, lambda node: self.block_builder.emit(relax.op.permute_dims(self.env[node.args[0]])))
        table.setdefault("mT.default", lambda node: _matrix_transpose(self, node, relax))
        table.setdefault("select_scatter.default", lambda node: _select_scatter(self, node, relax))
        if "view.default" in table:  # a functionalized graph's views
            table.setdefault("_unsafe_view.default", table["view.default"])
        table.setdefault("repeat_interleave.self_int", lambda node: _repeat_interleave(self, node, relax))
        table.setdefault("histc.default", lambda node: _histc(self, node, relax))
        # transformers' grouped experts (Mixtral's, Qwen-MoE's default): its own custom op
        table.setdefault("grouped_mm_fallback.default", lambda node: _grouped_mm(self, node, relax))
        for name in ("fill.Tensor", "fill.Scalar"):  # x[:, 0] = 5.0, functionalized
            table.setdefault(name, lambda node: _filled(self, node, relax))
        # torch.export's runtime checks (one_hot's bounds): nothing to compute
        table.setdefault("_assert_async.msg", lambda node: None)
        table["div.Tensor_mode"] = lambda node: _divide(self, node, relax)
        for name in ("rsub.Scalar", "rsub.Tensor"):
            table[name] = lambda node: _rsub(self, node, relax)
        for name in ("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar"):
            if name in table:
                table[name] = lambda node, name=name, plain=table[name]: _scaled_add(self, node, name, plain, relax)
        for name in ("clamp.default", "clamp.Tensor", "clamp_min.default", "clamp_max.default"):
            if name in table:
                table[name] = lambda node, name=name, plain=table[name]: _clamp(self, node, name, plain, relax)
        table.setdefault("prod.dim_int", lambda node: _prod_dim(self, node, relax))
        for name in ("avg_pool2d.default", "avg_pool3d.default"):
            if name in table:
                table[name] = lambda node, plain=table[name]: _avg_pool_divisor(self, node, plain, relax)
        if "index.Tensor" in table:
            table["index.Tensor"] = lambda node, plain=table["index.Tensor"]: _index(self, node, plain, relax)
        for name in ("index_put.default", "index_put_.default"):
            if name in table:
                table[name] = lambda node, plain=table[name]: _index_put(self, node, plain, relax)
        if "sym_size.int" in table:
            table["sym_size.int"] = lambda node, plain=table["sym_size.int"]: _size_checked(self, node, plain)
        for name, root in (("var.dim", False), ("std.dim", True)):
            table.setdefault(name, lambda node, root=root: _unbiased_variance(self, node, root, relax))
        attention = table.get("scaled_dot_product_attention.default")
        if attention is not None:
            table["scaled_dot_product_attention.default"] = lambda node: _attention(self, node, attention, relax)
        for name in ("masked_fill.Scalar", "full_like.default", "fill.Scalar"):
            if name in table:
                table[name] = lambda node, plain=table[name]: _non_finite_fill(self, node, plain, relax)
        for name in _EMPTY_PRODUCTS:
            if name in table:
                table[name] = lambda node, plain=table[name]: _empty_product(self, node, plain, relax)
        install_model_converters(self, table, relax)
        install_write_converters(self, table, relax)  # index_put with slices, index_copy, scatter_add
        install_math_converters(self, table, relax)  # float // and %, flip, celu, logaddexp, softshrink
        return {name: _in_torchs_dtype(self, name, convert, relax) for name, convert in table.items()}

    ExportedProgramImporter.create_convert_map = create_convert_map
    plain_import = ExportedProgramImporter.from_exported_program

    def from_exported_program(self, exported_program, *args, **kwargs):
        return plain_import(self, _without_mutations(exported_program), *args, **kwargs)

    ExportedProgramImporter.from_exported_program = from_exported_program
    from .frontend_errors import install_import_errors

    install_import_errors(ExportedProgramImporter)  # a failure names the op and the user's line
    setattr(ExportedProgramImporter, _PATCHED, True)
    return True


def _non_finite_fill(importer, node, plain, relax):
    """``aten.masked_fill.Scalar`` ``(x, mask, value)``, ``full_like`` / ``fill.Scalar`` ``(x, value)``
    with an infinite or NaN ``value``: a 0-d constant put where the mask is (broadcast to x's shape).
    The importers make ``full_like(x, value)``, which apache-tvm 0.27 cannot build from a computed x
    (topi's check of a non-finite fill reads the dtype as a string: "argument of type 'PrimType' is
    not iterable"): ``scores.masked_fill(mask, float("-inf"))``, the usual attention mask, did not
    build on either route. Finite values go to ``plain``."""
    import math

    import torch

    masked = "masked_fill" in str(node.target)
    value = _arg(node, 2 if masked else 1, "value", None)
    val = node.meta.get("val")
    if not isinstance(value, float) or math.isfinite(value) or not isinstance(val, torch.Tensor):
        return plain(node)
    dtype = importer._convert_data_type(val.dtype, importer.env)
    if not dtype.startswith(("float", "bfloat")):
        return plain(node)
    x = importer.env[node.args[0]]
    fill = relax.const(value, dtype)
    bb = importer.block_builder
    if masked:
        x = x if _dtype(x) == dtype else bb.emit(relax.op.astype(x, dtype))
        return bb.emit(relax.op.where(importer.env[node.args[1]], fill, x))
    return bb.emit(relax.op.broadcast_to(fill, _type(x).shape))


#: Products whose result is all zeros where an operand has no elements (a sum over an empty K).
_EMPTY_PRODUCTS = ("einsum.default", "mm.default", "bmm.default", "matmul.default")


def _empty_product(importer, node, plain, relax):
    """Zeros of torch's shape where an operand of ``node`` (one of :data:`_EMPTY_PRODUCTS`) has a static
    size of 0, else ``plain``. ``torch.einsum("ik,kj->ij", a, b)`` with a K of 0 did not build
    without the decomposition (``R.einsum``: "Divide by zero"), and a K=0 ``bmm`` built by apache-tvm
    returned uninitialised memory."""
    import torch

    operands = [a.meta.get("val") for a in node.all_input_nodes]
    if not any(isinstance(v, torch.Tensor) and any(isinstance(d, int) and d == 0 for d in v.shape) for v in operands):
        return plain(node)
    zeros = _zeros_as_torch(importer, node, relax)
    return plain(node) if zeros is None else zeros


def _zeros_as_torch(importer, node, relax):
    """Zeros of the shape and dtype torch.export recorded for ``node``, or None (none recorded, or a
    symbolic dim)."""
    import torch

    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(isinstance(d, int) for d in val.shape):
        return None
    dtype = importer._convert_data_type(val.dtype, importer.env)
    return importer.block_builder.emit(relax.op.zeros(relax.ShapeExpr(list(val.shape)), dtype))


def _avg_pool_divisor(importer, node, plain, relax):
    """``avg_pool2d``/``avg_pool3d`` with ``divisor_override``: each window's sum over that number.
    TVM's converter dropped it (``F.avg_pool2d(x, 2, divisor_override=3)`` came out as the mean over
    4, with no error). The sum is the average with the padding counted times torch's count of that
    average (the window clipped to the padded input: ``min(start + k, size + pad) - start`` per axis),
    constants of the static image size."""
    divisor = _arg(node, 6, "divisor_override", None)
    if divisor is None:
        return plain(node)
    x = importer.env[node.args[0]]
    spatial = 3 if "avg_pool3d" in str(node.target) else 2
    try:
        sizes = [int(d) for d in _type(x).shape.values[-spatial:]]
    except TypeError:  # a symbolic dim
        raise NotImplementedError(f"{node.target} with divisor_override on an image of dynamic size") from None

    def per_axis(value, default):
        value = default if value is None or (isinstance(value, list | tuple) and not value) else value
        return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)] * spatial

    kernel = per_axis(node.args[1], None)
    stride = per_axis(_arg(node, 2, "stride", None), kernel)
    padding = per_axis(_arg(node, 3, "padding", 0), 0)
    ceil_mode = bool(_arg(node, 4, "ceil_mode", False))
    bb, unbatched = importer.block_builder, _rank(x) == spatial + 1
    pool = relax.op.nn.avg_pool3d if spatial == 3 else relax.op.nn.avg_pool2d
    average = bb.emit(
        pool(
            bb.emit(relax.op.expand_dims(x, 0)) if unbatched else x,
            pool_size=kernel,
            strides=stride,
            padding=padding,
            ceil_mode=ceil_mode,
            count_include_pad=True,
            layout="NCDHW" if spatial == 3 else "NCHW",
        )
    )
    if unbatched:
        average = bb.emit(relax.op.squeeze(average, [0]))
    outs = [int(d) for d in _type(average).shape.values[-spatial:]]
    counts = np.ones(())
    for size, out, k, step, pad in zip(sizes, outs, kernel, stride, padding, strict=True):
        start = np.arange(out) * step - pad
        counts = np.multiply.outer(counts, np.minimum(start + k, size + pad) - start)
    factor = relax.const((counts / float(divisor)).astype(np.float32), _dtype(average))
    return bb.emit(relax.op.multiply(average, factor))


def _select_scatter(importer, node, relax):
    """``aten.select_scatter`` ``(x, src, dim, index)``: ``x`` with ``x.select(dim, index)`` replaced by
    ``src``, as a one-wide ``slice_scatter`` (what an in-place op on ``y[i]`` functionalizes to)."""
    x, src = importer.env[node.args[0]], importer.env[node.args[1]]
    dim, index = node.args[2], node.args[3]
    axis = dim % _rank(x)
    size = _type(x).shape.values[axis]
    if index < 0:
        index = index + size
    bb = importer.block_builder
    src = bb.emit(relax.op.expand_dims(src, axis))
    start, end, step = (relax.PrimValue(v) for v in (index, index + 1, 1))
    return bb.emit(relax.op.slice_scatter(x, src, start, end, step, axis=axis))


def _filled(importer, node, relax):
    """``aten.fill`` ``(x, value)``: a tensor of x's shape and dtype holding ``value`` (a number or a
    0-d tensor)."""
    x, value = importer.env[node.args[0]], node.args[1]
    value = importer.env[value] if not isinstance(value, (int, float, bool)) else relax.const(value, _dtype(x))
    if _dtype(value) != _dtype(x):
        value = importer.block_builder.emit(relax.op.astype(value, _dtype(x)))
    return importer.block_builder.emit(relax.op.full_like(x, value))


def _repeat_interleave(importer, node, relax):
    """``aten.repeat_interleave.self_int`` ``(x, repeats, dim=None)``: each element ``repeats`` times
    along ``dim`` (of the flattened ``x`` where dim is None)."""
    x, repeats = importer.env[node.args[0]], node.args[1]
    dim = _arg(node, 2, "dim", None)
    return importer.block_builder.emit(relax.op.repeat(x, repeats, axis=dim))


def _without_mutations(exported_program):
    """``exported_program`` functionalized where it still holds in-place ops (``run_ep_decomposition=False``
    imports torch.export's graph as it is; the default decomposition functionalizes it first). The
    converters of in-place ops compute a new value and leave every alias of the old one as it was:
    ``y[0].add_(10)`` did not change ``y``, with no error. ``run_decompositions({})`` rewrites the
    mutations (``add_`` of a view becomes ``add`` and ``select_scatter``) and keeps the ops whole."""
    import torch

    def mutates(node) -> bool:
        schema = getattr(node.target, "_schema", None)
        return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and schema.is_mutable

    if not any(mutates(node) for node in exported_program.graph.nodes):
        return exported_program
    return exported_program.run_decompositions({})


#: Ops that compute in their result's dtype: torch promotes the inputs first (``int_tensor / 2`` and
#: ``int_tensor + 0.5`` are float, ``bool_mask * 1.5`` is float, ``bool_mask.cumsum(-1)`` and
#: ``int32.cumsum(-1)`` count in int64, ``softmax(x, dtype=float64)`` is float64, an int's ``exp`` is
#: float). TVM's converters computed in the first input's dtype: integer division, a bool product, a
#: bool running sum, with no error. Their tensor inputs are cast to the result's dtype first (for
#: ``logical_*``, ``any`` and ``all``, whose result is bool, that is torch's "nonzero is true").
_COMPUTE_IN_RESULT = frozenset(
    """add sub rsub mul div true_divide floor_divide remainder fmod pow neg cumsum cumprod prod sum mean
    maximum minimum clamp clamp_min clamp_max softmax _softmax log_softmax _log_softmax exp exp2 expm1
    log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan tanh sigmoid erf atan atan2 asin acos sinh cosh fmax fmin
    logical_and logical_or logical_xor logical_not any all""".split()
)


def _in_torchs_dtype(importer, name: str, convert, relax):
    """``convert`` that gives the node torch's dtype (torch.export records it on each node, in
    ``node.meta["val"]``): the inputs of :data:`_COMPUTE_IN_RESULT` ops cast before, any other result
    of another dtype (a factory's ``dtype=`` ignored, int32 sort indices, ...) cast after."""
    packet = name.split(".")[0]

    def converted(node, *rest):
        want = _torch_dtypes(importer, node)
        if want is None:
            return convert(node, *rest)
        if isinstance(want, str) and _has_no_elements(node):
            # Relax's reshape reads a 0 in the new shape as "keep this dim": torch's decomposition of
            # an einsum over an empty K views empty tensors, which stopped the import ("Reshape
            # expects the new shape to be convertible"), and apache-tvm's build reshaped empty permutes.
            return _zeros_as_torch(importer, node, relax)
        held = {}
        common = _compared_in(node) if packet in _COMPARISONS else None
        if common is not None:
            common = importer._convert_data_type(common, importer.env)
        target = common or (want if packet in _COMPUTE_IN_RESULT and isinstance(want, str) else None)
        if packet in ("var", "std", "linalg_vector_norm", "norm") and want in ("float16", "bfloat16"):
            target = "float32"  # as torch: float16 squares overflowed (the var of [-400, 400] was inf)
        inputs = node.all_input_nodes
        if packet == "where" and isinstance(want, str):
            # torch.where(mask, float, int) is float: its two values in torch's dtype (TVM refused
            # values of two dtypes: "Binary operators must have the same datatype")
            target, inputs = want, [a for a in node.args[1:3] if a in inputs]
        if target is not None:
            for arg in inputs:
                value = importer.env.get(arg)
                if arg not in held and _is_tensor(value, relax) and _dtype(value) != target:
                    held[arg] = value
                    importer.env[arg] = importer.block_builder.emit(relax.op.astype(value, target))
        try:
            out = convert(node, *rest)
        finally:
            importer.env.update(held)
        if isinstance(out, relax.Call):
            # Some converters return a call not yet normalized (an unbatched avg_pool2d's squeeze):
            # its type is unknown until then ("The struct_info is not populated").
            out = importer.block_builder.normalize(out)
        return _cast_to(importer, out, want, relax)

    return converted


def _has_no_elements(node) -> bool:
    """Whether torch.export recorded ``node``'s result as a tensor of static shape with no elements."""
    import torch

    val = node.meta.get("val")
    shape = val.shape if isinstance(val, torch.Tensor) else ()
    return all(isinstance(d, int) for d in shape) and 0 in shape  # a symbolic size is not compared


#: Comparisons compare in the inputs' promoted dtype: ``int_tensor < 1.5`` compares as float (TVM made
#: the 1.5 an int 1, so a 1 was not below 1.5).
_COMPARISONS = frozenset("eq ne lt le gt ge".split())


def _compared_in(node):
    """torch's promoted dtype of a comparison's operands (FakeTensors and numbers), or None."""
    import torch

    operands = [a.meta.get("val") if hasattr(a, "meta") else a for a in node.args[:2]]
    if not all(isinstance(v, (torch.Tensor, int, float, bool)) for v in operands) or len(operands) != 2:
        return None
    return torch.result_type(*operands)


def _torch_dtypes(importer, node):
    """The dtype torch gives the node's result as TVM spells it; a tuple of them (None for a non-tensor)
    for a tuple of results; None where torch.export recorded none."""
    import torch

    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return importer._convert_data_type(val.dtype, importer.env)
    if isinstance(val, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in val):
        return tuple(
            importer._convert_data_type(v.dtype, importer.env) if isinstance(v, torch.Tensor) else None for v in val
        )
    return None


def _is_tensor(value, relax) -> bool:
    return isinstance(value, relax.Expr) and hasattr(_type(value), "dtype") and hasattr(_type(value), "shape")


def _cast_to(importer, out, want, relax):
    """``out`` cast to ``want`` (a dtype, or a tuple of them for a tuple result) where it differs."""
    bb = importer.block_builder
    if isinstance(want, str):
        return bb.emit(relax.op.astype(out, want)) if _is_tensor(out, relax) and _dtype(out) != want else out
    fields = getattr(_type(out), "fields", None) if isinstance(out, relax.Expr) else None
    if fields is None or len(fields) != len(want):
        return out
    casts = [w is not None and hasattr(f, "dtype") and str(f.dtype) != w for f, w in zip(fields, want, strict=True)]
    if not any(casts):
        return out
    items = [bb.emit(relax.TupleGetItem(out, i)) for i in range(len(fields))]
    return bb.emit(
        relax.Tuple(
            [bb.emit(relax.op.astype(x, w)) if cast else x for x, w, cast in zip(items, want, casts, strict=True)]
        )
    )


def _dtype(expr) -> str:
    return str(_type(expr).dtype)


def _rank(expr) -> int:
    return len(_type(expr).shape.values)


def _arg(node, index: int, name: str, default: Any) -> Any:
    """Argument ``index`` (keyword ``name``) of an aten call, or ``default``."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _given(importer, node, index: int, name: str, default: Any = None) -> Any:
    """:func:`_arg` with the graph's nodes in it replaced by their Relax values (a number stays a
    number), as the importer's own ``retrieve_args`` does for the positional ones."""
    return importer._retrieve_args(_arg(node, index, name, default))


def _batch_norm(importer, node, relax):
    """``aten.batch_norm`` ``(x, weight, bias, running_mean, running_var, training, momentum, eps,
    cudnn_enabled)``. Without running statistics torch normalises with the batch's, in eval mode too."""
    x = importer.env[node.args[0]]
    channels = int(_type(x).shape.values[1])
    dtype = _dtype(x)
    weight, bias, mean, var = (
        _arg(node, i, name, None) for i, name in enumerate(("weight", "bias", "running_mean", "running_var"), 1)
    )
    training = bool(_arg(node, 5, "training", False)) or mean is None or var is None

    def held(arg, fill):
        return importer.env[arg] if arg is not None else relax.const(np.full(channels, fill, dtype))

    out = importer.block_builder.emit(
        relax.op.nn.batch_norm(
            x,
            held(weight, 1.0),
            held(bias, 0.0),
            held(mean, 0.0),
            held(var, 1.0),
            axis=1,
            epsilon=float(_arg(node, 7, "eps", 1e-5)),
            center=bias is not None,
            scale=weight is not None,
            momentum=float(_arg(node, 6, "momentum", 0.1) or 0.0),
            training=training,
        )
    )
    return importer.block_builder.emit(relax.TupleGetItem(out, 0))


def _diff(importer, node, relax):
    """``aten.diff`` ``(x, n=1, dim=-1, prepend=None, append=None)``: ``x[1:] - x[:-1]`` along ``dim``,
    ``n`` times, after ``prepend`` and ``append`` are joined on; a bool tensor's is ``!=``."""
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    n = int(_arg(node, 1, "n", 1))
    rank = _rank(x)
    dim = int(_arg(node, 2, "dim", -1)) % rank
    parts = [p for p in (_given(importer, node, 3, "prepend"), x, _given(importer, node, 4, "append")) if p is not None]
    if len(parts) > 1:
        x = bb.emit(relax.op.concat(parts, axis=dim))
    step = relax.op.logical_xor if _dtype(x) == "bool" else relax.op.subtract  # (LLVM cannot != bools)
    # begin/end past the axis are clamped, so a symbolic length needs no size here
    last = np.iinfo(np.int64).max
    for _ in range(n):
        later = bb.emit(relax.op.strided_slice(x, axes=[dim], begin=[1], end=[last]))
        earlier = bb.emit(relax.op.strided_slice(x, axes=[dim], begin=[0], end=[-1]))
        x = bb.emit(step(later, earlier))
    return x


def _to_device(importer, node, relax):
    """``aten.to.device`` ``(x, device, dtype, non_blocking, copy, memory_format)``: the device is the
    module's own, so only the dtype counts."""
    x = importer.env[node.args[0]]
    dtype = _arg(node, 2, "dtype", None)
    if dtype is None:
        return x
    target = importer._convert_data_type(dtype, importer.env)
    return x if target == _dtype(x) else importer.block_builder.emit(relax.op.astype(x, target))


def _new_filled(importer, node, fill, relax):
    """``aten.new_ones`` / ``new_zeros`` / ``new_empty`` ``(x, size, *, dtype=None, ...)`` and
    ``aten.new_full`` ``(x, size, fill_value, *, dtype=None, ...)`` (``fill`` None): a tensor of
    ``size`` in ``dtype``, or in ``x``'s dtype when none is given (new_empty's is zeros)."""
    x = importer.env[node.args[0]]
    size = _given(importer, node, 1, "size")
    size = list(size) if isinstance(size, (list, tuple)) else [size]
    dtype = node.kwargs.get("dtype")
    dtype = _dtype(x) if dtype is None else importer._convert_data_type(dtype, importer.env)
    value = _arg(node, 2, "fill_value", None) if fill is None else fill
    return importer.block_builder.emit(relax.op.full(relax.ShapeExpr(size), relax.const(value, dtype), dtype))


def _where_scalar(importer, node, relax):
    """``aten.where.ScalarOther`` / ``ScalarSelf`` / ``Scalar`` ``(condition, x, y)`` with a Python number
    for ``y``, ``x`` or both, in the result's dtype (:func:`_in_torchs_dtype` casts it to torch's)."""
    cond, *sides = importer.retrieve_args(node)[:3]
    tensors = [v for v in sides if _is_tensor(v, relax)]
    dtype = _dtype(tensors[0]) if tensors else ("float32" if any(isinstance(v, float) for v in sides) else "int64")
    x, y = (v if _is_tensor(v, relax) else relax.const(v, dtype) for v in sides)
    return importer.block_builder.emit(relax.op.where(cond, x, y))


def _operand(importer, value, like, relax):
    """A tensor argument as it is, a Python number as a constant in ``like``'s dtype (TVM's
    converters made it int32 or float32, which a float16 or int64 tensor refused)."""
    return value if _is_tensor(value, relax) else relax.const(value, _dtype(like))


def _divide(importer, node, relax):
    """``aten.div.Tensor_mode`` ``(x, y, *, rounding_mode)``: None, ``"floor"`` or ``"trunc"``."""
    x, y = importer.retrieve_args(node)[:2]
    like = x if _is_tensor(x, relax) else y
    x, y = _operand(importer, x, like, relax), _operand(importer, y, like, relax)
    mode = _arg(node, 2, "rounding_mode", None)
    bb = importer.block_builder
    if mode == "floor":
        return bb.emit(relax.op.floor_divide(x, y))
    if mode == "trunc" and _dtype(like).startswith(("int", "uint")):
        # |x| // |y| with the sign of x * y: TVM's integer divide is not guaranteed to truncate
        magnitude = bb.emit(relax.op.floor_divide(bb.emit(relax.op.abs(x)), bb.emit(relax.op.abs(y))))
        negative = bb.emit(
            relax.op.logical_xor(
                bb.emit(relax.op.less(x, _operand(importer, 0, like, relax))),
                bb.emit(relax.op.less(y, _operand(importer, 0, like, relax))),
            )
        )
        return bb.emit(relax.op.where(negative, bb.emit(relax.op.negative(magnitude)), magnitude))
    quotient = bb.emit(relax.op.divide(x, y))
    if mode == "trunc":
        return bb.emit(relax.op.trunc(quotient))
    if mode is not None:
        from .errors import TesseraError

        raise TesseraError(f"{node.target}: rounding_mode {mode!r} is not one of None, 'floor', 'trunc'")
    return quotient


def _rsub(importer, node, relax):
    """``aten.rsub`` ``(x, other, alpha=1)``: ``other - alpha * x``."""
    x, other = importer.retrieve_args(node)[:2]
    alpha = _arg(node, 2, "alpha", 1)
    bb = importer.block_builder
    if alpha != 1:
        x = bb.emit(relax.op.multiply(x, _operand(importer, alpha, x, relax)))
    return bb.emit(relax.op.subtract(_operand(importer, other, x, relax), x))


def _scaled_add(importer, node, name: str, plain, relax):
    """``aten.add`` / ``aten.sub`` ``(x, y, *, alpha=1)``: ``x + alpha * y`` (TVM's converter dropped
    ``alpha``, so ``torch.add(x, y, alpha=3)`` was ``x + y``). Without an ``alpha``, ``plain``."""
    alpha = _arg(node, 2, "alpha", 1)
    if alpha == 1:
        return plain(node)
    x, y = importer.retrieve_args(node)[:2]
    like = x if _is_tensor(x, relax) else y
    bb = importer.block_builder
    y = bb.emit(relax.op.multiply(_operand(importer, y, like, relax), _operand(importer, alpha, like, relax)))
    op = relax.op.add if name.startswith("add") else relax.op.subtract
    return bb.emit(op(_operand(importer, x, like, relax), y))


def _clamp(importer, node, name: str, plain, relax):
    """``aten.clamp`` ``(x, min=None, max=None)`` (numbers or tensors), ``clamp_min`` ``(x, min)`` and
    ``clamp_max`` ``(x, max)`` of an integer tensor: TVM's converter clipped at an infinite bound,
    which an integer clip turned into a finite one (``i.clamp(min=1)`` of 2 gave 1). Floats go to
    ``plain``."""
    x = importer.env[node.args[0]]
    if not _dtype(x).startswith(("int", "uint")):
        return plain(node)
    if name.startswith("clamp_min"):
        low, high = _given(importer, node, 1, "min"), None
    elif name.startswith("clamp_max"):
        low, high = None, _given(importer, node, 1, "max")
    else:
        low, high = _given(importer, node, 1, "min"), _given(importer, node, 2, "max")
    bb = importer.block_builder
    for value, op in ((low, relax.op.maximum), (high, relax.op.minimum)):
        if value is None:
            continue
        if _is_tensor(value, relax) and _dtype(value) != _dtype(x):
            value = bb.emit(relax.op.astype(value, _dtype(x)))
        x = bb.emit(op(x, _operand(importer, value, x, relax)))
    return x


def _reduced_axes(node, rank: int):
    dim = _arg(node, 1, "dim", None)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return [int(d) % rank for d in (dim if isinstance(dim, (list, tuple)) else [dim])]


def _all(importer, node, relax):
    """``aten.all`` ``(x)`` / ``(x, dim, keepdim=False)``: the minimum of the truth values (the
    input arrives bool: :data:`_COMPUTE_IN_RESULT`)."""
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    axes = _reduced_axes(node, _rank(x))
    keepdim = bool(_arg(node, 2, "keepdim", False))
    smallest = bb.emit(relax.op.min(bb.emit(relax.op.astype(x, "int8")), axes, keepdims=keepdim))
    return bb.emit(relax.op.astype(smallest, "bool"))


def _prod_dim(importer, node, relax):
    """``aten.prod.dim_int`` ``(x, dim, keepdim=False, *, dtype=None)``."""
    x = importer.env[node.args[0]]
    return importer.block_builder.emit(
        relax.op.prod(x, _reduced_axes(node, _rank(x)), keepdims=bool(_arg(node, 2, "keepdim", False)))
    )


def _unbiased_variance(importer, node, root: bool, relax):
    """``aten.var.dim`` / ``std.dim`` ``(x, dim, unbiased=True, keepdim=False)``: Bessel-corrected
    unless ``unbiased`` is False."""
    x = importer.env[node.args[0]]
    correction = 1 if bool(_arg(node, 2, "unbiased", True)) else 0
    keepdim = bool(_arg(node, 3, "keepdim", False))
    return corrected_variance(importer, node, x, _reduced_axes(node, _rank(x)), keepdim, correction, root, relax)


def corrected_variance(importer, node, x, axes, keepdim: bool, correction, root: bool, relax, hint: str = ""):
    """torch's ``x.var(axes, correction=c)`` (``x.std`` when ``root``): the population variance times
    n / (n - c) (inf where n == c, as torch), n the number of elements reduced (``axes`` an int, a
    list, or None for all). A correction over a symbolic dim is refused, ``hint`` saying what to do."""
    bb = importer.block_builder
    out = bb.emit(relax.op.variance(x, axes, keepdims=keepdim))
    if correction != 0:
        shape = _type(x).shape.values
        reduced = range(len(shape)) if axes is None else [axes] if isinstance(axes, int) else axes
        sizes = [shape[int(a) % len(shape)] for a in reduced]
        if not all(hasattr(d, "value") for d in sizes):
            from .errors import TesseraError

            raise TesseraError(
                f"{node.target}: a variance with correction={correction} over a symbolic dim cannot be imported"
                + (
                    f" {hint}"
                    if hint
                    else "; use correction=0 (unbiased=False), or a static shape for the reduced dims"
                )
            )
        count = int(np.prod([int(d.value) for d in sizes]))
        scale = count / (count - correction) if count != correction else float("inf")
        out = bb.emit(relax.op.multiply(out, relax.const(scale, _dtype(out))))
    return bb.emit(relax.op.sqrt(out)) if root else out


def _attention(importer, node, plain, relax):
    """``aten.scaled_dot_product_attention`` ``(q, k, v, attn_mask=None, dropout_p=0.0,
    is_causal=False, scale=None, enable_gqa=False)`` on ``[..., S, D]`` operands of rank 2 to 4 as
    one ``R.nn.attention`` (see the module docstring: the importers' own dropped ``scale`` and ran
    2-D operands as one query per head). Dropout and other ranks go to ``plain``, which refuses them."""
    query = importer.env[node.args[0]]
    if not 2 <= _rank(query) <= 4 or _arg(node, 4, "dropout_p", 0.0) != 0.0:
        return plain(node)
    bb = importer.block_builder
    dtype = _dtype(query)

    def four_d(x):  # torch's [..., S, D] with leading 1s up to [B, H, S, D]
        shape = list(_type(x).shape.values)
        return x if len(shape) == 4 else bb.emit(relax.op.reshape(x, [1] * (4 - len(shape)) + shape))

    def heads_third(x):  # [B, H, S, D] <-> Relax's [B, S, H, D]
        return bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))

    mask = _arg(node, 3, "attn_mask", None)
    held = importer.env.get(mask) if mask is not None else None
    bias = held
    if held is not None and _dtype(held) == "bool":
        bias = bb.emit(relax.op.where(held, relax.const(0.0, dtype), relax.const(_lowest(dtype), dtype)))
    scale = _arg(node, 6, "scale", None)
    causal = "TopLeft" if _arg(node, 5, "is_causal", False) else None  # torch's: query i sees keys 0..i
    operands = [heads_third(four_d(importer.env[a])) for a in node.args[:3]]
    out = bb.emit(
        relax.op.nn.attention(
            *operands,
            bias=four_d(bias) if bias is not None else None,
            scale=float(scale) if scale is not None else None,
            causal_mask=causal,
        )
    )
    out = heads_third(out)
    if _rank(query) != 4:
        value = importer.env[node.args[2]]
        out = bb.emit(relax.op.reshape(out, list(_type(query).shape.values)[:-1] + [_type(value).shape.values[-1]]))
    if held is None or _dtype(held) != "bool":
        return out
    # [..., S_q, 1]: 1 where the query has a key to attend to, broadcast over the output's head dim
    any_key = bb.emit(relax.op.max(bb.emit(relax.op.astype(held, dtype)), axis=[-1], keepdims=True))
    return bb.emit(relax.op.multiply(out, any_key))


def _expand(importer, node, plain, relax):
    """``aten.expand`` ``(x, sizes)``: a -1 keeps the size of x's axis that it lines up with from the
    right, as new axes come first (``cls[H].expand(B, 1, -1)`` is [B, 1, H]). The importers counted
    from the left: that index was out of range, or another axis's size ([1, H] expanded to
    ``(B, -1, H)`` came out [B, H, H])."""
    x = importer.env[node.args[0]]
    shape = _type(x).shape if _is_tensor(x, relax) else None
    if not isinstance(shape, relax.ShapeExpr):
        return plain(node)
    sizes = importer._retrieve_args(list(node.args[1:]) if len(node.args) > 2 else node.args[1])
    new = len(sizes) - len(shape.values)
    out = [shape.values[i - new] if isinstance(n, int) and n == -1 else n for i, n in enumerate(sizes)]
    return importer.block_builder.emit(relax.op.broadcast_to(x, out))


def _matrix_transpose(importer, node, relax):
    """``x.mT``: the last two axes swapped."""
    x = importer.env[node.args[0]]
    axes = list(range(_rank(x)))
    axes[-2:] = axes[:-3:-1]
    return importer.block_builder.emit(relax.op.permute_dims(x, axes))


def _lowest(dtype: str) -> float:
    """The lowest finite number of a float dtype."""
    import ml_dtypes  # numpy's finfo for bfloat16 too

    return float(ml_dtypes.finfo(dtype).min)
