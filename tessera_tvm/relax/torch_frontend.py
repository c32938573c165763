"""What TVM's torch frontend imports wrong, put right.

A model imported with ``from_exported_program`` at its defaults must compute what torch computes.
These mistakes were found by importing ordinary PyTorch code and comparing with torch: some gave a
silently wrong answer, others stopped the import.

What both TVMs' importers get wrong (dtypes, ``alpha``, integer clamps, ``aten.batch_norm``,
``diff``, a bool SDPA mask, ...) is put right in tessera_tvm/frontend_fixes.py, which works in
either. This module holds what only TileLang's needs.

In the frontend of TileLang's TVM (``import tessera_tvm`` patches it, see :func:`patch_torch_frontend`;
apache-tvm 0.27 gets the first two right):

- ``var`` and ``std`` ignore ``correction``: ``x.var()`` and ``x.std()`` (Bessel-corrected by default
  in torch) came out as the population statistic.
- ``sum`` of a bool or integer tensor sums in that dtype: ``(x > 0).sum()`` came out as a bool (a
  count of 1), which also broke ``F.cross_entropy``'s mean over the targets. Torch sums in int64; the
  ``dtype=`` argument was ignored as well.
- ``elu`` ignores ``scale`` and ``input_scale``: ``F.selu`` (which torch exports as ``elu`` with
  both) came out as a plain ELU. apache-tvm 0.27 has this one too.
- ``F.group_norm`` without weight and bias (``nn.GroupNorm(affine=False)``) passed None for both to
  ``R.nn.group_norm``: "Found null pointer node while traversing AST" (apache-tvm 0.27 too).
- A float16 or bfloat16 matmul (``mm``, ``bmm``, ``matmul``, ``linear``, ``addmm``) came out
  float32, where torch gives the inputs' dtype. ``nn.Linear`` then added its half-precision bias to
  the float32 product (a dtype error on import), and a LayerNorm after it met float32 data and a
  float16 weight. Each now accumulates in float32 and casts the result to the inputs' dtype, as torch.
  So does a half-precision ``conv2d``, whose float32 result met its float16 bias (a dtype error on
  import: no float16 CNN imported).
- ``scaled_dot_product_attention`` (imported without the default decomposition) passes its
  ``attn_mask`` to ``R.nn.attention`` as the bias, which must be 4-D: a ``[S_q, S_kv]`` mask, which
  torch broadcasts, stopped the import ("The bias should have 4 dimensions").
- ``amax``, ``amin``, ``min.dim`` and ``diagonal`` have no converter, so ``x.amax(-1)``,
  ``torch.logsumexp``, ``x.min(dim)`` and ``logits.diagonal()`` did not import.
- A bfloat16 constant could not be made at all: ``x * 0.5``, ``x + 1.0``, ``x / 8`` and HF attention's
  ``* head_dim ** -0.5`` on a bfloat16 tensor stopped the import with "Invalid DataType bfloat16".
  ``relax.const(0.5, "bfloat16")`` builds a numpy array of ml_dtypes' bfloat16, and TileLang's
  replacement for tvm_ffi's dtype constructor (``tilelang.language.dtypes``) does not take that
  numpy dtype, which tvm_ffi's own does. It is given back (:func:`_accept_numpy_bfloat16`). As in
  float16, the constant is the number rounded to the tensor's dtype (to nearest, ties to even); torch
  holds it in float32, so a number bfloat16 cannot hold (0.1) may move a result by one bfloat16 spacing.

At the Relax level, in :func:`fix_imported`, which ``partition_for_tessera`` runs first:

- ``x[:, -1]`` (``select`` with a negative index) and ``x[:, [-1, 0]]`` import as ``R.take`` with the
  negative index as it is, in ``mode="fast"``, which reads before the start of the axis (in both TVMs).
- ``~mask`` on a bool tensor imports as ``R.bitwise_not``, which TileLang's TVM compiles to C that
  flips all 8 bits of the byte a bool is stored in: every element came out true.
- An operand of size 0 in ``R.concat`` (Phi-3's ``cat([rotated, q[..., rotary_dim:]])`` under full
  rotary): TVM's build stopped with "Divide by zero". It is left out of the concat.
- A reduction over an axis of size 0 (``x.sum(0)`` of a [0, 5] tensor, ``prod``, ``mean``, ``var``,
  ``amax`` inside ``logsumexp``) and a matmul whose K is 0: TVM's loops never run their init, so the
  result was the output's uninitialised memory, and a mean stopped the build ("Divide by zero"). Each
  becomes the value torch gives (0, 1, NaN; -inf for a max, the identity ``logsumexp`` relies on).
- Operators left to TVM that it computes wrong in bfloat16 (``sort``, ``topk`` and ``fmod`` worked
  on the raw bits, with no error) or cannot build in float16 or bfloat16 (``**``, ``argmax``,
  ``floor``, ``round``, ``atan``, ...): computed in float32 and rounded back, as torch does.
- Maxima and minima left to TVM (``amin``, ``min``, ``maximum``, ``minimum``, ``argmax``, ``argmin``,
  and ``amax`` where Tessera does not take it) dropped a NaN: TVM compares with ``<``, which a NaN
  never wins. They now give NaN (its index, for ``argmax``) as torch. So do the clips left to TVM
  (``clamp``, ``hardtanh``, ``relu``, ``relu6``, ``hardsigmoid``: a 0-d one, which Tessera does not
  take, gave a bound for a NaN; ``grad / grad.norm().clamp(min=1e-6)`` gave zeros where torch gives NaN).
- Sorts left to TVM (``sort``, ``argsort``, ``msort``, ``topk``, ``x.max(dim)``, which imports as
  ``topk``, and ``median``) misplaced a NaN, which torch orders above ``+inf``: ``x.sort(-1)`` of
  ``[1, nan, -0.0, 2]`` gave ``[-0.0, 1, nan, 2]`` (torch ``[-0.0, 1, 2, nan]``), ``x.max(-1)`` of
  ``[1, nan, 2]`` gave 2 and its index, ``median`` ignored the NaN. Each sorts a key in which NaN is
  above ``+inf`` (:func:`nan_ordered_sorts`). A half-precision ``median`` compared bit patterns, or
  did not build without a dim: it is computed in float32 too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._tvm import tilelang, tvm
from ..errors import TesseraError
from ..frontend_fixes import corrected_variance

relax = tvm.relax

__all__ = [
    "FIXES",
    "fix_imported",
    "half_ops_in_float32",
    "nan_ordered_sorts",
    "nan_propagating_extrema",
    "patch_torch_frontend",
]


# ---------------------------------------------------------------------------------------------
# At the Relax level (both TVMs)
# ---------------------------------------------------------------------------------------------


def fix_imported(mod) -> tuple[Any, dict[str, int]]:
    """``mod`` with the Relax-level mistakes of the import put right (run by ``partition_for_tessera``
    first); and how many of each, by what was wrong:

    - ``R.take(x, c, axis)`` with a constant ``c`` holding negative indices, on an axis of static
      size n: each index -n <= i < 0 becomes i + n (torch's meaning). Others are left for TVM.
    - ``R.bitwise_not`` of a bool tensor (``~mask``) becomes ``R.logical_not``: TVM's C code stores a
      bool in a byte and flips all its bits, so ``~True`` was still true.
    - (and the others of the module docstring; :data:`HALF` is :func:`half_ops_in_float32`'s)
    """
    rewrites = ((TAKE, _normalized_take), (NOT, _logical_not), (EMPTY, _concat_of_nonempty))
    return _rewrite_calls(mod, (*rewrites, (EMPTY_REDUCTION, _empty_reduction)), dict.fromkeys(FIXES, 0))


def half_ops_in_float32(mod) -> tuple[Any, int]:
    """``mod`` with the half-precision operators of :data:`_HALF_IN_FLOAT32` computed in float32; and
    how many. ``partition_for_tessera`` runs it after rebuilding the ops Tessera recognises (a
    bfloat16 GPT-2's ``power`` inside its tanh GELU becomes the GEMM's epilogue, not a cast power)."""
    out, counts = _rewrite_calls(mod, ((HALF, _half_in_float32),), {HALF: 0})
    return out, counts[HALF]


def nan_propagating_extrema(mod) -> tuple[Any, int]:
    """``mod`` with the maxima and minima left to TVM made to keep a NaN, as torch's do; and how many.
    TVM's ``max``/``min`` reductions, ``maximum``/``minimum`` and ``argmax``/``argmin`` compare with
    ``<``, which a NaN never wins: ``x.amin(-1)`` of a row holding a NaN gave the row's least number,
    ``argmax`` the index of the largest number (torch: the NaN, and its index). ``partition_for_tessera``
    runs it on what it leaves to TVM (Tessera's own max kernels keep NaN already)."""
    out, counts = _rewrite_calls(mod, ((NAN_EXTREMA, _nan_propagating),), {NAN_EXTREMA: 0})
    return out, counts[NAN_EXTREMA]


def _float_operand(call, ops: frozenset, dtypes: tuple[str, ...]):
    """``call``'s first argument where ``call`` is one of ``ops`` on a tensor whose dtype starts
    with one of ``dtypes``; else None."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name not in ops or not call.args:
        return None
    info = call.args[0].struct_info
    if not (isinstance(info, relax.TensorStructInfo) and str(info.dtype).startswith(dtypes)):
        return None
    return call.args[0]


def _nan_propagating(call):
    x = _float_operand(call, _EXTREMA, ("float", "bfloat"))
    if x is None:
        return None
    op, dtype = relax.op, str(x.struct_info.dtype)
    zero = relax.const(0.0, dtype)
    if call.op.name in _CLIPS:
        return op.where(_isnan(x), x, call)
    if call.op.name in ("relax.maximum", "relax.minimum"):
        y = call.args[1]
        if str(y.struct_info.dtype) != dtype:
            return None
        return op.where(_isnan(x), op.add(x, y), op.where(_isnan(y), op.add(x, y), call))
    axis, keepdims = call.attrs.axis, bool(call.attrs.keepdims)
    if call.op.name in ("relax.max", "relax.min"):
        # + the sum of the row's NaNs (0 where it has none): NaN where it has one, the extremum else
        return op.add(call, op.sum(op.where(_isnan(x), x, zero), axis, keepdims))
    # argmax/argmin: the first NaN's index where the row has one
    marks = op.astype(_isnan(x), "int8")
    has_nan = op.greater(op.max(marks, axis, keepdims), relax.const(0, "int8"))
    first_nan = op.argmax(marks, axis, keepdims)
    return op.where(has_nan, op.astype(first_nan, str(call.struct_info.dtype)), call)


#: Clips of one tensor: ``clamp``, ``hardtanh``, ``relu6``, ``hardsigmoid``, ``relu`` (and ``elu``,
#: built on relu) left to TVM, e.g. on a 0-d tensor (``grad / norm.clamp(min=1e-6)``), gave a bound
#: (or 0) for a NaN: TVM clips with ``<``.
_CLIPS = frozenset(("relax.clip", "relax.nn.relu", "relax.nn.relu6"))
_EXTREMA = frozenset(f"relax.{n}" for n in ("max", "min", "maximum", "minimum", "argmax", "argmin")) | _CLIPS


def _isnan(x):
    """``isnan(x)``, a half-precision ``x`` tested in float32: TVM has no bfloat16 isnan ("Data type
    bfloat16 not supported for isnan op": ``torch.maximum`` of bfloat16 tensors did not build)."""
    return relax.op.isnan(relax.op.astype(x, "float32") if str(x.struct_info.dtype) in _HALVES else x)


def nan_ordered_sorts(mod) -> tuple[Any, int]:
    """``mod`` with the sorts left to TVM putting a NaN where torch does; and how many. Torch orders
    NaN above every number (``+inf`` included): ``sort`` puts it last (first when descending),
    ``topk`` and ``x.max(dim)`` (imported as ``topk``) pick it first, ``median`` is NaN where the row
    holds one. TVM sorts with ``<``, which a NaN never wins: it stayed where it was and the numbers
    around it came out of order (``x.max(dim)`` of ``[1, nan, 2]`` gave 2). Each sort now sorts a
    key in which NaN is above ``+inf`` (:func:`_nan_last_order`) and gathers ``x`` by it; a
    ``median`` gives the first NaN and its index. ``partition_for_tessera`` runs it on what it leaves
    to TVM (Tessera has no sort kernel)."""
    out, counts = _rewrite_calls(mod, ((NAN_ORDER, _nan_ordered),), {NAN_ORDER: 0})
    return out, counts[NAN_ORDER]


def _nan_ordered(call):
    x = _float_operand(call, _SORTS, _SORTED_FLOATS)
    if x is None:
        return None
    info, op, attrs = x.struct_info, relax.op, call.attrs
    if call.op.name == "relax.median":
        return _nan_median(call, x)
    axis = int(attrs.axis)
    if call.op.name == "relax.argsort":
        return _nan_last_order(x, axis, bool(attrs.descending), str(attrs.dtype))
    if call.op.name == "relax.sort":
        return op.gather_elements(x, _nan_last_order(x, axis, bool(attrs.descending), "int64"), axis)
    k, largest, dtype = int(attrs.k), bool(attrs.largest), str(attrs.dtype)
    size = info.shape.values[axis % info.ndim] if isinstance(info.shape, relax.ShapeExpr) else None
    if k < 1 and size is None:
        return None  # every element of an axis of unknown size: left as imported
    k = k if k >= 1 else int(size)
    indices = _nan_last_order(x, axis, largest, dtype, first=k)
    values = op.gather_elements(x, indices, axis)
    return {"indices": indices, "values": values}.get(str(attrs.ret_type), relax.Tuple([values, indices]))


#: The sorts TVM computes with ``<``, and the dtypes :func:`_nan_last_order` orders.
_SORTS = frozenset(f"relax.{n}" for n in ("sort", "argsort", "topk", "median"))
_SORTED_FLOATS = ("float16", "bfloat16", "float32", "float64")
#: In float64, above every float32 number (float32's largest is 2**128): +inf becomes the first,
#: NaN the second, so that NaN sorts above +inf. Finite, as TVM's C code would print an inf literal.
_ABOVE_FLOAT32, _INF_KEY, _NAN_KEY = 2.0**200, 2.0**1000, 2.0**1020


def _nan_last_order(x, axis: int, descending: bool, dtype: str, first: int | None = None):
    """The positions that sort ``x`` along ``axis`` as torch does (NaN above +inf, ties in their
    order: TVM's sort is stable), as ``dtype``; only the ``first`` ones where given (``topk``).
    Below float64, one sort of a float64 key; a float64 ``x`` has no wider type, so it is sorted
    twice: by its numbers (NaN as 0), then stably by whether it is NaN."""
    op = relax.op
    if str(x.struct_info.dtype) != "float64":
        wide = op.astype(x, "float64")
        big = op.where(op.greater(wide, relax.const(_ABOVE_FLOAT32, "float64")), relax.const(_INF_KEY, "float64"), wide)
        key = op.where(op.isnan(wide), relax.const(_NAN_KEY, "float64"), big)
        if first is not None:
            return op.topk(key, first, axis, "indices", descending, dtype)
        return op.argsort(key, axis, descending, dtype)
    nan = op.isnan(x)
    by_number = op.argsort(op.where(nan, relax.const(0.0, "float64"), x), axis, descending, dtype)
    marks = op.gather_elements(op.astype(nan, "int32"), by_number, axis)
    order = op.gather_elements(by_number, op.argsort(marks, axis, descending, "int64"), axis)
    if first is None:
        return order
    return op.strided_slice(order, axes=[axis], begin=[0], end=[first])


def _nan_median(call, x):
    """``R.median`` as torch's: NaN, and the first NaN's index, where the reduced elements hold one."""
    op, attrs = relax.op, call.attrs
    axis, keepdims = attrs.axis, bool(attrs.keepdims)
    zero = relax.const(0.0, str(x.struct_info.dtype))
    nans = op.sum(op.where(op.isnan(x), x, zero), axis, keepdims)  # NaN where there is one, 0 else
    if not isinstance(call.struct_info, relax.TupleStructInfo):
        return op.add(call, nans)
    marks = op.astype(op.isnan(x), "int8")
    has_nan = op.greater(op.max(marks, axis, keepdims), relax.const(0, "int8"))
    index = relax.TupleGetItem(call, 1)
    first_nan = op.astype(op.argmax(marks, int(axis[0]) if axis else None, keepdims), str(index.struct_info.dtype))
    return relax.Tuple([op.add(relax.TupleGetItem(call, 0), nans), op.where(has_nan, first_nan, index)])


def _rewrite_calls(mod, rewrites, counts: dict[str, int]) -> tuple[Any, dict[str, int]]:
    """``mod`` with each call that one of ``rewrites`` ((what, rewrite) pairs) rewrites replaced by
    the first one's rewrite, counted in ``counts`` by what."""

    @relax.expr_functor.mutator
    class Fix(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            for what, rewrite in rewrites:
                fixed = rewrite(call)
                if fixed is not None:
                    counts[what] += 1
                    return fixed
            return call

    out = mod
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function):
            continue
        before = sum(counts.values())
        body = Fix(mod).visit_expr(func.body)
        if sum(counts.values()) != before:
            out = out if out is not mod else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
            fixed = relax.Function(func.params, body, func.ret_struct_info, func.is_pure, func.attrs, func.span)
            out[gv] = relax.analysis.remove_all_unused(fixed)  # an empty slice no longer used
    return out, counts


TAKE = "take with a negative index"
NOT = "bitwise_not of a bool"
EMPTY = "empty tensor in a concat"
EMPTY_REDUCTION = "reduction over an empty axis"
HALF = "half-precision op computed in float32"
NAN_EXTREMA = "max or min that dropped a NaN"
NAN_ORDER = "sort that misplaced a NaN"
FIXES = (TAKE, NOT, EMPTY, EMPTY_REDUCTION, HALF, NAN_EXTREMA, NAN_ORDER)


def _is_op(call, name: str) -> bool:
    return isinstance(call.op, tvm.ir.Op) and call.op.name == name


def _logical_not(call):
    if not _is_op(call, "relax.bitwise_not"):
        return None
    info = call.args[0].struct_info
    if not isinstance(info, relax.TensorStructInfo) or str(info.dtype) != "bool":
        return None
    return relax.op.logical_not(call.args[0])


def _concat_of_nonempty(call):
    """``R.concat`` without its operands of size 0, or None (no such operand). Phi-3 concatenates the
    rotated part of each head with the rest, which is empty under full rotary (``q[..., 16:]`` of a
    16-wide head); TVM's build then divided by that 0 ("Divide by zero", in RewriteDataflowReshape)."""
    if not _is_op(call, "relax.concat") or not isinstance(call.args[0], relax.Tuple):
        return None
    fields = list(call.args[0].fields)
    kept = [f for f in fields if not _is_empty(f)]
    if len(kept) == len(fields) or not kept:
        return None
    return kept[0] if len(kept) == 1 else relax.op.concat(kept, axis=call.attrs.axis)


#: What torch gives for a reduction over no elements (float results; an integer or bool sum and prod too).
_EMPTY_REDUCTIONS = {
    "relax.sum": 0.0,
    "relax.prod": 1.0,
    "relax.mean": float("nan"),
    "relax.variance": float("nan"),
    "relax.std": float("nan"),
    "relax.max": float("-inf"),  # the identity (torch refuses amax of nothing; its logsumexp takes -inf)
    "relax.min": float("inf"),
}


def _empty_reduction(call):
    """A reduction over an axis of size 0, or a matmul whose K is 0, as the value torch gives (the
    reduction's identity: zeros, ones, NaN for a mean); None for anything else. TVM's loops never
    run their init then: ``x.sum(0)`` of a [0, 5] tensor and ``a @ b`` of [3, 0] x [0, 4] returned
    whatever the output's memory held, and ``x.mean(0)`` stopped the build ("Divide by zero")."""
    out = call.struct_info
    if not isinstance(out, relax.TensorStructInfo) or out.shape is None or not call.args:
        return None
    data = call.args[0].struct_info
    if not isinstance(data, relax.TensorStructInfo) or not isinstance(data.shape, relax.ShapeExpr):
        return None
    dims = data.shape.values
    if _is_op(call, "relax.matmul"):
        value, reduced = 0.0, [dims[-1]]  # K: the last dim of A
    elif isinstance(call.op, tvm.ir.Op) and call.op.name in _EMPTY_REDUCTIONS:
        value = _EMPTY_REDUCTIONS[call.op.name]
        axes = call.attrs.axis
        reduced = list(dims) if axes is None else [dims[int(a) % len(dims)] for a in axes]
    else:
        return None
    if not _has_zero(reduced):
        return None
    dtype = str(out.dtype)
    if not np.isfinite(value) and not dtype.startswith(("float", "bfloat")):
        return None  # an integer mean or max of nothing: left as imported
    # A tensor constant, broadcast: TVM's C code would spell a NaN literal ``nanf``, a libm function.
    return relax.op.broadcast_to(relax.const(value, dtype), out.shape)


#: Operators TVM computes wrong, or cannot compile, in bfloat16 or float16 on the CPU (on what TVM's
#: bfloat16 legalisation leaves as raw bits, or with no half-precision lowering). Measured: bfloat16
#: ``fmod`` gave denormals (1e-38 for 0.625), ``sort`` and ``topk`` compared bit patterns (``topk``
#: 0.40 for 1.54), ``**``, ``argmax``, ``norm`` did not build ("power only applies to float"), and
#: float16 ``floor``, ``round``, ``atan``, ``sinh``, ``fmod``, ``remainder``, ``//`` did not build ("Unresolved call").
_HALF_IN_FLOAT32 = frozenset(
    f"relax.{name}"
    for name in "mod floor_mod floor_divide power argsort sort topk median argmax argmin isnan isinf isfinite floor ceil round trunc atan atan2 asin acos sinh cosh asinh acosh atanh".split()
)


def _half_in_float32(call):
    """``call`` computed in float32 where it is one of :data:`_HALF_IN_FLOAT32` on bfloat16 or float16
    tensors: its inputs cast up, its half-precision results rounded back (as torch computes them on
    the CPU). None for anything else."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name in _HALF_IN_FLOAT32):
        return None
    half = [
        isinstance(a.struct_info, relax.TensorStructInfo) and str(a.struct_info.dtype) in _HALVES for a in call.args
    ]
    if not any(half):
        return None
    args = [relax.op.astype(a, "float32") if h else a for a, h in zip(call.args, half, strict=True)]
    wide = relax.Call(call.op, args, call.attrs, call.sinfo_args)
    out = call.struct_info
    if isinstance(out, relax.TupleStructInfo):  # topk: (values, indices)
        fields = [_rounded_back(relax.TupleGetItem(wide, i), f) for i, f in enumerate(out.fields)]
        return relax.Tuple(fields)
    return _rounded_back(wide, out)


_HALVES = ("bfloat16", "float16")


def _rounded_back(expr, want):
    """``expr`` cast to the dtype of ``want`` (a TensorStructInfo) where that is a half precision."""
    dtype = str(want.dtype) if isinstance(want, relax.TensorStructInfo) else None
    return relax.op.astype(expr, dtype) if dtype in _HALVES else expr


def _is_empty(expr) -> bool:
    """Whether ``expr`` is a tensor with a static 0 in its shape."""
    info = expr.struct_info
    shape = info.shape if isinstance(info, relax.TensorStructInfo) else None
    return isinstance(shape, relax.ShapeExpr) and _has_zero(shape.values)


def _has_zero(dims) -> bool:
    """Whether one of ``dims`` is a static 0."""
    return any(isinstance(d, tvm.tirx.IntImm) and int(d) == 0 for d in dims)


def _normalized_take(call):
    """``call`` with its negative constant indices normalised, or None (not such a take)."""
    if not _is_op(call, "relax.take"):
        return None
    data, indices = call.args
    if not isinstance(indices, relax.Constant) or call.attrs.axis is None:
        return None
    shape = data.struct_info.shape if isinstance(data.struct_info, relax.TensorStructInfo) else None
    if shape is None or not isinstance(shape, relax.ShapeExpr):
        return None
    axis = int(call.attrs.axis) % len(shape.values)
    size = shape.values[axis]
    if not isinstance(size, tvm.tirx.IntImm):
        return None
    values = indices.data.numpy()
    n = int(size)
    wrapped = (values < 0) & (values >= -n)
    if not np.issubdtype(values.dtype, np.integer) or not wrapped.any():
        return None
    fixed = np.where(wrapped, values + n, values).astype(values.dtype)
    return relax.op.take(data, relax.const(fixed, str(values.dtype)), axis=int(call.attrs.axis), mode=call.attrs.mode)


# ---------------------------------------------------------------------------------------------
# The frontend of TileLang's TVM
# ---------------------------------------------------------------------------------------------

_PATCHED = "_tessera_fixed_convert_map"


def patch_torch_frontend() -> bool:
    """Give TileLang's torch frontend the converters the module docstring lists: torch's meaning
    for ``var``/``std``, ``sum``, ``elu``, ``native_group_norm``, half-precision matmuls and an
    attention mask of a lower rank, and the missing ``amax``, ``amin``, ``min.dim`` and ``diagonal``.
    Applied once, at ``import tessera_tvm``; a frontend that already handles ``correction``
    (apache-tvm's) is left alone (bfloat16 constants are made to work either way, see
    :func:`_accept_numpy_bfloat16`). Returns whether the frontend is patched."""
    _accept_numpy_bfloat16()
    try:
        from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter
    except ImportError:  # no torch frontend in this TVM build
        return False
    if getattr(ExportedProgramImporter, _PATCHED, False):
        return True
    if hasattr(ExportedProgramImporter, "_var_correction"):
        return False
    original = ExportedProgramImporter.create_convert_map

    def create_convert_map(self):
        table = original(self)
        plain_elu = table.get("elu.default")
        plain_conv2d, plain_convolution = table.get("conv2d.default"), table.get("convolution.default")
        plain_attention = table.get("scaled_dot_product_attention.default")
        fixes = {
            "var.correction": lambda node: _variance(self, node, root=False),
            "std.correction": lambda node: _variance(self, node, root=True),
            "sum.default": lambda node: _sum(self, node),
            "sum.dim_IntList": lambda node: _sum(self, node),
            "elu.default": lambda node: _elu(self, node, plain_elu),
            "native_group_norm.default": lambda node: _group_norm(self, node),
            "linear.default": lambda node: _linear(self, node),
            "addmm.default": lambda node: _addmm(self, node),
            "mm.default": lambda node: _matmul(self, node),
            "bmm.default": lambda node: _matmul(self, node),
            "matmul.default": lambda node: _matmul(self, node),
            "conv2d.default": lambda node: _conv2d(self, node, plain_conv2d),
            # what the frontend's default decomposition turns conv2d into (the bias is args[2] too)
            "convolution.default": lambda node: _conv2d(self, node, plain_convolution),
            "scaled_dot_product_attention.default": lambda node: _attention(self, node, plain_attention),
        }
        table.update({name: fix for name, fix in fixes.items() if name in table})
        # Missing, so `x.amax(-1)` and `torch.logsumexp` (which torch exports through amax) failed
        # with "Unsupported function types ['amax.default']".
        for name, reduce in (("amax.default", relax.op.max), ("amin.default", relax.op.min)):
            table.setdefault(name, lambda node, reduce=reduce: _extreme(self, node, reduce))
        table.setdefault("min.dim", lambda node: _min_dim(self, node))  # `x.min(dim)`, as max.dim
        table.setdefault("diagonal.default", lambda node: _diagonal(self, node))  # `logits.diagonal()`
        return table

    ExportedProgramImporter.create_convert_map = create_convert_map
    setattr(ExportedProgramImporter, _PATCHED, True)
    return True


def _accept_numpy_bfloat16() -> None:
    """Let TileLang's dtype constructor take numpy's bfloat16 (from ml_dtypes), as tvm_ffi's does, so
    that ``relax.const(value, "bfloat16")`` (a numpy bfloat16 array made a TVM tensor) works: the
    frontend makes its scalars in the tensor's dtype this way in many converters, and so do ours."""
    try:
        import ml_dtypes
    except ImportError:  # no numpy bfloat16 to take
        return
    table = getattr(getattr(tilelang.language, "dtypes", None), "_DTYPE_TO_STR", None)
    if isinstance(table, dict):
        table.setdefault(np.dtype(ml_dtypes.bfloat16), "bfloat16")


def _variance(importer, node, *, root: bool):
    """``aten.var.correction`` / ``aten.std.correction``: ``(x, dim=None, *, correction=None,
    keepdim=False)``, correction None meaning 1."""
    args = importer.retrieve_args(node)
    dim = _axes(args[1] if len(args) > 1 else node.kwargs.get("dim"))
    correction = node.kwargs.get("correction")
    correction = 1 if correction is None else correction
    hint = "(TileLang's TVM computes only the population variance); use correction=0, or a static shape for the reduced dims"
    keepdim = bool(node.kwargs.get("keepdim", False))
    return corrected_variance(importer, node, args[0], dim, keepdim, correction, root, relax, hint)


def _axes(dim):
    """A reduction's ``dim`` argument as Relax takes it: None (every axis) for torch's None or ``[]``."""
    return None if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0) else dim


def _sum(importer, node):
    """``aten.sum.default`` ``(x, *, dtype=None)`` / ``aten.sum.dim_IntList`` ``(x, dim, keepdim=False,
    *, dtype=None)``: bool and integer inputs sum in int64 unless ``dtype`` says otherwise."""
    args = importer.retrieve_args(node)
    x = args[0]
    dim = _axes(args[1] if len(args) > 1 else node.kwargs.get("dim"))
    keepdim = bool(args[2] if len(args) > 2 else node.kwargs.get("keepdim", False))
    bb = importer.block_builder
    dtype = node.kwargs.get("dtype")
    source = str(x.struct_info.dtype)
    if dtype is not None:
        target = importer._convert_data_type(dtype, importer.env)
    elif source == "bool" or (source.startswith(("int", "uint")) and source != "int64"):
        target = "int64"
    else:
        target = source
    if target != source:
        x = bb.emit(relax.op.astype(x, target))
    return bb.emit(relax.op.sum(x, dim, keepdims=keepdim))


def _elu(importer, node, plain):
    """``aten.elu`` ``(x, alpha=1, scale=1, input_scale=1)``: ``scale * x`` above 0, ``scale * alpha *
    (exp(input_scale * x) - 1)`` below."""
    args = list(node.args) + [None] * 4
    scale = args[2] if args[2] is not None else node.kwargs.get("scale", 1.0)
    input_scale = args[3] if args[3] is not None else node.kwargs.get("input_scale", 1.0)
    if scale == 1 and input_scale == 1:
        return plain(node)
    x = importer.env[node.args[0]]
    alpha = args[1] if args[1] is not None else node.kwargs.get("alpha", 1.0)
    dtype = str(x.struct_info.dtype)
    below = relax.op.nn.relu(
        relax.op.subtract(relax.const(1.0, dtype), relax.op.exp(relax.op.multiply(x, relax.const(input_scale, dtype))))
    )
    elu = relax.op.subtract(relax.op.nn.relu(x), relax.op.multiply(relax.const(alpha, dtype), below))
    return importer.block_builder.emit(relax.op.multiply(relax.const(scale, dtype), elu))


def _extreme(importer, node, reduce):
    """``aten.amax`` / ``aten.amin`` ``(x, dim=[], keepdim=False)``; an empty ``dim`` reduces every axis."""
    args = importer.retrieve_args(node)
    x = args[0]
    dim = _axes(args[1] if len(args) > 1 else node.kwargs.get("dim"))
    keepdim = bool(args[2] if len(args) > 2 else node.kwargs.get("keepdim", False))
    return importer.block_builder.emit(reduce(x, dim, keepdims=keepdim))


def _group_norm(importer, node):
    """``aten.native_group_norm`` ``(x, weight, bias, N, C, HxW, group, eps)``; a missing weight is
    ones and a missing bias zeros (R.nn.group_norm needs both)."""
    x = importer.env[node.args[0]]
    channels = int(node.args[4])
    dtype = str(x.struct_info.dtype)
    weight = importer.env.get(node.args[1]) if node.args[1] is not None else relax.const(np.ones(channels, dtype))
    bias = importer.env.get(node.args[2]) if node.args[2] is not None else relax.const(np.zeros(channels, dtype))
    rank = len(x.struct_info.shape)
    return importer.block_builder.emit(
        relax.op.nn.group_norm(
            x,
            weight,
            bias,
            num_groups=int(node.args[6]),
            channel_axis=1,
            axes=list(range(2, rank)),
            epsilon=float(node.args[7]),
        )
    )


def _min_dim(importer, node):
    """``aten.min.dim`` ``(x, dim, keepdim=False)``: (values, int64 indices of the first minimum)."""
    x = importer.env[node.args[0]]
    dim = int(node.args[1])
    keepdim = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))
    bb = importer.block_builder
    values = bb.emit(relax.op.min(x, dim, keepdims=keepdim))
    indices = bb.emit(relax.op.argmin(x, dim, keepdims=keepdim))
    if str(indices.struct_info.dtype) != "int64":
        indices = bb.emit(relax.op.astype(indices, "int64"))
    return bb.emit(relax.Tuple([values, indices]))


def _half(dtype: str) -> bool:
    return dtype in ("float16", "bfloat16")


def _as_torch(importer, result, dtype: str):
    """``result`` (float32) in ``dtype`` when that is half precision, as torch returns a matmul."""
    return importer.block_builder.emit(relax.op.astype(result, dtype)) if _half(dtype) else result


def _matmul(importer, node):
    """``aten.mm`` / ``bmm`` / ``matmul`` ``(a, b)``: accumulated in float32, in the inputs' dtype."""
    a, b = (importer.env[arg] for arg in node.args[:2])
    dtype = str(a.struct_info.dtype)
    out = importer.block_builder.emit(relax.op.matmul(a, b, out_dtype="float32"))
    return _as_torch(importer, out, dtype)


def _conv2d(importer, node, plain):
    """``aten.conv2d`` / ``aten.convolution``: TileLang's converter accumulates in float32 and adds the
    bias as it is; for half-precision inputs the bias goes in as float32 and the result comes back
    in the inputs' dtype."""
    dtype = str(importer.env[node.args[0]].struct_info.dtype)
    bias = node.args[2] if len(node.args) > 2 else None
    held = importer.env.get(bias) if _half(dtype) and bias is not None else None
    if held is not None:
        importer.env[bias] = importer.block_builder.emit(relax.op.astype(held, "float32"))
    try:
        out = plain(node)
    finally:
        if held is not None:
            importer.env[bias] = held
    return out if str(out.struct_info.dtype) == dtype else _as_torch(importer, out, dtype)


def _attention(importer, node, plain):
    """``aten.scaled_dot_product_attention`` ``(q, k, v, attn_mask=None, ...)``: torch broadcasts a
    mask of a lower rank (``[S_q, S_kv]``); Relax's attention bias is 4-D, so it gets leading 1s."""
    mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    held = importer.env.get(mask) if mask is not None else None
    shape = held.struct_info.shape if held is not None else None
    if shape is None or len(shape) >= 4:
        return plain(node)
    importer.env[mask] = importer.block_builder.emit(relax.op.reshape(held, [1] * (4 - len(shape)) + list(shape)))
    try:
        return plain(node)
    finally:
        importer.env[mask] = held


def _linear(importer, node):
    """``aten.linear`` ``(x, weight, bias=None)``: ``x @ weight.T + bias``, accumulated in float32
    and returned in the inputs' dtype."""
    args = importer.retrieve_args(node)
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    bb = importer.block_builder
    if bias is not None and str(bias.struct_info.dtype) != "float32":
        bias = bb.emit(relax.op.astype(bias, "float32"))
    out = bb.emit(relax.op.linear(x, weight, bias, "float32"))
    return _as_torch(importer, out, str(x.struct_info.dtype))


def _addmm(importer, node):
    """``aten.addmm`` ``(bias, a, b, *, beta=1, alpha=1)``: ``beta * bias + alpha * (a @ b)`` in
    float32, returned in the inputs' dtype."""
    bias, a, b = (importer.env[arg] for arg in node.args[:3])
    alpha, beta = node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
    bb = importer.block_builder
    dtype = str(a.struct_info.dtype)
    out = bb.emit(relax.op.matmul(a, b, out_dtype="float32")) if alpha != 0 else None
    if out is not None and alpha != 1:
        out = bb.emit(relax.op.multiply(out, relax.const(alpha, "float32")))
    if beta != 0:
        if str(bias.struct_info.dtype) != "float32":
            bias = bb.emit(relax.op.astype(bias, "float32"))
        if beta != 1:
            bias = bb.emit(relax.op.multiply(bias, relax.const(beta, "float32")))
        out = bias if out is None else bb.emit(relax.op.add(bias, out))
    return _as_torch(importer, out, dtype)


def _diagonal(importer, node):
    """``aten.diagonal`` ``(x, offset=0, dim1=0, dim2=1)`` over static dims: the two dims moved last
    and merged, then the diagonal's flat positions taken, as a last axis (torch's layout)."""
    x = importer.env[node.args[0]]
    args = list(node.args) + [None] * 3
    offset = args[1] if args[1] is not None else node.kwargs.get("offset", 0)
    dim1 = args[2] if args[2] is not None else node.kwargs.get("dim1", 0)
    dim2 = args[3] if args[3] is not None else node.kwargs.get("dim2", 1)
    shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in x.struct_info.shape]
    rank = len(shape)
    dim1, dim2 = dim1 % rank, dim2 % rank
    rows, cols = shape[dim1], shape[dim2]
    if rows is None or cols is None or any(d is None for d in shape):
        raise TesseraError(f"{node.target}: the diagonal of a tensor with symbolic dims cannot be imported")
    rest = [d for d in range(rank) if d not in (dim1, dim2)]
    bb = importer.block_builder
    moved = bb.emit(relax.op.permute_dims(x, [*rest, dim1, dim2]))
    flat = bb.emit(relax.op.reshape(moved, [*(shape[d] for d in rest), rows * cols]))
    first_row, first_col = max(-offset, 0), max(offset, 0)
    length = max(min(rows - first_row, cols - first_col), 0)
    positions = np.array([(first_row + i) * cols + first_col + i for i in range(length)], "int64")
    return bb.emit(relax.op.take(flat, relax.const(positions), axis=len(rest)))
