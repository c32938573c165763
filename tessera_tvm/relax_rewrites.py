"""Relax rewrites that run in whichever TVM the caller has: TileLang's (tessera_tvm.relax) or the
user's apache-tvm 0.27 (tessera_tvm.upstream), which share the relax.dpl API.

``rewrite_functions(mod, pattern, make, tvm)`` replaces the calls matching a dataflow pattern in
every Relax function. ``fold_batch_norms(mod, tvm)`` folds inference batch norms into the
convolution before them: it rewrites ``batch_norm(conv2d(x, W) [+ b], gamma, beta, mean, var)``
at inference (``training=False``, over the channels, W, b and the statistics constants, as a model
imported with its weights as constants has them) to ``conv2d(x, W * s) + ((b - mean) * s + beta)``
for ``s = gamma / sqrt(var + eps)``, so that the convolution kernel applies the norm as its bias.
The weights are scaled in float64 and rounded once to their dtype. The batch_norm's other two
outputs (the running statistics, unchanged at inference) stay the constants they were.

The module imports no TVM itself: TileLang's TVM passes its ``tvm`` (tessera_tvm.relax.recover) and
an upstream apache-tvm process passes its own (tessera_tvm.upstream folds before the weights are
lifted to parameters for the trip to the toolchain process).

``fold_constant_slices(mod, tvm)`` computes ``strided_slice`` and ``squeeze`` of constants ahead: a
part of a constant becomes a constant of its own. transformers' grouped experts (Mixtral) import as
one [E, N, K] weight sliced per expert at every call; folded, each expert's GEMM reads a constant
weight, which the CPU packs ahead like any linear's.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def fold_batch_norms(mod, tvm) -> tuple[Any, int]:
    """``mod`` with its foldable inference batch norms folded (see the module docstring), and how many."""
    relax, dpl = tvm.relax, tvm.relax.dpl
    x, weight, bias = dpl.wildcard(), dpl.is_const(), dpl.is_const()
    conv = dpl.is_op("relax.nn.conv2d")(x, weight)
    reshaped = dpl.is_op("relax.reshape")(bias, dpl.wildcard())  # torch's conv bias, as [1, O, 1, 1]
    biased = dpl.is_op("relax.add")(conv, reshaped | bias)
    gamma, beta, mean, var = (dpl.is_const() for _ in range(4))
    norm = dpl.is_op("relax.nn.batch_norm")(biased | conv, gamma, beta, mean, var)

    def rewrite(orig, m):
        attrs, conv_call = orig.attrs, m[conv]
        if bool(attrs.training) or int(attrs.axis) != 1:
            return None
        if (str(conv_call.attrs.data_layout), str(conv_call.attrs.kernel_layout)) != ("NCHW", "OIHW"):
            return None
        w = _data(m[weight])
        channels = w.shape[0]
        stats = [_data(m[p]).astype(np.float64) for p in (gamma, beta, mean, var)]
        if any(s.shape != (channels,) for s in stats):
            return None
        g, b, mu, sigma2 = stats
        g = g if bool(attrs.scale) else np.ones(channels)
        b = b if bool(attrs.center) else np.zeros(channels)
        scale = g / np.sqrt(sigma2 + float(attrs.epsilon))
        conv_bias = np.zeros(channels)
        if biased in m:
            value = _data(m[bias])
            # What is added must broadcast over the channels: [1, O, 1, 1] or [O, 1, 1], or any
            # constant of O values reshaped to one of those ([O] added as it is runs along W).
            added = _static_shape(m[reshaped]) if reshaped in m else value.shape
            if value.size != channels or tuple(added) not in ((1, channels, 1, 1), (channels, 1, 1)):
                return None
            conv_bias = value.reshape(channels).astype(np.float64)
        out_dtype = str(_type(orig).fields[0].dtype)
        folded_w = relax.const((w.astype(np.float64) * scale[:, None, None, None]).astype(w.dtype))
        folded_b = relax.const(((conv_bias - mu) * scale + b).reshape(1, channels, 1, 1).astype(out_dtype))
        out = relax.op.add(relax.Call(conv_call.op, [conv_call.args[0], folded_w], conv_call.attrs), folded_b)
        return relax.Tuple([out, orig.args[3], orig.args[4]])

    return rewrite_functions(mod, norm, lambda orig, m, _bindings: rewrite(orig, m), tvm)


def fold_constant_slices(mod, tvm) -> tuple[Any, int]:
    """``mod`` with every ``strided_slice`` and ``squeeze`` of a constant (a static result) replaced by
    the constant it computes (see the module docstring), and how many."""
    relax, dpl = tvm.relax, tvm.relax.dpl
    const = dpl.is_const()
    sliced = dpl.is_op("relax.strided_slice")(const, varg_default_wildcard=True)
    squeezed = dpl.is_op("relax.squeeze")(const)

    def fold(orig, m, _bindings):
        shape = _static_shape(orig)
        if not shape or not all(isinstance(d, int) for d in shape):
            return None
        value = _data(m[const])
        if orig.op.name == "relax.strided_slice":
            value = _sliced(value, orig.args[1:])
        elif value.size == int(np.prod(shape)):  # a squeeze: the same elements in the result's shape
            value = value.reshape(shape)
        if value is None or value.shape != shape:
            return None
        return relax.const(np.ascontiguousarray(value), str(_type(orig).dtype))

    return rewrite_functions(mod, sliced | squeezed, fold, tvm, rounds=4)


def _sliced(value: np.ndarray, args) -> np.ndarray | None:
    """``value[...]`` as ``strided_slice(value, axes, begin, end, strides)`` reads it (Python's slice
    rules, which TVM's clamping follows), None where an argument is not a tuple of integers."""
    lists = []
    for arg in args:
        fields = getattr(arg, "fields", None)
        if fields is None or not all(hasattr(getattr(f, "value", None), "value") for f in fields):
            return None
        lists.append([int(f.value.value) for f in fields])
    axes, begin, end = lists[:3]
    strides = lists[3] if len(lists) > 3 else [1] * len(axes)
    index = [slice(None)] * value.ndim
    for axis, b, e, step in zip(axes, begin, end, strides, strict=False):
        if step == 0 or not -value.ndim <= axis < value.ndim:
            return None
        index[axis] = slice(b, e, step)
    return value[tuple(index)]


def rewrite_functions(mod, pattern, make, tvm, rounds: int = 1) -> tuple[Any, int]:
    """Every Relax function of ``mod`` with the calls matching ``pattern`` replaced by ``make(orig,
    matched, bindings)`` (None: keep the call), up to ``rounds`` passes; and how many were replaced.
    ``bindings``: the function's var -> bound value. Dead bindings are dropped afterwards."""
    relax = tvm.relax
    count = 0
    state: dict[str, Any] = {}

    def rewrite(orig, matched):
        nonlocal count
        new = make(orig, matched, state["bindings"])
        if new is None:
            return orig
        count += 1
        return new

    out = mod
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function):
            continue
        rewritten = func
        for _ in range(rounds):
            before = count
            state["bindings"] = _bindings(rewritten, relax)
            rewritten = relax.dpl.rewrite_call(pattern, rewrite, rewritten)
            if count == before:
                break
        if not rewritten.same_as(func):
            out = out if out is not mod else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
            out[gv] = relax.transform.DeadCodeElimination()(tvm.IRModule({gv: rewritten}))[gv]
    return out, count


def _bindings(func, relax) -> dict:
    """var -> value of each VarBinding in ``func``'s blocks."""
    return {
        binding.var: binding.value
        for block in getattr(func.body, "blocks", [])
        for binding in block.bindings
        if isinstance(binding, relax.VarBinding)
    }


def _data(const) -> np.ndarray:
    """A constant's value (TileLang's TVM: ``.data``; apache-tvm 0.27: ``.value``)."""
    return (const.data if hasattr(const, "data") else const.value).numpy()


def _type(expr):
    """An expression's type (TileLang's TVM: ``.struct_info``; apache-tvm 0.27: ``.ty``)."""
    return expr.struct_info if hasattr(expr, "struct_info") else expr.ty


def _static_shape(expr) -> tuple[Any, ...]:
    """``expr``'s shape, each static dim an int (an IntImm has a value; a symbolic dim stays as it is)."""
    shape = getattr(_type(expr), "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return ()
    return tuple(int(d.value) if hasattr(d, "value") else d for d in shape.values)
