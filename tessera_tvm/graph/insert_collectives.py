"""``tessera.InsertCollectives``: a sharded kernel's collectives placed as bindings of its function.

:class:`~tessera_tvm.graph.sharding.Propagator` follows the sharding through the flat graph and
mends each op's inputs with collectives; what each output needs to reach the sharding it must have
follows (:func:`insert_collectives`). The bindings' forms are :mod:`.collectives`'s.
"""

from __future__ import annotations

from .._tvm import tvm
from ..pass_log import report_status
from ..registry import BuildContext, register_pass, tessera_module_pass
from .collectives import Collective, collective_args, collective_call, collective_name, collective_node, is_collective
from .nodes import FlatFunction, flatten, kernel_functions, rebuild, replace_functions
from .sharding import SHARDING_ATTR, Propagator

relax = tvm.relax


def _output_collectives(outputs, state, sharding: dict, kernel: str) -> list[Collective]:
    wanted = sharding.get("outputs", [])
    out = []
    for k, value in enumerate(outputs):
        have = state.get(value, {}) if isinstance(value, relax.Var) else {}
        want = wanted[k] if k < len(wanted) else {}
        for axis in sharding["mesh"]:
            h, w = have.get(axis), want.get(axis)
            w = None if w is None else ("split", int(w))
            if h == w:
                continue
            if h == ("partial",):
                out.append(
                    Collective("all_reduce" if w is None else "reduce_scatter", k, axis, None if w is None else w[1])
                )
            elif h is not None and w is not None:  # split on another dim: each rank sends each its piece
                out.append(Collective("all_to_all", k, axis, w[1], from_dim=h[1]))
            elif h is not None:
                out.append(Collective("all_gather", k, axis, h[1]))
            else:  # whole: cut to this rank's piece
                out.append(Collective("slice", k, axis, w[1]))
    return out


def insert_collectives(flat: FlatFunction, sharding: dict, kernel: str) -> FlatFunction:
    """``flat`` with its collectives as nodes: those that let each op's inputs fit its rule (see
    :meth:`Propagator.mend`), then what each output needs."""
    prop = Propagator(flat, sharding, kernel)
    state = prop.run()
    nodes = list(prop.nodes)
    outputs = list(flat.outputs)
    wanted = [
        (c, _gathered_resplit(nodes, outputs, outputs[c.output], c.axis, c.dim) if c.kind == "all_gather" else None)
        for c in _output_collectives(outputs, state, sharding, kernel)
    ]
    # one output's collectives are over different axes (in any order, the same): a resplit's gather first
    for c, resplit in sorted(wanted, key=lambda cr: cr[1] is None):
        value, dim = outputs[c.output], c.dim
        if resplit is not None:  # gather what the all-to-all took in, on its dim: one collective, not two
            nodes.remove(resplit)
            value, dim = resplit.args[1], collective_args(resplit.call)[2]
        node = collective_node(c.kind, value, c.axis, dim, sharding["mesh"][c.axis], c.from_dim)
        nodes.append(node)
        outputs[c.output] = node.var
    return FlatFunction(flat.name, flat.params, nodes, outputs, flat.tuple_output)


def _gathered_resplit(nodes: list, outputs: list, value, axis: str, dim: int):
    """The all-to-all node over ``axis`` that split output ``value`` on ``dim``, if nothing else reads
    it (an all-to-all attention's result re-split on the sequence, wanted whole): all-gathering its
    input on the dim it was split on gives the same tensor (on a zigzag axis too: the all-to-all
    and the all-gather order that dim's pieces alike), one collective instead of two. Else None."""
    node = next((n for n in nodes if n.var.same_as(value)), None)
    if node is None or not is_collective(node) or collective_name(node.call) != "all_to_all":
        return None
    a, d, _, _ = collective_args(node.call)
    readers = [n for n in nodes if any(x.same_as(value) for x in n.args if isinstance(x, relax.Var))]
    if a != axis or d != dim or readers or sum(o.same_as(value) for o in outputs if isinstance(o, relax.Var)) != 1:
        return None
    return node


@register_pass(
    "tessera.InsertCollectives",
    ir="relax",
    doc="a sharded kernel (ts.shard): its collectives as bindings (all-reduce, reduce-scatter, all-gather)",
)
def _insert_collectives(ctx: BuildContext):
    def run(mod, _pass_ctx):
        funcs = {}
        placed = 0
        for gv, func in kernel_functions(mod):
            if func.attrs is None or SHARDING_ATTR not in func.attrs:
                continue
            name = str(gv.name_hint)
            flat = flatten(func, name)
            if any(is_collective(n) for n in flat.nodes):
                continue  # placed already
            sharding = _plain(func.attrs[SHARDING_ATTR])
            sharded = insert_collectives(flat, sharding, name)
            placed += sum(1 for n in sharded.nodes if is_collective(n))

            zigzag = frozenset(sharding.get("zigzag", ()))

            def remake(node, args, mesh=sharding["mesh"], zigzag=zigzag):
                """A collective's result on its input as rebuilt (a gather upstream changes its shape)."""
                kind = collective_name(node.call)
                if kind in (None, "concat"):  # a concat keeps the shape it was declared with
                    return None
                axis, dim, pieces, _ = collective_args(node.call)
                others = [a for a in args[3:] if not isinstance(a, relax.PrimValue)]
                if any(getattr(a.struct_info, "shape", None) is None for a in [args[1], *others]):
                    return None  # its input's shape is not re-inferred (an attention with a bias): as declared
                return collective_call(
                    kind, args[1], axis, dim, mesh[axis], pieces, zigzag=axis in zigzag, others=others
                )

            funcs[gv] = rebuild(sharded, dict(func.attrs), remake=remake)
        report_status(f"{placed} collective{'s' if placed != 1 else ''}" if funcs else "not sharded")
        return replace_functions(mod, funcs) if funcs else mod

    return tessera_module_pass(run, name="tessera.InsertCollectives")


def _plain(value):
    """A TVM attribute (Map/Array/str/int) as plain Python."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int | float | bool):
        return value
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "__len__"):
        return [_plain(v) for v in value]
    if hasattr(value, "value"):
        return value.value
    return value
