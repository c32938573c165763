"""Graph passes: the named, recorded steps from a traced Relax function to fused kernels.

    relax.CanonicalizeBindings   drop aliases (``y = x``)
    tessera.Simplify             algebraic simplification (identity casts and arithmetic, cast and
                                 scale chains)
    relax.DeadCodeElimination    drop unused bindings
    tessera.FuseEpilogues        matmul + transposes + epilogue, attention + its layout permutes
    tessera.FuseKernels          softmax / norms / reductions (+ trailing cast), element-wise trees
    tessera.OutlineKernels       one private Relax function per kernel; the kernel calls them in order

:func:`run_graph_passes` runs them and returns a :class:`GraphIR` holding the traced module, the
result, the kernel groups and one :class:`PassRecord` per pass (``phase="graph"``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._tvm import tvm
from ..pipeline import PassRecord
from .fusion import Fuser, KernelGroup
from .nodes import FlatFunction, Node, call_with, constant_value, flatten, keyed, rebuild, scalar_const

relax = tvm.relax

#: The graph passes in order (what ``tessera passes``-style listings and the pass log show).
GRAPH_PASSES = (
    "relax.CanonicalizeBindings",
    "tessera.Simplify",
    "relax.DeadCodeElimination",
    "tessera.FuseEpilogues",
    "tessera.FuseKernels",
    "tessera.OutlineKernels",
)

# Casts that represent every value of the source exactly: casting through them changes nothing.
_LOSSLESS = {
    "float16": {"float32"},
    "bfloat16": {"float32"},
    "float8_e4m3fn": {"float16", "bfloat16", "float32"},
    "float8_e5m2": {"float16", "bfloat16", "float32"},
    "int8": {"int32", "float16", "bfloat16", "float32"},
}


@dataclass
class GraphIR:
    """A kernel's Graph IR: the traced function, the simplified one, its fused kernels, the pass log."""

    name: str
    traced: Any  # IRModule as traced
    simplified: FlatFunction | None = None
    module: Any = None  # IRModule after every pass (kernels outlined)
    groups: list[KernelGroup] = field(default_factory=list)
    records: list[PassRecord] = field(default_factory=list)

    @property
    def params(self) -> list[Any]:
        return self.simplified.params

    @property
    def outputs(self) -> list[Any]:
        return self.simplified.outputs

    def text(self, traced: bool = False) -> str:
        return (self.traced if traced else self.module).script()


def _simplify(flat: FlatFunction) -> tuple[FlatFunction, int]:
    """Rewrite identity casts/arithmetic and fold cast and scalar-multiply chains."""
    producer = flat.producers()
    uses = flat.uses()
    subst: dict[Any, Any] = {}
    rewrites = 0
    nodes: list[Node] = []
    for node in flat.nodes:
        node = Node(
            node.var,
            node.op,
            [subst.get(a, a) if isinstance(a, relax.Var) else a for a in node.args],
            node.call,
            node.attrs,
        )
        src = node.args[0] if node.args else None
        if node.op == "astype" and str(src.struct_info.dtype) == node.attrs["dtype"]:
            subst[node.var] = src
            rewrites += 1
            continue
        if node.op == "astype":
            inner = producer.get(src)
            if inner is not None and inner.op == "astype" and uses.get(src) == 1:
                orig = inner.args[0] if inner.args[0] not in subst else subst[inner.args[0]]
                if inner.attrs["dtype"] in _LOSSLESS.get(str(orig.struct_info.dtype), ()):
                    if str(orig.struct_info.dtype) == node.attrs["dtype"]:
                        subst[node.var] = orig
                    else:
                        node = Node(node.var, node.op, [orig], call_with(node, [orig]), node.attrs)
                        nodes.append(node)
                    rewrites += 1
                    continue
        if node.op in ("add", "subtract", "multiply", "divide"):
            a, b = node.args
            ca, cb = constant_value(a), constant_value(b)
            identity = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "divide": 1.0}[node.op]
            keep = a if cb == identity else b if (ca == identity and node.op in ("add", "multiply")) else None
            if keep is not None and isinstance(keep, relax.Var) and _same_sinfo(keep, node.var):
                subst[node.var] = keep
                rewrites += 1
                continue
            if node.op == "multiply" and (ca is not None or cb is not None):
                x, c = (b, ca) if ca is not None else (a, cb)
                inner = producer.get(x)
                if inner is not None and inner.op == "multiply" and uses.get(x) == 1:
                    ia, ib = inner.args
                    ic = constant_value(ib) if constant_value(ib) is not None else constant_value(ia)
                    iv = ia if constant_value(ib) is not None else ib
                    if ic is not None and isinstance(iv, relax.Var):
                        iv = subst.get(iv, iv)
                        rewrites += 1
                        if ic * c == 1.0 and _same_sinfo(iv, node.var):
                            subst[node.var] = iv
                            continue
                        const = scalar_const(ic * c, str(node.var.struct_info.dtype))
                        node = Node(node.var, node.op, [iv, const], relax.op.multiply(iv, const), node.attrs)
                        nodes.append(node)
                        continue
        nodes.append(node)
    outputs = [subst.get(o, o) if isinstance(o, relax.Var) else o for o in flat.outputs]
    return FlatFunction(flat.name, flat.params, nodes, outputs, flat.tuple_output), rewrites


def _same_sinfo(a, b) -> bool:
    return tvm.ir.structural_equal(a.struct_info, b.struct_info)


def _outline(flat: FlatFunction, groups: list[KernelGroup], attrs) -> Any:
    """The module with one private function per kernel group and ``flat.name`` calling them."""
    bb = relax.BlockBuilder()
    funcs = []
    for g in groups:
        inputs = g.inputs()
        params = [relax.Var(str(v.name_hint), v.struct_info) for v in inputs]
        remap = dict(zip(inputs, params, strict=True))
        nodes = [
            Node(n.var, n.op, [remap.get(a, a) if isinstance(a, relax.Var) else a for a in n.args], n.call, n.attrs)
            for n in g.nodes
        ]
        sub = FlatFunction(g.name, params, nodes, [g.output])
        func = rebuild(sub, {"tessera.family": g.family}, private=True)
        funcs.append(relax.utils.copy_with_new_vars(func))
    subst: dict[Any, Any] = {}
    with bb.function(flat.name, list(flat.params), attrs):
        gvs = [bb.add_func(f, g.name) for f, g in zip(funcs, groups, strict=True)]
        outs_set = {o for o in flat.outputs if isinstance(o, relax.Var)}
        with bb.dataflow():
            for g, gv in zip(groups, gvs, strict=True):
                args = [subst.get(v, v) for v in g.inputs()]
                call = relax.Call(gv, args)
                name = str(g.output.name_hint)
                subst[g.output] = (
                    bb.emit_output(call, name_hint=name) if g.output in outs_set else bb.emit(call, name_hint=name)
                )
            outs = [subst.get(o, o) for o in flat.outputs]
            outs = [bb.emit_output(o) if o in set(flat.params) else o for o in outs]
        bb.emit_func_output(relax.Tuple(outs) if flat.tuple_output else outs[0])
    return keyed(bb.get(), flat.name)


def run_graph_passes(traced, name: str) -> GraphIR:
    """Run :data:`GRAPH_PASSES` on ``traced`` (an IRModule whose function ``name`` is the kernel)."""
    graph = GraphIR(name, traced)
    mod = traced
    state: dict[str, Any] = {}

    def step(pass_name: str, fn: Callable[[], str]) -> None:
        start = time.perf_counter()
        status = fn()
        graph.records.append(
            PassRecord(len(graph.records), "graph", pass_name, time.perf_counter() - start, status or "ran")
        )

    def canonicalize() -> str:
        nonlocal mod
        mod = relax.transform.CanonicalizeBindings()(mod)
        return "ran"

    def simplify() -> str:
        nonlocal mod
        func = mod[name]
        flat, count = _simplify(flatten(func, name))
        mod = tvm.IRModule({name: rebuild(flat, dict(func.attrs) if func.attrs else None)})
        return f"ran ({count} rewrite{'s' if count != 1 else ''})"

    def dce() -> str:
        nonlocal mod
        mod = relax.transform.DeadCodeElimination([name])(mod)
        state["flat"] = flatten(mod[name], name)
        state["fuser"] = Fuser(state["flat"])
        return "ran"

    def fuse_epilogues() -> str:
        fuser = state["fuser"]
        fuser.fuse_gemms()
        fuser.fuse_attention()
        return f"ran ({len(fuser.groups)} kernel{'s' if len(fuser.groups) != 1 else ''})"

    def fuse_kernels() -> str:
        fuser = state["fuser"]
        before = len(fuser.groups)
        fuser.fuse_rest()
        graph.groups = fuser.run()
        return f"ran (+{len(graph.groups) - before}, {len(graph.groups)} kernels in all)"

    def outline() -> str:
        nonlocal mod
        func = mod[name]
        mod = _outline(state["flat"], graph.groups, dict(func.attrs) if func.attrs else None)
        return "ran"

    for pass_name, fn in zip(
        GRAPH_PASSES, (canonicalize, simplify, dce, fuse_epilogues, fuse_kernels, outline), strict=True
    ):
        step(pass_name, fn)
    graph.simplified = state["flat"]
    graph.module = mod
    return graph
