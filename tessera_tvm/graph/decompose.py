"""tessera.DecomposeRowOps: softmax, layer norm and RMS norm as reductions and element-wise ops.

A target that has row reductions and broadcast element-wise operations but no fused row-wise
kernels (Tenstorrent: ``reduce_tile`` plus ``*_tiles_bcast_cols``) runs these ops as what they
are made of. Over the last axis, with the input's dtype throughout (a bf16 or fp16 layer norm
centres its rows twice: see ``_layer_norm``):

    softmax(x)        m = max(x, keepdims); e = exp(x - m); e / sum(e, keepdims)
    layer_norm(x)     d = x - mean(x, keepdims); d * rsqrt(mean(d * d, keepdims) + eps) [* w] [+ b]
    rms_norm(x)       x * rsqrt(mean(x * x, keepdims) + eps) * w

The fusion passes after it then make reduction kernels and element-wise kernels of the pieces.
Other axes are left alone (their kernels report what the target cannot do).
"""

from __future__ import annotations

from typing import Any

from .._tvm import tvm
from ..pass_log import report_status
from ..registry import BuildContext, register_pass, tessera_module_pass
from .nodes import FlatFunction, Node, flatten, kernel_functions, rebuild, replace_functions, scalar_const

relax = tvm.relax


class _Emitter:
    """New nodes for one decomposition; the last one takes the original node's variable."""

    def __init__(self, node: Node):
        self.node = node
        self.nodes: list[Node] = []

    def __call__(self, op: str, expr, args: list, name: str, attrs: dict | None = None) -> Any:
        var = relax.Var(f"{self.node.name}_{name}")
        self.nodes.append(Node(var, op, args, expr, attrs or {}))
        return var

    def finish(self) -> list[Node]:
        last = self.nodes[-1]
        self.nodes[-1] = Node(self.node.var, last.op, last.args, last.call, last.attrs)
        return self.nodes


def _last_axis(node: Node, axes: Any) -> bool:
    rank = len(node.var.struct_info.shape.values) if node.var.struct_info.shape is not None else 0
    axes = list(axes) if isinstance(axes, tuple | list) else [axes]
    return len(axes) == 1 and int(axes[0]) in (-1, rank - 1)


def _mean(emit: _Emitter, x, name: str):
    return emit("mean", relax.op.mean(x, [-1], True), [x], name, {"axis": (-1,), "keepdims": True})


def _rsqrt_plus(emit: _Emitter, v, eps: float, dtype: str, name: str):
    c = scalar_const(eps, dtype)
    t = emit("add", relax.op.add(v, c), [v, c], f"{name}_eps")
    return emit("rsqrt", relax.op.rsqrt(t), [t], name)


def _softmax(node: Node) -> list[Node]:
    (x,) = node.args
    emit = _Emitter(node)
    m = emit("max", relax.op.max(x, [-1], True), [x], "max", {"axis": (-1,), "keepdims": True})
    d = emit("subtract", relax.op.subtract(x, m), [x, m], "shifted")
    e = emit("exp", relax.op.exp(d), [d], "exp")
    s = emit("sum", relax.op.sum(e, [-1], True), [e], "sum", {"axis": (-1,), "keepdims": True})
    emit("divide", relax.op.divide(e, s), [e, s], "out")
    return emit.finish()


def _layer_norm(node: Node) -> list[Node]:
    x, w, b = node.args
    dtype = node.dtype
    emit = _Emitter(node)
    mu = _mean(emit, x, "mean")
    d = emit("subtract", relax.op.subtract(x, mu), [x, mu], "centered")
    if dtype != "float32":
        # A bf16 (fp16) row mean is off by up to 2**-9 (2**-12) of |mean|, and centring turns that
        # into an error of every value: |mean| / std of them. Centring again removes it: the first
        # differences are exact where x is within 2x of the mean (Sterbenz), so their mean is the
        # rounding error of the first, to the precision of the values' own spread.
        mu = _mean(emit, d, "mean_residual")
        d = emit("subtract", relax.op.subtract(d, mu), [d, mu], "recentered")
    sq = emit("multiply", relax.op.multiply(d, d), [d, d], "squared")
    var = _mean(emit, sq, "var")
    r = _rsqrt_plus(emit, var, float(node.attrs["epsilon"]), dtype, "rstd")
    y = emit("multiply", relax.op.multiply(d, r), [d, r], "normed")
    if node.attrs.get("scale"):
        y = emit("multiply", relax.op.multiply(y, w), [y, w], "scaled")
    if node.attrs.get("center"):
        emit("add", relax.op.add(y, b), [y, b], "shifted")
    return emit.finish()


def _rms_norm(node: Node) -> list[Node]:
    x, w = node.args
    emit = _Emitter(node)
    sq = emit("multiply", relax.op.multiply(x, x), [x, x], "squared")
    ms = _mean(emit, sq, "ms")
    r = _rsqrt_plus(emit, ms, float(node.attrs["epsilon"]), node.dtype, "rrms")
    y = emit("multiply", relax.op.multiply(x, r), [x, r], "normed")
    emit("multiply", relax.op.multiply(y, w), [y, w], "scaled")
    return emit.finish()


def decompose(flat: FlatFunction) -> tuple[FlatFunction, int]:
    nodes: list[Node] = []
    count = 0
    for node in flat.nodes:
        if node.op == "nn.softmax" and _last_axis(node, node.attrs["axis"]):
            nodes += _softmax(node)
        elif node.op == "nn.layer_norm" and _last_axis(node, node.attrs["axes"]):
            nodes += _layer_norm(node)
        elif node.op == "nn.rms_norm" and _last_axis(node, node.attrs["axes"]):
            nodes += _rms_norm(node)
        else:
            nodes.append(node)
            continue
        count += 1
    return FlatFunction(flat.name, flat.params, nodes, flat.outputs, flat.tuple_output), count


@register_pass(
    "tessera.DecomposeRowOps",
    ir="relax",
    doc="softmax / layer norm / RMS norm over the last axis as reductions and element-wise ops",
)
def _decompose_pass(ctx: BuildContext):
    def run(mod, _pass_ctx):
        funcs, count = {}, 0
        for gv, func in kernel_functions(mod):
            flat, n = decompose(flatten(func, str(gv.name_hint)))
            if n:
                funcs[gv] = rebuild(flat, dict(func.attrs))
                count += n
        report_status(f"{count} op{'s' if count != 1 else ''} decomposed")
        return replace_functions(mod, funcs) if funcs else mod

    return tessera_module_pass(run, name="tessera.DecomposeRowOps")
