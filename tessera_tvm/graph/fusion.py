"""Kernel fusion over a Graph IR dataflow block: which bindings become one device kernel.

Every binding ends in exactly one :class:`KernelGroup`:

- ``gemm``: a ``matmul`` with transposes of its operands (``permute_dims`` of the last two axes)
  and its epilogue, the chain of single-use consumers that a GEMM can apply to its accumulator:
  casts, activations, clips with constant bounds (ReLU6), a ``[N]`` bias, a residual of the output's
  shape, scalar scale/add.
- ``attention``: ``R.nn.attention`` with the ``[B,H,S,D] <-> [B,S,H,D]`` permutes around it.
- ``softmax``, ``norm``, ``reduce``: the op alone (norms with their implicit ones/zeros), plus a
  trailing single-use cast.
- ``elementwise``: a tree of element-wise ops whose inner values are used once.

A value is internal to a group only when its one use is inside the group and it is not a function
output, so each group has one output and groups run in the order of their outputs.

Between the graph passes the groups live in the IR: the kernel function's ``tessera.kernel_groups``
attribute lists each group's family, name and bindings (:func:`groups_attr`, :func:`read_groups`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import op_table
from .._tvm import tvm
from .collectives import is_collective
from .nodes import FlatFunction, GraphIRError, Node, clip_bounds, constant_value

relax = tvm.relax

#: Element-wise Relax ops and their names in tile expressions / GEMM epilogues (the op table's).
UNARY = op_table.relax_to_tile(op_table.UNARY)
BINARY = op_table.relax_to_tile(op_table.BINARY)
EPILOGUE_ACTIVATIONS = tuple(op.relax for op in op_table.epilogue_activations() if op.relax)
#: The Relax ops kernels are built around (the op table's anchors, as the graph passes spell them).
ANCHORS = op_table.relax_ops()
REDUCTIONS = op_table.relax_ops("reduce")
_NORMS = op_table.relax_ops("norm")
_SOFTMAX = op_table.relax_ops("softmax")

#: Relax op -> its fragment of kernel names (``fused_matmul_add_gelu``) and reports.
_SHORT = {
    **{op.relax[0]: op.name for op in op_table.ANCHORS},
    **op_table.short_names(),
}


def swish_shape(nodes: list[Node], x) -> float | None:
    """``beta`` when ``nodes`` are ``x * beta``, ``sigmoid`` of it and ``x * sigmoid(...)`` (in either
    operand order, ``beta`` a scalar constant): how Relax spells an activation it has no op for."""
    if len(nodes) != 3:
        return None
    scaled, gate, out = nodes
    if (scaled.op, gate.op, out.op) != ("multiply", "sigmoid", "multiply") or not gate.args[0].same_as(scaled.var):
        return None
    a, b = scaled.args
    if not (a.same_as(x) or b.same_as(x)):
        return None
    c, d = out.args
    if not ((c.same_as(x) and d.same_as(gate.var)) or (d.same_as(x) and c.same_as(gate.var))):
        return None
    return constant_value(b if a.same_as(x) else a)


def swish_motif(nodes: list[Node], x) -> op_table.OpDef | None:
    """The op-table activation that ``nodes`` compute from ``x`` as ``x * sigmoid(beta * x)``."""
    beta = swish_shape(nodes, x)
    return None if beta is None else op_table.swish_op(beta)


def is_elementwise(node: Node) -> bool:
    """An element-wise op Tessera computes: a unary, a binary, or a clip with constant bounds."""
    return node.op in UNARY or node.op in BINARY or clip_bounds(node) is not None


@dataclass(eq=False)
class KernelGroup:
    """Bindings that become one device kernel; ``nodes`` in program order, the last is the output."""

    family: str  # gemm | attention | softmax | norm | reduce | elementwise
    nodes: list[Node]
    name: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def output(self):
        return self.nodes[-1].var

    @property
    def anchor(self) -> Node:
        for n in self.nodes:
            if n.op in ANCHORS:
                return n
        return self.nodes[-1]

    def inputs(self) -> list[Any]:
        """Vars read from outside the group, in order of first use."""
        inside = {n.var for n in self.nodes}
        seen: list[Any] = []
        for n in self.nodes:
            for a in n.args:
                if isinstance(a, relax.Var) and a not in inside and a not in seen:
                    seen.append(a)
        return seen

    def describe(self) -> str:
        nodes = [n for n in self.nodes if n.op not in ("permute_dims", "ones", "zeros")]
        ops, i = [], 0
        while i < len(nodes):
            scaled = nodes[i]
            x = next((a for a in scaled.args if constant_value(a) is None), None) if scaled.op == "multiply" else None
            motif = swish_motif(nodes[i : i + 3], x) if x is not None else None
            ops.append(motif.kernel_name if motif else _SHORT.get(scaled.op, scaled.op))
            i += 3 if motif else 1
        return " + ".join(ops)


def _swaps_last_two(node: Node) -> bool:
    axes = node.attrs.get("axes")
    rank = len(node.var.struct_info.shape.values)
    return (
        node.op == "permute_dims"
        and axes is not None
        and rank >= 2
        and tuple(axes) == (*range(rank - 2), rank - 1, rank - 2)
    )


def _is_bhsd_swap(node: Node | None) -> bool:
    return node is not None and node.op == "permute_dims" and tuple(node.attrs.get("axes") or ()) == (0, 2, 1, 3)


def _same_shape(a, b) -> bool:
    sa, sb = a.struct_info.shape.values, b.struct_info.shape.values
    return len(sa) == len(sb) and all(tvm.ir.structural_equal(x, y) for x, y in zip(sa, sb, strict=True))


class Fuser:
    """Forms the kernel groups of one flat function (see the module docstring)."""

    def __init__(self, flat: FlatFunction) -> None:
        self.flat = flat
        self.uses = flat.uses()
        self.consumers = flat.consumers()
        self.producer = flat.producers()
        self.outputs = {o for o in flat.outputs if isinstance(o, relax.Var)}
        self.group_of: dict[Node, KernelGroup] = {}
        self.groups: list[KernelGroup] = []

    # helpers ----------------------------------------------------------------------------------------
    def _single_consumer(self, var) -> Node | None:
        """The one node reading ``var``, when ``var`` has no other use and is not an output."""
        if var in self.outputs or self.uses.get(var, 0) != 1:
            return None
        consumer = self.consumers.get(var, [None])[0]
        return consumer if consumer is not None and consumer not in self.group_of else None

    def _free_producer(self, expr) -> Node | None:
        """The producer of ``expr`` when it is used once (by the asking node) and not grouped yet."""
        if not isinstance(expr, relax.Var) or expr in self.outputs or self.uses.get(expr, 0) != 1:
            return None
        node = self.producer.get(expr)
        return node if node is not None and node not in self.group_of else None

    def _add(self, family: str, nodes: list[Node]) -> KernelGroup:
        order = {n: i for i, n in enumerate(self.flat.nodes)}
        group = KernelGroup(family, sorted(nodes, key=order.__getitem__))
        for n in nodes:
            self.group_of[n] = group
        self.groups.append(group)
        return group

    # gemm + epilogue --------------------------------------------------------------------------------
    def _epilogue_step(self, consumer: Node, cur, out) -> bool:
        op = consumer.op
        if op == "astype" or op in EPILOGUE_ACTIVATIONS or op == "negative" or clip_bounds(consumer) is not None:
            return True
        if op not in BINARY:
            return False
        a, b = consumer.args
        other = b if a.same_as(cur) else a
        if other.same_as(cur):
            return False  # x + x: not an epilogue step
        if constant_value(other) is not None:
            return op in ("add", "multiply") or (op in ("subtract", "divide") and a.same_as(cur))
        if op != "add" or not isinstance(other, relax.Var):
            return False
        shape = other.struct_info.shape.values
        out_shape = out.struct_info.shape.values
        is_bias = len(shape) == 1 and tvm.ir.structural_equal(shape[0], out_shape[-1])
        return is_bias or _same_shape(other, out)

    def claim(self, groups: list[KernelGroup]) -> None:
        """Take ``groups`` (formed by an earlier pass) as they are."""
        for group in groups:
            self._add(group.family, group.nodes).name = group.name

    def fuse_gemms(self, epilogue: bool = True) -> None:
        """Each matmul with the transposes of its operands and (``epilogue``) its epilogue chain."""
        for node in self.flat.nodes:
            if node.op != "matmul" or node in self.group_of:
                continue
            members = [node]
            for arg in node.args:
                prod = self._free_producer(arg)
                if prod is not None and _swaps_last_two(prod):
                    members.append(prod)
            cur = node.var
            while epilogue:
                consumer = self._single_consumer(cur)
                if consumer is None or consumer in members or not self._epilogue_step(consumer, cur, node.var):
                    break
                members.append(consumer)
                cur = consumer.var
            self._add("gemm", members)

    def fuse_attention(self) -> None:
        for node in self.flat.nodes:
            if node.op != "nn.attention" or node in self.group_of:
                continue
            members = [node]
            for arg in node.args[:3]:
                prod = self._free_producer(arg)
                if not _is_bhsd_swap(prod):
                    raise GraphIRError(
                        f"{self.flat.name}: attention {node.name} reads {arg} directly; Tessera "
                        "attention is emitted on [B, H, S, D] tensors (permute_dims around it)"
                    )
                members.append(prod)
            after = self._single_consumer(node.var)
            if not _is_bhsd_swap(after):
                raise GraphIRError(
                    f"{self.flat.name}: attention {node.name} must be followed by its permute back to [B, H, S, D]"
                )
            members.append(after)
            self._add("attention", members)

    # the rest ---------------------------------------------------------------------------------------
    def _with_trailing_cast(self, node: Node) -> list[Node]:
        consumer = self._single_consumer(node.var)
        return [node, consumer] if consumer is not None and consumer.op == "astype" else [node]

    def fuse_rest(self) -> None:
        for node in self.flat.nodes:
            if node in self.group_of or is_collective(node):  # a sharded kernel's collective: not a kernel
                continue
            if node.op in _SOFTMAX:
                self._add("softmax", self._with_trailing_cast(node))
            elif node.op in _NORMS:
                fills = [
                    p for a in node.args[1:] if (p := self._free_producer(a)) is not None and p.op in ("ones", "zeros")
                ]
                self._add("norm", fills + self._with_trailing_cast(node))
            elif node.op in REDUCTIONS:
                self._add("reduce", self._with_trailing_cast(node))
        # Element-wise trees: walk backwards so each root collects its single-use producers.
        for node in reversed(self.flat.nodes):
            if node in self.group_of or is_collective(node):
                continue
            if not is_elementwise(node):
                raise GraphIRError(
                    f"{self.flat.name}: {node.name} = {node.op} belongs to no kernel "
                    f"(no fused kernel family covers {node.op!r})"
                )
            members, stack = [], [node]
            while stack:
                n = stack.pop()
                members.append(n)
                for a in n.args:
                    prod = self._free_producer(a)
                    if prod is not None and is_elementwise(prod) and prod not in members:
                        stack.append(prod)
            self._add("elementwise", members)

    def run(self) -> list[KernelGroup]:
        """The groups in the order of their outputs, each named (``fused_matmul_add``, ``softmax_1``)."""
        order = {n.var: i for i, n in enumerate(self.flat.nodes)}
        self.groups.sort(key=lambda g: order[g.output])
        used: dict[str, int] = {self.flat.name: 1}  # the kernel's own function keeps its name
        for g in self.groups:
            base = (
                "fused_" + "_".join(g.describe().split(" + ")) if len(g.describe().split(" + ")) > 1 else g.describe()
            )
            if g.family == "attention":
                base = "flash_attention"
            used[base] = used.get(base, 0) + 1
            g.name = base if used[base] == 1 else f"{base}_{used[base] - 1}"
        return self.groups


#: The kernel function's attribute holding its groups between the fusion passes.
GROUPS_ATTR = "tessera.kernel_groups"


def groups_attr(groups: list[KernelGroup]) -> list[dict[str, Any]]:
    """``groups`` as a function attribute value: family, name and binding names of each."""
    return [{"family": g.family, "name": g.name, "bindings": [n.name for n in g.nodes]} for g in groups]


def read_groups(flat: FlatFunction, value: Any) -> list[KernelGroup]:
    """The groups a ``tessera.kernel_groups`` attribute names, over the bindings of ``flat``."""
    by_name: dict[str, Node] = {}
    for node in flat.nodes:
        if node.name in by_name:
            raise GraphIRError(
                f"{flat.name}: two bindings are named {node.name!r}, so {GROUPS_ATTR} cannot name them apart"
            )
        by_name[node.name] = node
    groups = []
    for entry in value or ():
        missing = [str(b) for b in entry["bindings"] if str(b) not in by_name]
        if missing:
            raise GraphIRError(
                f"{flat.name}: {GROUPS_ATTR} names binding(s) {', '.join(missing)} that the function no longer has "
                "(a pass between the fusion passes changed it)"
            )
        nodes = [by_name[str(b)] for b in entry["bindings"]]
        groups.append(KernelGroup(str(entry["family"]), nodes, str(entry["name"])))
    return groups
