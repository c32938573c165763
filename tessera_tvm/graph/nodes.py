"""A flat view of a Graph IR function: its parameters, its bindings as ``Node``s, its outputs.

The graph passes read and rewrite this view and rebuild Relax from it, which keeps each pass a
short loop over the dataflow block instead of a Relax mutator.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import op_table
from .._tvm import tvm
from ..errors import TesseraError

relax = tvm.relax
tir = tvm.tirx


class GraphIRError(TesseraError):
    """A Graph IR function has a form the graph passes do not handle."""


@dataclass(eq=False)
class Node:
    """One binding ``var = op(args..., **attrs)`` of the dataflow block."""

    var: Any  # relax.Var
    op: str  # the Relax op name without "relax.", e.g. "matmul", "nn.gelu", "astype"
    args: list[Any]  # relax expressions: Var, Constant, ShapeExpr
    call: Any  # the original relax.Call (its attrs and op object)
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.var.name_hint)

    @property
    def dtype(self) -> str:
        return str(self.var.struct_info.dtype)

    def __repr__(self) -> str:
        return f"Node({self.name} = {self.op})"


def _py(value: Any) -> Any:
    """An attribute value as plain Python."""
    if isinstance(value, str):
        return str(value)  # also TVM's dtype, a str subclass
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, tir.IntImm):
        return int(value.value)
    if isinstance(value, tir.FloatImm):
        return float(value.value)
    if hasattr(value, "__len__") and not hasattr(value, "dtype"):
        return tuple(_py(v) for v in value)
    return str(value)


#: Relax ops the graph passes read as another (the op table's aliases): attention with a bias is
#: ``R.nn.attention_bias`` (its fourth argument), one op for the passes.
_SAME_OP = op_table.relax_aliases()

#: The Relax attributes read into ``Node.attrs``: the op table's (its anchors' and astype's), and
#: those of the layout and fill ops the graph passes read.
_ATTR_FIELDS = {
    **{op.relax: op.attrs for op in op_table.UNARY if op.relax and op.attrs},
    **{op.relax[0]: op.attrs for op in op_table.ANCHORS},
    "permute_dims": ("axes",),
    "ones": ("dtype",),
    "zeros": ("dtype",),
}


def node_of(var, call) -> Node:
    op = str(call.op.name)
    op = op[len("relax.") :] if op.startswith("relax.") else op
    op = _SAME_OP.get(op, op)
    attrs = {f: _py(getattr(call.attrs, f)) for f in _ATTR_FIELDS.get(op, ())}
    return Node(var, op, list(call.args), call, attrs)


@dataclass
class FlatFunction:
    """``name(params) -> outputs`` with ``nodes`` in program order."""

    name: str
    params: list[Any]
    nodes: list[Node]
    outputs: list[Any]  # relax exprs (Vars, or params)
    tuple_output: bool = False
    # a sharded kernel's collectives between its kernels (collectives.Collective, in program order):
    # values the nodes read that no node computes (read_kernels)
    collectives: list[Any] = field(default_factory=list)

    def producers(self) -> dict[Any, Node]:
        return {n.var: n for n in self.nodes}

    def uses(self) -> dict[Any, int]:
        """How often each var is read (function outputs count as a read)."""
        count: dict[Any, int] = {}
        for n in self.nodes:
            for a in n.args:
                if isinstance(a, relax.Var):
                    count[a] = count.get(a, 0) + 1
        for o in self.outputs:
            count[o] = count.get(o, 0) + 1
        return count

    def consumers(self) -> dict[Any, list[Node]]:
        out: dict[Any, list[Node]] = {}
        for n in self.nodes:
            for a in n.args:
                if isinstance(a, relax.Var):
                    out.setdefault(a, []).append(n)
        return out


def flatten(func, name: str) -> FlatFunction:
    """The flat view of a Relax function with (at most) one dataflow block."""
    body = func.body
    blocks = list(body.blocks)
    if len(blocks) > 1:
        raise GraphIRError(f"{name}: expected one dataflow block, found {len(blocks)}")
    alias: dict[Any, Any] = {}
    nodes: list[Node] = []
    for binding in blocks[0].bindings if blocks else []:
        value = binding.value
        if isinstance(value, relax.Var):
            alias[binding.var] = alias.get(value, value)
            continue
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            raise GraphIRError(
                f"{name}: binding {binding.var.name_hint} is a {type(value).__name__}; "
                "expected a call of a Relax operator"
            )
        node = node_of(binding.var, value)
        node.args = [alias.get(a, a) if isinstance(a, relax.Var) else a for a in node.args]
        nodes.append(node)
    result = body.body
    if isinstance(result, relax.Tuple):
        outputs, tuple_output = [alias.get(f, f) for f in result.fields], True
    else:
        outputs, tuple_output = [alias.get(result, result)], False
    return FlatFunction(name, list(func.params), nodes, outputs, tuple_output)


def call_with(node: Node, args: Sequence[Any]):
    """``node``'s call on new arguments (same operator, attributes and struct-info arguments)."""
    call = node.call
    return relax.Call(call.op, list(args), call.attrs, call.sinfo_args)


def rebuild(
    flat: FlatFunction,
    attrs: dict[str, Any] | None = None,
    *,
    private: bool = False,
    remake: Callable[[Node, list], Any] | None = None,
):
    """A Relax function computing ``flat`` (nodes re-emitted in order, struct info re-inferred).
    ``remake(node, args)`` gives a node's new call where struct info cannot be re-inferred (a
    ``call_pure_packed``'s declared result), or None for the usual one."""
    bb = relax.BlockBuilder()
    subst: dict[Any, Any] = {}

    def arg(a):
        return subst.get(a, a) if isinstance(a, relax.Var) else a

    with bb.function(flat.name, list(flat.params), attrs or {}, private=private):
        with bb.dataflow():
            out_set = {o for o in flat.outputs if isinstance(o, relax.Var)}
            for node in flat.nodes:
                args = [arg(a) for a in node.args]
                expr = (remake and remake(node, args)) or call_with(node, args)
                if node.var in out_set:
                    subst[node.var] = bb.emit_output(expr, name_hint=node.name)
                else:
                    subst[node.var] = bb.emit(expr, name_hint=node.name)
            outs = [arg(o) for o in flat.outputs]
            outs = [bb.emit_output(o) if o in set(flat.params) else o for o in outs]
        bb.emit_func_output(relax.Tuple(outs) if flat.tuple_output else outs[0])
    (func,) = bb.get().functions.values()  # (a private function may be renamed in the module)
    return func


def static_shape(expr, env: dict[str, int], where: str) -> tuple[int, ...]:
    """The shape of ``expr`` with symbolic dims replaced by their values in ``env``.

    A value may itself be a symbolic dim (an int32 ``tirx.Var``, tile/base.py ``is_symbolic``): the
    dim then stays symbolic in the shape, for a kernel that binds it at call time."""
    out = []
    for d in expr.struct_info.shape.values:
        if isinstance(d, tir.IntImm):
            out.append(int(d.value))
        elif isinstance(d, tir.Var):
            if str(d.name) not in env:
                raise GraphIRError(f"{where}: dim {d.name} has no value; bind it (shapes={{'{d.name}': ...}})")
            value = env[str(d.name)]
            out.append(value if isinstance(value, tir.Var) else int(value))
        elif isinstance(env.get(kernel_dim_name(d)), tir.Var):  # an expression of symbolic dims, kept as one
            out.append(env[kernel_dim_name(d)])
        else:
            vmap = {
                v: tir.IntImm("int64", env[str(v.name)])
                for v in tir.analysis.undefined_vars(d)
                if str(v.name) in env and not isinstance(env[str(v.name)], tir.Var)
            }
            value = tvm.arith.Analyzer().simplify(tir.stmt_functor.substitute(d, vmap))
            if not isinstance(value, tir.IntImm):
                raise GraphIRError(f"{where}: dim {d} has no value with {env}")
            out.append(int(value.value))
    return tuple(out)


def kernel_dim_name(dim) -> str:
    """The name of the kernel dim standing for symbolic Relax dim ``dim``: its name for a variable,
    an identifier spelled from the expression for a product such as ``s0 * 24`` (``s0_x_24``), the
    same for every spelling of it (``2 * s0`` too)."""
    if isinstance(dim, tir.Var):
        return str(dim.name)
    dim = tvm.arith.Analyzer().simplify(dim)  # 2 * s0 and s0 * 2 (one dim, two spellings): one name
    if isinstance(dim, tir.Var):
        return str(dim.name)
    text = re.sub(r"T\.int(32|64)\((\d+)\)", r"\2", str(dim)).replace("*", " x ")
    name = re.sub(r"\W+", "_", text).strip("_")
    return name if name.isidentifier() else f"dim_{name}"


def scalar_const(value: float | int, dtype: str):
    """A scalar Relax constant of ``dtype``; bf16/fp8 are written bit for bit (numpy has no such type)."""
    if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes
        import numpy as np

        bits = np.array(value, dtype=getattr(ml_dtypes, dtype)).view(np.uint16 if dtype == "bfloat16" else np.uint8)
        data = tvm.runtime.empty((), dtype)
        data.copyfrom(bits)
        return relax.const(data)
    return relax.const(value, dtype)


def constant_value(expr) -> float | None:
    """The Python value of a scalar Relax constant, or None."""
    if isinstance(expr, relax.Constant) and not expr.data.shape:
        return float(expr.data.numpy())
    return None


def clip_bounds(node: Node) -> tuple[float, float] | None:
    """``(lo, hi)`` of ``clip(x, lo, hi)`` with constant bounds (an infinite one bounds nothing: how
    TVM's frontend spells ``clamp(x, min=0)``), or None for any other node."""
    if node.op != "clip" or len(node.args) != 3:
        return None
    bounds = []
    for bound in node.args[1:]:
        value = getattr(bound, "value", None) if isinstance(bound, relax.PrimValue) else None
        if not isinstance(value, tir.IntImm | tir.FloatImm):
            return None
        bounds.append(float(value.value))
    return bounds[0], bounds[1]


def keyed(mod, name: str):
    """``mod`` with its public function under the GlobalVar ``name``.

    BlockBuilder names functions and bindings from one name supply, so a kernel named like one of
    its ops (``softmax``) comes back as ``softmax1``; the function's ``global_symbol`` is right.
    """
    funcs = {}
    for gv, func in mod.functions.items():
        public = func.attrs is not None and "global_symbol" in func.attrs
        funcs[tvm.ir.GlobalVar(name) if public and str(gv.name_hint) != name else gv] = func
    if all(str(gv.name_hint) != name for gv in funcs):
        raise GraphIRError(f"no public function {name!r} in the module")
    return tvm.IRModule(funcs)


def kernel_functions(mod) -> list[tuple[Any, Any]]:
    """``(GlobalVar, Function)`` of each public Relax function of ``mod``: the kernels the graph
    passes transform (the private functions OutlineKernels adds are left alone)."""
    return [
        (gv, func)
        for gv, func in mod.functions.items()
        if isinstance(func, relax.Function) and func.attrs is not None and "global_symbol" in func.attrs
    ]


def replace_functions(mod, funcs: dict[Any, Any]):
    """``mod`` with the functions of ``funcs`` (GlobalVar -> Function) replaced."""
    return tvm.IRModule({gv: funcs.get(gv, func) for gv, func in mod.functions.items()}, attrs=mod.attrs)
