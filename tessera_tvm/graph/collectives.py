"""Collectives of a sharded kernel: their bindings in the kernel function, and reading them back.

``tessera.InsertCollectives`` (a graph pass before fusion) adds these collectives, and at each
output what brings it to the sharding it must have, as bindings of the kernel function. The fusion
passes never fuse across them, and OutlineKernels keeps them in the kernel function between the
kernels they separate:

    partial -> replicated   R.call_pure_packed("tessera.all_reduce", x, axis)           sum over the axis
    partial -> split d      R.call_pure_packed("tessera.reduce_scatter", x, axis, d)    sum, then cut d
    split d -> replicated   R.call_pure_packed("tessera.all_gather", x, axis, d)        concatenate on d
    split e -> split d      R.call_pure_packed("tessera.all_to_all", x, axis, d, e)     rank j gets piece j of d
                                                                                    from each, joined on e
    replicated -> split d   R.call_pure_packed("tessera.slice", x, axis, d)             this rank's piece of d
                                                                                    (no communication)
    keys of rank c          R.call_pure_packed("tessera.prefix", x, axis, d, c + 1)     the first c + 1 of the
                                                                                    n pieces of d (2n on a
                                                                                    zigzag axis; no
                                                                                    communication)
    zigzag queries          R.call_pure_packed("tessera.half", x, axis, d, h)           half h of this rank's
                                                                                    piece (no communication)
    zigzag results          R.call_pure_packed("tessera.concat", a, axis, d, b)         a, then b, on d (no
                                                                                    communication)
    too few kv heads        R.call_pure_packed("tessera.repeat", x, axis, d, r)         each entry of d r times
                                                                                    in a row (no
                                                                                    communication)

A value split on one dim that must be split on another (at an output) is all-to-all'd: each rank
sends piece ``j`` of the new dim to rank ``j``, which joins what it receives on the old dim.

A collective that a kernel reads runs between the kernels (``read_kernels`` keeps its value, of its
own shape, and lists it in ``FlatFunction.collectives``; ``Instance.run`` calls the runtime's hook
for it when a kernel first needs it). The collectives at the outputs run after the kernels, where
they are bucketed and may overlap other work. ``read_collectives`` returns both kinds for the
runtime (``tessera.distributed``), which runs them on torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._tvm import tvm

relax = tvm.relax

COLLECTIVES = (
    "tessera.all_reduce",
    "tessera.reduce_scatter",
    "tessera.all_gather",
    "tessera.all_to_all",
    "tessera.slice",
    "tessera.prefix",
    "tessera.half",
    "tessera.concat",
    "tessera.repeat",
)
#: Kinds that move no data between the ranks (each rank keeps a part of what it holds, or joins two).
LOCAL_KINDS = ("slice", "prefix", "half", "concat", "repeat")
#: Kinds that cut a dim into the ranks' pieces (the result's dim is the input's divided by the ranks).
CUTTING_KINDS = ("reduce_scatter", "slice")


def split_pieces(ranks: int, zigzag: bool) -> int:
    """How many pieces a dim split over ``ranks`` is cut into: one per rank, or two (zigzag)."""
    return ranks * (2 if zigzag else 1)


def value_dims(value) -> list:
    """``value``'s shape, one PrimExpr per dim."""
    return list(value.struct_info.shape.values)


@dataclass(frozen=True)
class Collective:
    """One collective: ``kind`` over mesh axis ``axis`` (``dim`` for gather/scatter), at kernel output
    ``output``, or between the kernels (``output`` -1) on the value ``source`` (read_collectives)."""

    kind: str  # "all_reduce" | "reduce_scatter" | "all_gather" | "all_to_all" | LOCAL_KINDS (no communication)
    output: int  # index of the kernel output, or -1 between the kernels
    axis: str
    dim: int | None = None
    after: str = ""  # between the kernels: the fused kernel whose output it acts on ("" for a parameter)
    var: Any = field(default=None, compare=False, repr=False)  # its value (the binding's var)
    source: Any = field(default=None, compare=False, repr=False)  # the value it acts on
    pieces: int | None = None  # a prefix: how many of the axis's pieces of ``dim`` it keeps; a half: which
    others: tuple = field(default=(), compare=False, repr=False)  # a concat: the values after ``source``
    from_dim: int | None = None  # an all-to-all: the dim its value is split on (it leaves it split on ``dim``)

    def text(self, name: str) -> str:
        where = "" if self.dim is None else f", dim {self.dim}"
        if self.kind == "half":
            kept = f", its {('first', 'second')[self.pieces]} half"
        elif self.kind == "concat":
            kept = f", then {', '.join(str(o.name_hint) for o in self.others)}"
        elif self.kind == "all_to_all":
            kept = f" (split on dim {self.from_dim} before)"
        elif self.kind == "repeat":
            kept = f", each entry {self.pieces} times"
        else:
            kept = "" if self.pieces is None else f", its first {self.pieces} piece{'s' if self.pieces != 1 else ''}"
        return f"{self.kind}({name}) over {self.axis!r}{where}{kept}"

    @property
    def value_name(self) -> str:
        """What it acts on, in words: ``output 0``, ``matmul's output``, ``parameter X``."""
        if self.output >= 0:
            return f"output {self.output}"
        return f"{self.after}'s output" if self.after else str(self.source.name_hint)


def collective_node(
    kind: str, value, axis: str, dim: int | None, ranks: int, pieces: int | None = None, *, zigzag: bool = False
):
    """The binding ``value_kind = R.call_pure_packed("tessera.<kind>", value, axis[, dim[, pieces]])``,
    its shape that of ``value`` with ``dim`` multiplied (all-gather) or divided (reduce-scatter, slice)
    by the ``ranks`` on ``axis``, or ``pieces`` of its ``ranks`` pieces (prefix), or halved (half)."""
    from .nodes import node_of

    call = collective_call(kind, value, axis, dim, ranks, pieces, zigzag=zigzag)
    name = f"{value.name_hint}_{kind}{pieces if kind == 'half' else ''}"
    return node_of(relax.Var(name, call.sinfo_args[0]), call)


def collective_call(
    kind: str,
    value,
    axis: str,
    dim: int | None,
    ranks: int,
    pieces: int | None = None,
    *,
    zigzag: bool = False,
    others: list | tuple = (),
):
    """``R.call_pure_packed("tessera.<kind>", value, axis[, dim[, pieces]][, *others])`` with its
    result's struct info. On a ``zigzag`` axis a prefix counts the ``2 * ranks`` pieces of the
    load-balanced split; a concat joins ``value`` and ``others`` on ``dim``."""
    dims = value_dims(value)
    if kind == "all_gather":
        dims[dim] = _whole(dims[dim], ranks)
    elif kind == "all_to_all":  # ``pieces``: the dim it was split on, now whole
        dims[dim] = tvm.arith.Analyzer().simplify(tvm.tirx.floordiv(dims[dim], ranks))
        dims[pieces] = _whole(dims[pieces], ranks)
    elif kind in CUTTING_KINDS:
        dims[dim] = tvm.tirx.floordiv(dims[dim], ranks)
    elif kind == "prefix":
        dims[dim] = tvm.arith.Analyzer().simplify(tvm.tirx.floordiv(dims[dim], split_pieces(ranks, zigzag)) * pieces)
    elif kind == "half":
        dims[dim] = tvm.tirx.floordiv(dims[dim], 2)
    elif kind == "concat":
        dims[dim] = tvm.arith.Analyzer().simplify(sum((value_dims(o)[dim] for o in others), dims[dim]))
    elif kind == "repeat":
        dims[dim] = tvm.arith.Analyzer().simplify(dims[dim] * pieces)
    sinfo = relax.TensorStructInfo(dims, value.struct_info.dtype)
    args = [value, relax.StringImm(axis)] + ([] if dim is None else [relax.PrimValue(dim)])
    args += [] if pieces is None else [relax.PrimValue(pieces)]
    return relax.op.call_pure_packed(f"tessera.{kind}", *args, *others, sinfo_args=[sinfo])


def _whole(piece, ranks: int):
    """A dim split over ``ranks`` (``piece``) whole again: ``H // n`` back to ``H``, not ``H // n * n``
    (the sharding divides it evenly), else ``piece * n``."""
    if isinstance(piece, tvm.tirx.FloorDiv) and isinstance(piece.b, tvm.tirx.IntImm) and int(piece.b) == ranks:
        return piece.a
    return tvm.arith.Analyzer().simplify(piece * ranks)


def is_collective(node) -> bool:
    return node.op == "call_pure_packed" and collective_name(node.call) is not None


def read_collectives(mod, name: str) -> list[Collective]:
    """The collectives ``tessera.InsertCollectives`` placed in kernel ``name``, in program order."""
    return function_collectives(mod[name])


def function_collectives(func) -> list[Collective]:
    """The collectives among ``func``'s bindings. One is at an output (``output`` >= 0: it runs after
    the kernels) when its value, through later collectives of it (a 2-D mesh), is returned and no
    kernel reads it; the others run between the kernels (``output`` -1)."""
    result = func.body.body
    outputs = list(result.fields) if isinstance(result, relax.Tuple) else [result]
    bindings = list(func.body.blocks[0].bindings) if func.body.blocks else []
    producers = {b.var: b.value for b in bindings}
    kinds = {b.var: collective_name(b.value) for b in bindings}
    read_by_kernel = set()
    for b in bindings:
        if kinds[b.var] is None and isinstance(b.value, relax.Call):
            read_by_kernel.update(a for a in b.value.args if isinstance(a, relax.Var))
    found = []
    for b in bindings:
        kind = kinds[b.var]
        if kind is None:
            continue
        chain, inner = b.var, b.var in read_by_kernel
        later = [x.var for x in bindings if kinds[x.var] and x.value.args[1].same_as(chain)]
        while later:  # a second collective on the same value (a 2-D mesh) consumes this one
            chain = later[0]
            inner = inner or chain in read_by_kernel
            later = [x.var for x in bindings if kinds[x.var] and x.value.args[1].same_as(chain)]
        index = next((k for k, o in enumerate(outputs) if o.same_as(chain)), -1)
        axis, dim, pieces, others = collective_args(b.value)
        source = producers.get(b.value.args[1])
        after = str(source.op.name_hint) if isinstance(source, relax.Call) and hasattr(source.op, "name_hint") else ""
        if inner or kind == "concat":  # a concat joins values on this rank: it runs where it is read
            index = -1
        from_dim = pieces if kind == "all_to_all" else None  # its call's last argument
        pieces = None if kind == "all_to_all" else pieces
        found.append(
            Collective(
                kind, index, axis, dim, after if index < 0 else "", b.var, b.value.args[1], pieces, others, from_dim
            )
        )
    return found


def collective_args(call) -> tuple[str, int | None, int | None, tuple]:
    """A collective's ``(axis, dim, pieces, others)`` from its call ``(callee, x, axis[, dim[, pieces]][, *others])``."""
    args = list(call.args)
    values = [int(a.value) for a in args[3:] if isinstance(a, relax.PrimValue)]
    others = tuple(a for a in args[3:] if not isinstance(a, relax.PrimValue))
    return str(args[2].value), (values[0] if values else None), (values[1] if len(values) > 1 else None), others


def collective_name(value) -> str | None:
    """A collective's kind (``all_reduce``, ``all_gather``, ``slice``, ...: COLLECTIVES) for its call, else None."""
    if not isinstance(value, relax.Call) or str(getattr(value.op, "name", "")) != "relax.call_pure_packed":
        return None
    callee = str(value.args[0].global_symbol) if hasattr(value.args[0], "global_symbol") else str(value.args[0])
    for c in COLLECTIVES:
        if callee == c:
            return c.removeprefix("tessera.")
    return None
