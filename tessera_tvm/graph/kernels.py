"""Fused kernel groups -> tile kernel specs (``tessera_tvm.tile``), with concrete shapes.

``kernel_spec(group, env)`` maps one :class:`~tessera_tvm.graph.fusion.KernelGroup` onto the spec
its family builds (GemmSpec with epilogue, AttentionSpec, SoftmaxSpec, NormSpec, ReduceSpec,
ElementwiseSpec) and says which graph value feeds each spec parameter. Symbolic dims take their
values from ``env``. Rank-0 values are passed as ``(1,)`` (tile kernels have no rank-0 buffers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import op_table
from .._tvm import tvm
from ..tile import (
    AttentionSpec,
    Binary,
    Const,
    Conv2dSpec,
    ElementwiseSpec,
    EpilogueOp,
    GemmSpec,
    Input,
    KernelSpec,
    NormSpec,
    Pool2dSpec,
    ReduceSpec,
    SoftmaxSpec,
    Unary,
)
from .fusion import BINARY, UNARY, KernelGroup, swish_motif
from .nodes import GraphIRError, Node, clip_bounds, constant_value, static_shape

relax = tvm.relax

#: Relax activation -> its EpilogueOp kind.
_EPILOGUE_UNARY = {op.relax: op.name for op in op_table.epilogue_activations() if op.relax}


@dataclass(frozen=True)
class KernelBinding:
    """A spec plus the graph values bound to its parameters (``spec.params()`` order)."""

    name: str
    spec: KernelSpec
    args: tuple[Any, ...]  # relax Vars: inputs then the output

    @property
    def inputs(self) -> tuple[Any, ...]:
        return self.args[:-1]

    @property
    def output(self) -> Any:
        return self.args[-1]


class _Names:
    """Distinct C-identifier parameter names, preferring the graph's own names."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def take(self, want: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in want) or "t"
        if base[0].isdigit():
            base = "t_" + base
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name


def _shape(expr, env, where) -> tuple[int, ...]:
    return static_shape(expr, env, where) or (1,)


def _dtype(expr) -> str:
    return str(expr.struct_info.dtype)


def kernel_spec(group: KernelGroup, env: dict[str, int], *, tensor_constants: bool = False) -> KernelBinding:
    """The tile spec of ``group`` with dims from ``env`` (name -> value). ``tensor_constants``: an
    element-wise group reads a non-scalar ``relax.Constant`` as one more input (the caller passes the
    constant), as Relax models hold tables such as RoPE's cos/sin."""
    if group.family == "elementwise":
        return _elementwise(group, env, f"kernel {group.name}", tensor_constants)
    builder = {
        "gemm": _gemm,
        "attention": _attention,
        "conv2d": _conv2d,  # conv1d too, as a conv2d of height 1
        "pool2d": _pool2d,
        "softmax": _softmax,
        "norm": _norm,
        "reduce": _reduce,
        "elementwise": _elementwise,
    }[group.family]
    return builder(group, env, f"kernel {group.name}")


def _gemm(group: KernelGroup, env, where) -> KernelBinding:
    names = _Names()
    by_var = {n.var: n for n in group.nodes}
    matmul = group.anchor
    operands, transposed = [], []
    for arg in matmul.args:
        prod = by_var.get(arg)
        if prod is not None and prod.op == "permute_dims":
            operands.append(prod.args[0])
            transposed.append(True)
        else:
            operands.append(arg)
            transposed.append(False)
    a, b = operands
    shape_a, shape_b = _shape(a, env, where), _shape(b, env, where)
    out_shape = static_shape(matmul.var, env, where)
    m, n = out_shape[-2], out_shape[-1]
    k = shape_a[-2] if transposed[0] else shape_a[-1]
    name_a, name_b = names.take(str(a.name_hint)), names.take(str(b.name_hint))
    epilogue, operand_names = _epilogue(group, names, lambda other: len(other.struct_info.shape.values) == 1)
    spec = GemmSpec(
        m,
        n,
        k,
        batch=tuple(out_shape[:-2]),
        transpose_a=transposed[0],
        transpose_b=transposed[1],
        dtype_a=_dtype(a),
        dtype_b=_dtype(b),
        dtype_out=_dtype(group.output),
        dtype_acc=_dtype(matmul.var),
        epilogue=tuple(epilogue),
        batch_a=tuple(shape_a[:-2]),
        batch_b=tuple(shape_b[:-2]),
        name_a=name_a,
        name_b=name_b,
        name_out=names.take("out"),
    )
    return _bound(group, spec, {name_a: a, name_b: b}, operand_names)


def _bound(group: KernelGroup, spec: KernelSpec, named: dict[str, Any], operand_names: dict[Any, str]):
    """``spec`` bound to the graph: ``named`` (parameter name -> value) and the epilogue operands."""
    by_name = {**named, **{v: k for k, v in operand_names.items()}}
    args = tuple(by_name[p.name] for p in spec.inputs()) + (group.output,)
    return KernelBinding(group.name, spec, args)


def _epilogue(group: KernelGroup, names: _Names, is_bias) -> tuple[list[EpilogueOp], dict[Any, str]]:
    """The epilogue steps of the nodes after ``group``'s anchor (a matmul or conv2d), and the name
    of each tensor operand they read. ``is_bias(tensor)``: whether an added tensor is a bias (a GEMM's
    ``[N]``, a convolution's ``[1, O, 1, 1]``) rather than a residual of the output's shape."""
    epilogue: list[EpilogueOp] = []
    operand_names: dict[Any, str] = {}
    anchor = group.anchor
    steps = group.nodes[group.nodes.index(anchor) + 1 :]
    cur = anchor.var
    i = 0
    while i < len(steps):
        node = steps[i]
        last = i == len(steps) - 1
        motif = swish_motif(steps[i : i + 3], cur)
        if motif is not None:  # x * sigmoid(beta x): one activation
            epilogue.append(EpilogueOp(motif.name))
            cur = steps[i + 2].var
            i += 3
            continue
        if node.op == "astype":
            if not last:
                epilogue.append(EpilogueOp("cast", dtype=node.attrs["dtype"]))
        elif node.op in _EPILOGUE_UNARY:
            epilogue.append(EpilogueOp(_EPILOGUE_UNARY[node.op]))
        elif node.op == "negative":
            epilogue.append(EpilogueOp("scale", value=-1.0))
        elif node.op == "clip":
            lo, hi = clip_bounds(node)
            epilogue += [
                EpilogueOp(kind, value=v) for kind, v in (("max_scalar", lo), ("min_scalar", hi)) if math.isfinite(v)
            ]
        else:
            x, y = node.args
            other = y if x.same_as(cur) else x
            c = constant_value(other)
            if c is not None:
                kind, value = {
                    "add": ("add_scalar", c),
                    "subtract": ("add_scalar", -c),
                    "multiply": ("scale", c),
                    # x / 0 is x * inf in IEEE (+-inf, NaN for 0 and NaN), not a ZeroDivisionError
                    "divide": ("scale", 1.0 / c if c != 0 else math.copysign(math.inf, c)),
                }[node.op]
                epilogue.append(EpilogueOp(kind, value=value))
            else:
                if other not in operand_names:
                    operand_names[other] = names.take(str(other.name_hint))
                if node.op == "multiply":
                    kind = "gate"  # a product with a tensor of the output's shape (SwiGLU)
                elif node.op == "add":
                    kind = "bias" if is_bias(other) else "residual"  # fusion admits these two shapes
                else:
                    raise GraphIRError(f"{node.op} with a tensor cannot be a GEMM epilogue step (add or multiply can)")
                epilogue.append(EpilogueOp(kind, operand=operand_names[other], dtype=_dtype(other)))
        cur = node.var
        i += 1
    return epilogue, operand_names


def _conv2d(group: KernelGroup, env, where) -> KernelBinding:
    """A Conv2dSpec for ``nn.conv2d``; for ``nn.conv1d`` (NCW / OIW) the one of H = 1 and a kernel
    height 1, whose [N, C, 1, W] and [O, C/groups, 1, K] buffers hold the 3-D tensors' bytes as they
    are (the caller views them as the spec's shapes)."""
    names = _Names()
    conv = group.anchor
    x, w = conv.args
    attrs = conv.attrs
    one_d = conv.op == "nn.conv1d"
    layouts = ("NCW", "OIW") if one_d else ("NCHW", "OIHW")
    if (attrs["data_layout"], attrs["kernel_layout"]) != layouts:
        raise GraphIRError(
            f"{where}: {conv.op[3:]} with layouts {attrs['data_layout']}/{attrs['kernel_layout']}; "
            f"Tessera's convolution takes {layouts[0]} and {layouts[1]}"
        )
    if one_d:
        (n, c, width), (o, _, s), h, r = _shape(x, env, where), _shape(w, env, where), 1, 1
        pad = tuple(attrs["padding"])
        left, right = pad * 2 if len(pad) == 1 else pad
        padding = (0, left, 0, right)
        stride, dilation = (1, *attrs["strides"]), (1, *attrs["dilation"])
    else:
        n, c, h, width = _shape(x, env, where)
        o, _, r, s = _shape(w, env, where)
        padding = tuple(attrs["padding"])
        padding = padding * 2 if len(padding) == 2 else padding
        stride, dilation = tuple(attrs["strides"]), tuple(attrs["dilation"])
    name_x, name_w = names.take(str(x.name_hint)), names.take(str(w.name_hint))

    def is_bias(other) -> bool:  # [1, O, 1, 1] ([1, O, 1] by a conv1d): how a Relax model adds a conv's bias
        shape = _shape(other, env, where)
        return len(shape) == (3 if one_d else 4) and shape[0] == 1 and all(d == 1 for d in shape[2:])

    epilogue, operand_names = _epilogue(group, names, is_bias)
    spec = Conv2dSpec(
        n,
        c,
        h,
        width,
        o,
        r,
        s,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=attrs["groups"],
        dtype_in=_dtype(x),
        dtype_w=_dtype(w),
        dtype_out=_dtype(group.output),
        epilogue=tuple(epilogue),
        name_x=name_x,
        name_w=name_w,
        name_out=names.take("out"),
    )
    return _bound(group, spec, {name_x: x, name_w: w}, operand_names)


def _attention(group: KernelGroup, env, where) -> KernelBinding:
    names = _Names()
    by_var = {n.var: n for n in group.nodes}
    attn = group.anchor
    q, k, v = (by_var[a].args[0] for a in attn.args[:3])
    b, h, s_q, d = _shape(q, env, where)
    _, h_kv, s_kv, _ = _shape(k, env, where)
    mask = attn.attrs.get("causal_mask")
    bias = attn.args[3] if len(attn.args) > 3 else None  # [B|1, H|1, S_q|1, S_kv|1], outside the group
    bias_args = {}
    if bias is not None:
        name = str(bias.name_hint) if hasattr(bias, "name_hint") else "bias"
        bias_args = {"bias": _shape(bias, env, where), "dtype_bias": _dtype(bias), "name_bias": names.take(name)}
    spec = AttentionSpec(
        b,
        h,
        h_kv,
        s_q,
        s_kv,
        d,
        causal=mask is not None,
        scale=attn.attrs.get("scale"),
        dtype_in=_dtype(q),
        dtype_out=_dtype(group.output),
        causal_align="bottom_right" if mask == "BottomRight" else "top_left",
        name_q=names.take(str(q.name_hint)),
        name_k=names.take(str(k.name_hint)),
        name_v=names.take(str(v.name_hint)),
        **bias_args,
        name_out=names.take("out"),
    )
    operands = (q, k, v) if bias is None else (q, k, v, bias)
    return KernelBinding(group.name, spec, (*operands, group.output))


def _softmax(group: KernelGroup, env, where) -> KernelBinding:
    names = _Names()
    node = group.anchor
    x = node.args[0]
    spec = SoftmaxSpec(
        _shape(x, env, where),
        node.attrs["axis"],
        _dtype(x),
        _dtype(group.output),
        name_in=names.take(str(x.name_hint)),
        name_out=names.take("out"),
    )
    return KernelBinding(group.name, spec, (x, group.output))


def _norm(group: KernelGroup, env, where) -> KernelBinding:
    names = _Names()
    node = group.anchor
    x = node.args[0]
    filled = {n.var for n in group.nodes if n.op in ("ones", "zeros")}
    weight = node.args[1] if node.args[1] not in filled else None
    bias = node.args[2] if node.op == "nn.layer_norm" and node.args[2] not in filled else None
    kind = op_table.ANCHOR_BY_RELAX[node.op].kind
    dtype_w = _dtype(weight) if weight is not None else (_dtype(bias) if bias is not None else None)
    spec = NormSpec(
        kind,
        _shape(x, env, where),
        eps=float(node.attrs["epsilon"]),
        has_weight=weight is not None,
        has_bias=bias is not None,
        dtype_in=_dtype(x),
        dtype_out=_dtype(group.output),
        dtype_weight=dtype_w,
        name_in=names.take(str(x.name_hint)),
        name_weight=names.take(str(weight.name_hint)) if weight is not None else "weight",
        name_bias=names.take(str(bias.name_hint)) if bias is not None else "bias",
        name_out=names.take("out"),
    )
    args = [x] + ([weight] if weight is not None else []) + ([bias] if bias is not None else [])
    return KernelBinding(group.name, spec, (*args, group.output))


def _pool2d(group: KernelGroup, env, where) -> KernelBinding:
    node = group.anchor
    attrs = node.attrs
    if (attrs["layout"], attrs["out_layout"]) != ("NCHW", "NCHW"):
        raise GraphIRError(f"{where}: {node.op} in layout {attrs['layout']}; Tessera's pooling takes NCHW")
    x = node.args[0]
    n, c, h, w = _shape(x, env, where)
    padding = tuple(attrs["padding"])
    spec = Pool2dSpec(
        n,
        c,
        h,
        w,
        op_table.ANCHOR_BY_RELAX[node.op].kind,
        tuple(attrs["pool_size"]),
        stride=tuple(attrs["strides"]),
        padding=padding * 2 if len(padding) == 2 else padding,
        dilation=tuple(attrs["dilation"]),
        ceil_mode=bool(attrs["ceil_mode"]),
        count_include_pad=bool(attrs["count_include_pad"]),
        dtype_in=_dtype(x),
        dtype_out=_dtype(group.output),
    )
    return KernelBinding(group.name, spec, (x, group.output))


def _reduce(group: KernelGroup, env, where) -> KernelBinding:
    names = _Names()
    node = group.anchor
    x = node.args[0]
    shape = _shape(x, env, where)
    axis = node.attrs.get("axis")
    axis = tuple(range(len(shape))) if axis is None else tuple(axis)
    spec = ReduceSpec(
        shape,
        axis,
        op_table.ANCHOR_BY_RELAX[node.op].kind,
        bool(node.attrs.get("keepdims")),
        _dtype(x),
        _dtype(group.output),
        name_in=names.take(str(x.name_hint)),
        name_out=names.take("out"),
    )
    return KernelBinding(group.name, spec, (x, group.output))


def _elementwise(group: KernelGroup, env, where, tensor_constants: bool = False) -> KernelBinding:
    names = _Names()
    by_var = {n.var: n for n in group.nodes}
    inputs: dict[Any, str] = {}

    def expr_of(e):
        if isinstance(e, relax.Var) and e in by_var:
            return node_expr(by_var[e])
        c = constant_value(e)
        if c is not None:
            return Const(c)
        if not (isinstance(e, relax.Var) or (tensor_constants and isinstance(e, relax.Constant))):
            raise GraphIRError(f"{where}: cannot read {type(e).__name__} in an element-wise kernel")
        if e not in inputs:
            inputs[e] = names.take(str(e.name_hint) if isinstance(e, relax.Var) else "table")
        return Input(inputs[e])

    def node_expr(node: Node):
        if node.op == "clip":
            expr = expr_of(node.args[0])
            for op, bound in zip(("max", "min"), clip_bounds(node), strict=True):
                expr = Binary(op, expr, Const(bound)) if math.isfinite(bound) else expr
            return expr
        if node.op in UNARY:
            op = UNARY[node.op]
            return Unary(op, expr_of(node.args[0]), node.attrs["dtype"] if op == "cast" else None)
        return Binary(BINARY[node.op], expr_of(node.args[0]), expr_of(node.args[1]))

    expr = node_expr(group.nodes[-1])
    operands = tuple((name, _shape(var, env, where), _dtype(var)) for var, name in inputs.items())
    spec = ElementwiseSpec(
        _shape(group.output, env, where), operands, expr, _dtype(group.output), name_out=names.take("out")
    )
    return KernelBinding(group.name, spec, (*inputs, group.output))
