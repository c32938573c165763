"""Building Graph IR: a Relax function traced from a Tessera kernel.

The frontend (``python/tessera``) never touches Relax: it asks a :class:`GraphBuilder` for
parameters and operations by name and gets :class:`Value` handles back, whose shape and dtype are
what Relax inferred. Named dims become Relax symbolic variables (``T.int64()``), literal dims stay
integers. Tessera's tensors are ``[B, H, S, D]`` where Relax attention wants ``[B, S, H, D]``, so
``attention`` is emitted as ``permute_dims`` around ``R.nn.attention``; the fusion pass puts the
four back into one kernel.

    gb = GraphBuilder("linear")
    A = gb.param("A", ("M", "K"), "float16"); W = gb.param("W", ("K", "N"), "float16")
    mod = gb.build([A, W], lambda: gb.emit("matmul", A, W, out_dtype="float32"))
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from .. import op_table
from .._tvm import tvm
from ..errors import TesseraError

relax = tvm.relax
tir = tvm.tirx

#: Dims as the frontend sees them: an int (literal or known) or a str (a symbol or an expression).
Dim = int | str


class GraphBuildError(TesseraError):
    """Relax rejected an operation the frontend built (the frontend adds the user's file:line)."""


def _dim_of(expr) -> Dim:
    if isinstance(expr, tir.IntImm):
        return int(expr.value)
    if isinstance(expr, tir.Var):
        return str(expr.name)
    return str(expr)


class Value:
    """A handle to one Relax expression of the graph being built."""

    __slots__ = ("expr",)

    def __init__(self, expr) -> None:
        self.expr = expr

    @property
    def struct_info(self):
        return self.expr.struct_info

    @property
    def shape(self) -> tuple[Dim, ...]:
        sinfo = self.expr.struct_info
        if sinfo.shape is None:
            raise GraphBuildError(f"Relax could not infer the shape of {self.name} ({sinfo})")
        return tuple(_dim_of(d) for d in sinfo.shape.values)

    @property
    def dtype(self) -> str:
        return str(self.expr.struct_info.dtype)

    @property
    def name(self) -> str:
        return str(self.expr.name_hint) if isinstance(self.expr, relax.Var) else "const"

    def __repr__(self) -> str:
        return f"Value({self.name}: [{', '.join(map(str, self.shape))}] {self.dtype})"


def _swap_last_two(rank: int) -> list[int]:
    return [*range(rank - 2), rank - 1, rank - 2]


_BHSD_TO_BSHD = [0, 2, 1, 3]


# Relax constructors of the ops the frontend emits. Each takes relax expressions and attributes.
# The element-wise ones and the reductions come from the op table (``nn.silu`` ->
# ``relax.op.nn.silu``); those with attributes (astype, clip) and the other anchors are built below.
def _relax_op(name: str):
    return functools.reduce(getattr, name.split("."), relax.op)


_UNARY = {op.graph_op: _relax_op(op.relax) for op in op_table.UNARY if op.graph_op and not op.attrs}
_BINARY = {op.graph_op: _relax_op(op.relax) for op in op_table.BINARY if op.graph_op}
_REDUCE = {op.graph_op: _relax_op(op.relax[0]) for op in op_table.anchors("reduce")}  # (x, axis, keepdims)

#: Every op name :meth:`GraphBuilder.emit` accepts (the op table's graph ops).
OPS = tuple(op.graph_op for op in (*op_table.ANCHORS, *op_table.OPS, op_table.CLIP) if op.graph_op)


class GraphBuilder:
    """Builds one Relax function (the kernel's Graph IR) from named operations."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._bb = relax.BlockBuilder()
        self._symbols: dict[str, Any] = {}
        self._params: list[Value] = []

    # Parameters and constants ---------------------------------------------------------------
    def symbol(self, name: str):
        """The Relax symbolic variable of dim ``name`` (one per name in the function)."""
        if name not in self._symbols:
            self._symbols[name] = tir.Var(name, "int64")
        return self._symbols[name]

    def param(self, name: str, dims: Sequence[Dim], dtype: str) -> Value:
        """A function parameter of shape ``dims`` (names symbolic, ints literal)."""
        shape = [self.symbol(d) if isinstance(d, str) else int(d) for d in dims]
        value = Value(relax.Var(name, relax.TensorStructInfo(shape, dtype)))
        self._params.append(value)
        return value

    def constant(self, value: float | int, dtype: str) -> Value:
        """A scalar constant of ``dtype``."""
        from .nodes import scalar_const

        return Value(scalar_const(value, dtype))

    # Operations -------------------------------------------------------------------------------
    def _emit(self, expr, name: str) -> Value:
        try:
            return Value(self._bb.emit(expr, name_hint=name))
        except (tvm.error.TVMError, TypeError, ValueError) as exc:
            first = str(exc).strip().splitlines()
            raise GraphBuildError(f"Relax rejected {name}: {first[-1] if first else exc}") from None

    def emit(self, op: str, *inputs: Value, **attrs: Any) -> Value:
        """Emit ``op`` on ``inputs``; return the result's handle (shape/dtype inferred by Relax).

        ``matmul``: ``out_dtype``, ``transpose_a``, ``transpose_b`` (as ``permute_dims``);
        ``astype``: ``dtype``; ``clip``: ``lo``, ``hi`` (floats, +-inf for none); ``softmax``: ``axis``; ``sum``/``max``/``mean``: ``axis``, ``keepdims``;
        ``layer_norm``: inputs ``x, weight?, bias?`` + ``eps``, ``has_weight``, ``has_bias``;
        ``rms_norm``: ``x, weight?`` + ``eps``, ``has_weight``; ``attention``: ``q, k, v`` on
        ``[B, H, S, D]`` and a ``bias?`` + ``scale``, ``causal`` (``None``, ``"top_left"``, ``"bottom_right"``).
        """
        args = [v.expr for v in inputs]
        if op in _UNARY:
            return self._emit(_UNARY[op](*args), op)
        if op in _BINARY:
            return self._emit(_BINARY[op](*args), op)
        if op in _REDUCE:
            axis = attrs.get("axis")
            axis = list(axis) if isinstance(axis, tuple | list) else axis
            return self._emit(_REDUCE[op](args[0], axis, bool(attrs.get("keepdims", False))), op)
        if op == "astype":
            return self._emit(relax.op.astype(args[0], attrs["dtype"]), "cast")
        if op == "clip":  # bounds as the frontend writes them (PrimValues; +-inf: no bound)
            bounds = [relax.PrimValue(tir.FloatImm("float64", attrs[b])) for b in ("lo", "hi")]
            return self._emit(relax.op.clip(args[0], *bounds), op)
        if op == "matmul":
            a, b = inputs
            if attrs.get("transpose_a"):
                a = self._emit(relax.op.permute_dims(a.expr, _swap_last_two(len(a.shape))), "transpose")
            if attrs.get("transpose_b"):
                b = self._emit(relax.op.permute_dims(b.expr, _swap_last_two(len(b.shape))), "transpose")
            return self._emit(relax.op.matmul(a.expr, b.expr, out_dtype=attrs.get("out_dtype")), "matmul")
        if op == "softmax":
            return self._emit(relax.op.nn.softmax(args[0], int(attrs.get("axis", -1))), "softmax")
        if op == "layer_norm":
            x = inputs[0]
            rest = list(inputs[1:])
            n = x.expr.struct_info.shape.values[-1]
            weight = rest.pop(0).expr if attrs.get("has_weight") else self._fill("ones", n, x.dtype)
            bias = rest.pop(0).expr if attrs.get("has_bias") else self._fill("zeros", n, x.dtype)
            expr = relax.op.nn.layer_norm(
                x.expr,
                weight,
                bias,
                axes=[-1],
                epsilon=float(attrs["eps"]),
                center=bool(attrs.get("has_bias")),
                scale=bool(attrs.get("has_weight")),
            )
            return self._emit(expr, "layer_norm")
        if op == "rms_norm":
            x = inputs[0]
            n = x.expr.struct_info.shape.values[-1]
            weight = inputs[1].expr if attrs.get("has_weight") else self._fill("ones", n, x.dtype)
            return self._emit(relax.op.nn.rms_norm(x.expr, weight, axes=[-1], epsilon=float(attrs["eps"])), "rms_norm")
        if op == "attention":  # the bias (if any) is [B, H, S_q, S_kv] as Relax's attention takes it
            q, k, v = (
                self._emit(relax.op.permute_dims(t, _BHSD_TO_BSHD), f"{n}_bshd")
                for t, n in zip(args[:3], ("q", "k", "v"), strict=True)
            )
            bias = args[3] if len(args) > 3 else None
            causal = {None: None, "top_left": "TopLeft", "bottom_right": "BottomRight"}[attrs.get("causal")]
            scale = attrs.get("scale")
            scale = tir.FloatImm("float32", float(scale)) if scale is not None else None
            o = self._emit(
                relax.op.nn.attention(q.expr, k.expr, v.expr, bias, scale=scale, causal_mask=causal), "attention"
            )
            return self._emit(relax.op.permute_dims(o.expr, _BHSD_TO_BSHD), "attention_bhsd")
        raise GraphBuildError(f"unknown graph op {op!r}; known: {', '.join(OPS)}")

    def _fill(self, kind: str, n, dtype: str):
        make = relax.op.ones if kind == "ones" else relax.op.zeros
        return self._emit(make(relax.ShapeExpr([n]), dtype), kind).expr

    # The function -------------------------------------------------------------------------------
    def build(self, params: Sequence[Value], body: Callable[[], Value | Sequence[Value]]):
        """Trace ``body`` (which emits operations) into the function; return the IRModule.

        ``body`` returns the result handle or a sequence of them (a tuple-returning kernel).
        """
        error: BaseException | None = None
        with self._bb.function(self.name, [p.expr for p in params]):
            with self._bb.dataflow():
                try:
                    result = body()
                except Exception as exc:  # close the function cleanly, then re-raise
                    error, result = exc, Value(relax.const(0, "int32"))
                many = isinstance(result, tuple | list)
                outs = [self._bb.emit_output(v.expr, name_hint="out") for v in (result if many else [result])]
            self._bb.emit_func_output(relax.Tuple(outs) if many else outs[0])
        if error is not None:
            raise error
        from .nodes import keyed

        return keyed(self._bb.get(), self.name)


def script(mod) -> str:
    """TVMScript text of a Graph IR module."""
    return mod.script()
