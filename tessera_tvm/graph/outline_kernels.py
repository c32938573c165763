"""tessera.OutlineKernels: one private Relax function per kernel group (graph phase).

Each group of the kernel function's ``tessera.kernel_groups`` becomes a private function named after
the group, with attribute ``tessera.family``; the kernel function then calls them in order. This is
the Graph IR that ``inspect_ir("graph")`` shows and the later stages read (:func:`read_kernels`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .._tvm import tvm
from ..registry import BuildContext, register_pass, tessera_module_pass
from .collectives import Collective, collective_name, function_collectives, is_collective
from .fusion import GROUPS_ATTR, KernelGroup, read_groups
from .nodes import FlatFunction, GraphIRError, Node, call_with, flatten, kernel_functions, keyed, rebuild

relax = tvm.relax


def outline(flat: FlatFunction, groups: list[KernelGroup], attrs) -> Any:
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
        by_output = {g.output: (g, gv) for g, gv in zip(groups, gvs, strict=True)}
        with bb.dataflow():
            # in program order: a kernel's call where its output was bound, a collective where it was
            for node in flat.nodes:
                if is_collective(node):
                    call = call_with(node, [subst.get(a, a) if isinstance(a, relax.Var) else a for a in node.args])
                elif node.var in by_output:
                    g, gv = by_output[node.var]
                    call = relax.Call(gv, [subst.get(v, v) for v in g.inputs()])
                else:
                    continue
                name = str(node.var.name_hint)
                subst[node.var] = (
                    bb.emit_output(call, name_hint=name) if node.var in outs_set else bb.emit(call, name_hint=name)
                )
            outs = [subst.get(o, o) for o in flat.outputs]
            outs = [bb.emit_output(o) if o in set(flat.params) else o for o in outs]
        bb.emit_func_output(relax.Tuple(outs) if flat.tuple_output else outs[0])
    return keyed(bb.get(), flat.name)


@register_pass("tessera.OutlineKernels", ir="relax", doc="one private function per kernel; the kernel calls them")
def _outline_kernels(ctx: BuildContext):
    def run(mod, _pass_ctx):
        out = mod
        for gv, func in kernel_functions(mod):
            name = str(gv.name_hint)
            if GROUPS_ATTR not in func.attrs:
                raise GraphIRError(
                    f"{name}: no kernel groups to outline; tessera.FuseEpilogues and tessera.FuseKernels form "
                    "them — are they disabled or missing from the config's graph list?"
                )
            flat = flatten(func, name)
            groups = read_groups(flat, func.attrs[GROUPS_ATTR])
            grouped = {node for g in groups for node in g.nodes}
            loose = [f"{n.name} = {n.op}" for n in flat.nodes if n not in grouped and not is_collective(n)]
            if loose:
                raise GraphIRError(
                    f"{name}: {', '.join(loose)} belong(s) to no kernel group; tessera.FuseKernels forms the "
                    "rest of the kernels — is it disabled or missing from the config's graph list?"
                )
            attrs = {k: v for k, v in func.attrs.items() if k != GROUPS_ATTR}
            outlined = outline(flat, groups, attrs)
            funcs = {g: f for g, f in out.functions.items() if g != gv}
            funcs.update(outlined.functions)
            out = tvm.IRModule(funcs)
        return out

    return tessera_module_pass(run, name="tessera.OutlineKernels")


def read_kernels(mod, name: str) -> tuple[FlatFunction, list[KernelGroup]]:
    """The kernel ``name`` of an outlined module as one flat function and its kernel groups.

    Each call of an outlined function is inlined: its bindings read the caller's values and its last
    binding is the caller's. A sharded kernel's collectives (``tessera.InsertCollectives``) are not
    kernels: those at an output are read as the local values they act on, and those between the
    kernels keep their values and are listed in ``FlatFunction.collectives`` (``Instance.run`` asks
    the runtime to compute them). Without OutlineKernels (disabled), the groups come from the function's
    ``tessera.kernel_groups`` attribute.
    """
    func = mod[name]
    if func.attrs is not None and GROUPS_ATTR in func.attrs:
        flat = flatten(func, name)
        return flat, read_groups(flat, func.attrs[GROUPS_ATTR])
    blocks = list(func.body.blocks)
    if len(blocks) > 1:
        raise GraphIRError(f"{name}: expected one dataflow block, found {len(blocks)}")
    value_of: dict[Any, Any] = {}
    nodes: list[Node] = []
    groups: list[KernelGroup] = []
    between = {c.var: c for c in function_collectives(func) if c.output < 0}
    collectives: list[Collective] = []
    for binding in blocks[0].bindings if blocks else []:
        call = binding.value
        if isinstance(call, relax.Var):
            value_of[binding.var] = value_of.get(call, call)
            continue
        if collective_name(call) is not None:  # a sharded kernel's collective (tessera.InsertCollectives)
            c = between.get(binding.var)
            if c is None:  # at an output, run after the kernels: the output is the local value it acts on
                value_of[binding.var] = value_of.get(call.args[1], call.args[1])
            else:  # between the kernels: a value of its own, which the runtime's hook computes
                collectives.append(
                    replace(
                        c,
                        source=value_of.get(c.source, c.source),
                        others=tuple(value_of.get(o, o) for o in c.others),
                    )
                )
            continue
        callee = call.op if isinstance(call, relax.Call) else None
        if not isinstance(callee, tvm.ir.GlobalVar) or "tessera.family" not in (mod[callee].attrs or {}):
            raise GraphIRError(
                f"{name}: binding {binding.var.name_hint} is not a call of an outlined kernel; the graph phase "
                "must form kernels (tessera.FuseKernels) — is it disabled or missing from the config's graph list?"
            )
        kernel = mod[callee]
        inner = flatten(kernel, str(callee.name_hint))
        args = dict(zip(kernel.params, [value_of.get(a, a) for a in call.args], strict=True))
        (result,) = inner.outputs
        site = binding.var
        if site.struct_info.shape is None and result.struct_info.shape is not None:
            # a kernel reading a gathered value (shape S * 2) returns a shape its signature cannot
            # state; the value keeps the shape its body computes (dims are bound by name)
            site = relax.Var(site.name_hint, result.struct_info)
            value_of[binding.var] = site
        members = []
        for node in inner.nodes:
            var = site if node.var.same_as(result) else node.var
            args[node.var] = var
            members.append(Node(var, node.op, [args.get(a, a) for a in node.args], node.call, node.attrs))
        nodes += members
        groups.append(KernelGroup(str(kernel.attrs["tessera.family"]), members, str(callee.name_hint)))
    result = func.body.body
    outputs = list(result.fields) if isinstance(result, relax.Tuple) else [result]
    flat = FlatFunction(
        name,
        list(func.params),
        nodes,
        [value_of.get(o, o) for o in outputs],
        isinstance(result, relax.Tuple),
        collectives,
    )
    return flat, groups
