"""Relax functions as Tessera kernels: ``tessera.from_relax`` (also ``tessera_tvm.relax.from_relax``).

    kernel = tessera.from_relax(mod["main"])     # a @tessera.kernel
    ts.compile(kernel, target="cpu")(a, w, b)    # when main uses only Tessera's op set

The kernel's body interprets the Relax function with ``tessera.ops``: tracing it gives Tessera's
Graph IR, running it on numpy gives the reference semantics, and ``ts.compile`` takes it like any
kernel. An operator outside Tessera's op set raises :class:`~tessera_tvm.relax.NotInOpSet` naming it
and the op set (``tessera_tvm.relax.interop.OP_SET``).
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any

from tessera_tvm import op_table, tvm
from tessera_tvm.errors import TesseraError
from tessera_tvm.graph.nodes import Node, clip_bounds, flatten
from tessera_tvm.relax import interop
from tessera_tvm.relax.interop import OP_SET, NotInOpSet
from tessera_tvm.relax.patterns import swaps_last_two

from . import ops
from .kernel import kernel
from .types import Tensor, dtype

__all__ = ["from_relax"]

relax = tvm.relax
tir = tvm.tirx


@dataclass(frozen=True)
class _Transposed:
    """``permute_dims`` of the last two axes: only a matmul operand can read it."""

    value: Any
    binding: str


@dataclass(frozen=True)
class _BSHD:
    """A [B, H, S, D] tensor viewed as [B, S, H, D] (Tessera's attention is emitted this way)."""

    value: Any
    binding: str


@dataclass(frozen=True)
class _Fill:
    """``R.ones`` / ``R.zeros``: a layer/rms norm without that weight/bias."""

    kind: str
    binding: str


def _dim(d) -> int | str:
    if isinstance(d, tir.IntImm):
        return int(d.value)
    if isinstance(d, tir.Var):
        return str(d.name)
    raise NotInOpSet(f"dim {d} is an expression; Tessera kernel parameters take names or ints")


def _tensor_type(sinfo, what: str):
    if not isinstance(sinfo, relax.TensorStructInfo) or sinfo.shape is None:
        raise NotInOpSet(f"{what} is {sinfo}; Tessera kernels take tensors of known rank")
    dims = tuple(_dim(d) for d in sinfo.shape.values)
    return Tensor[(*dims, dtype(str(sinfo.dtype)))]


def _interpret(func, name: str):
    """``body(*tensors)`` evaluating ``func`` with ``tessera.ops`` (traced or on numpy)."""

    flat = flatten(func, name)

    def frontend(op):  # the tessera.ops function (and keywords) of an op-table entry
        return functools.partial(getattr(ops, op.frontend), **dict(op.frontend_kwargs))

    unary = {op.relax: frontend(op) for op in op_table.UNARY if op.frontend and not op.attrs}
    binary = {op.relax: frontend(op) for op in op_table.BINARY if op.frontend}
    reduce = {op.relax[0]: getattr(ops, op.frontend) for op in op_table.anchors("reduce")}

    def body(*tensors):
        env: dict[Any, Any] = dict(zip(flat.params, tensors, strict=True))

        def val(expr, node: Node):
            if isinstance(expr, relax.Constant):
                if expr.data.shape:
                    raise NotInOpSet(f"{name}: {node.name} reads a tensor constant; pass it as a parameter")
                return float(expr.data.numpy())
            return env[expr]

        for node in flat.nodes:
            args = [val(a, node) for a in node.args if not isinstance(a, relax.ShapeExpr | relax.PrimValue)]
            env[node.var] = _apply(node, args, unary, binary, reduce, name)
        outs = [env[o] for o in flat.outputs]
        for value in outs:
            if isinstance(value, _Transposed | _BSHD | _Fill):
                raise NotInOpSet(f"{name}: returns {value.binding}, a layout view Tessera's op set cannot return")
        return tuple(outs) if flat.tuple_output else outs[0]

    return flat, body


#: Which layout views each operator may read (anything else reading one is outside the op set).
_VIEWS_READ = {"matmul": (_Transposed,), "nn.attention": (_BSHD,), "permute_dims": (_BSHD,)}
_VIEWS_READ.update(dict.fromkeys(op_table.relax_ops("norm"), (_Fill,)))


def _apply(node: Node, args: list, unary, binary, reduce, name: str):
    op = node.op
    allowed = _VIEWS_READ.get(op, ())
    for a in args:
        if isinstance(a, _Transposed | _BSHD | _Fill) and not isinstance(a, allowed):
            what = {_Transposed: "a matmul operand transpose", _BSHD: "a layout change around attention"}.get(
                type(a), "a norm's absent weight or bias"
            )
            raise NotInOpSet(f"{name}: {node.name} = R.{op} reads {a.binding}, which Tessera has only as {what}")
    if op in unary:
        return unary[op](args[0])
    if op in binary:
        return binary[op](args[0], args[1])
    if op in reduce:
        axis = node.attrs.get("axis")
        return reduce[op](
            args[0], axis=tuple(axis) if axis is not None else None, keepdims=bool(node.attrs.get("keepdims"))
        )
    if op == "astype":
        return ops.cast(args[0], node.attrs["dtype"])
    if op == "clip":
        bounds = clip_bounds(node)
        if bounds is None:
            raise NotInOpSet(f"{name}: {node.name} = R.clip with bounds that are not constants")
        lo, hi = (b if math.isfinite(b) else None for b in bounds)
        return ops.clip(args[0], lo, hi)
    if op == "nn.softmax":
        return ops.softmax(args[0], axis=int(node.attrs["axis"]))
    if op in ("ones", "zeros"):
        return _Fill(op, node.name)
    if op == "permute_dims":
        x = args[0]
        if isinstance(x, _BSHD) and tuple(node.attrs.get("axes") or ()) == (0, 2, 1, 3):
            return x.value
        if tuple(node.attrs.get("axes") or ()) == (0, 2, 1, 3):
            return _BSHD(x, node.name)
        if swaps_last_two(node) and not isinstance(x, _Transposed | _BSHD):
            return _Transposed(x, node.name)
        raise NotInOpSet(
            f"{name}: {node.name} = permute_dims{node.attrs.get('axes')}: Tessera has no general transpose"
        )
    if op == "matmul":
        a, b = args
        out_dtype = node.attrs.get("out_dtype")
        kwargs: dict[str, Any] = {}
        if out_dtype not in (None, "", "void"):
            kwargs["out_dtype"] = out_dtype
        ta, tb = isinstance(a, _Transposed), isinstance(b, _Transposed)
        return ops.matmul(a.value if ta else a, b.value if tb else b, transpose_a=ta, transpose_b=tb, **kwargs)
    if op in op_table.relax_ops("norm"):
        rank = len(node.var.struct_info.shape.values)
        if tuple(int(a) % rank for a in node.attrs["axes"]) != (rank - 1,):
            raise NotInOpSet(f"{name}: {node.name} normalises axes {node.attrs['axes']}; Tessera's norms take the last")
        weight = None if isinstance(args[1], _Fill) else args[1]
        if op == "nn.rms_norm":
            return ops.rms_norm(args[0], weight, eps=float(node.attrs["epsilon"]))
        bias = None if isinstance(args[2], _Fill) or not node.attrs.get("center") else args[2]
        weight = weight if node.attrs.get("scale") else None
        return ops.layer_norm(args[0], weight, bias, eps=float(node.attrs["epsilon"]))
    if op == "nn.attention":  # R.nn.attention_bias too: its bias [B, H, S_q, S_kv] is in Tessera's layout
        if not all(isinstance(a, _BSHD) for a in args[:3]):
            raise NotInOpSet(
                f"{name}: {node.name} = attention on [B, S, H, D] tensors; Tessera's flash_attention is on "
                "[B, H, S, D] (permute_dims(x, [0, 2, 1, 3]) around R.nn.attention, as Tessera emits it)"
            )
        bias = args[3] if len(args) > 3 else None
        if isinstance(bias, _BSHD):
            raise NotInOpSet(f"{name}: {node.name} = attention with the bias {bias.binding}, a layout view")
        mask = node.attrs.get("causal_mask")
        out = ops.flash_attention(
            *(a.value for a in args[:3]),
            causal=mask is not None,
            scale=node.attrs.get("scale"),
            causal_align="bottom_right" if mask == "BottomRight" else "top_left",
            bias=bias,
        )
        return _BSHD(out, node.name)
    raise NotInOpSet(
        f"{name}: {node.name} = R.{op} is not in Tessera's op set; ts.compile takes Relax functions that use "
        f"only: {', '.join('R.' + o for o in OP_SET)}"
    )


def _identifier(name: str, taken: set[str]) -> str:
    """``name`` as a Python identifier (``fc1.weight`` -> ``fc1_weight``), distinct from ``taken``."""
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "t"
    base = f"t_{base}" if base[0].isdigit() else base
    out, i = base, 1
    while out in taken:
        out, i = f"{base}_{i}", i + 1
    return out


def from_relax(func, *, name: str | None = None):
    """A ``@tessera.kernel`` computing the Relax function ``func`` (which must use Tessera's op set).

    Parameter names (made identifiers: ``fc1.weight`` -> ``fc1_weight``) and types come from
    ``func``'s parameters (symbolic dims stay named). The
    operators are checked when the kernel is traced (``kernel.graph()``, ``ts.compile``), and an
    operator outside the op set raises :class:`NotInOpSet` naming it.
    """
    if not isinstance(func, relax.Function):
        raise TesseraError(f"from_relax takes a relax.Function, found {type(func).__name__}")
    name = name or (
        str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else "relax_function"
    )
    flat, body = _interpret(func, name)
    params = []
    for p in flat.params:
        pname = _identifier(str(p.name_hint), {q.name for q in params})
        params.append(
            inspect.Parameter(
                pname, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=_tensor_type(p.struct_info, pname)
            )
        )
    annotations = {p.name: p.annotation for p in params}
    try:
        ret = func.ret_struct_info
        annotations["return"] = (
            tuple(_tensor_type(f, "a result") for f in ret.fields)
            if isinstance(ret, relax.TupleStructInfo)
            else _tensor_type(ret, "the result")
        )
    except NotInOpSet:
        pass  # results with computed dims are not annotated (the trace still checks them)
    body.__signature__ = inspect.Signature(params)
    body.__annotations__ = annotations
    body.__name__ = body.__qualname__ = name
    return kernel(body)


interop.register_kernel_frontend(from_relax)
