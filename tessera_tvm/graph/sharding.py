"""Sharding: what a kernel's sharded arguments imply for its values, and where collectives go.

A sharded kernel's function carries ``tessera.sharding`` (set by ``tessera.shard``): the device mesh
(``{axis: size}``, 1-D or 2-D), each parameter's split (``{param: {mesh axis: dim index}}``; absent:
replicated) and the sharding each output must have. :class:`Propagator` follows it through the flat
graph, one mesh axis at a time. Each value is then one of the following:

    replicated              every rank holds all of it
    ("split", d)            dim d is cut into equal, contiguous pieces, piece i on the rank with coordinate i
    ("partial",)            every rank holds a summand; the value is their sum

It uses these rules:

    element-wise ops        splits must agree on a dim every operand has (broadcast dims replicated);
                            partial only through +/- of partials, negation, casts and * by a replicated
                            scalar
    matmul                  a split on K and b split on K -> partial; a split on a row or batch dim, or
                            b split on N -> that output dim split; partial times replicated -> partial
    permute_dims            the split dim moves with its axis
    attention               q, k, v split alike on batch or heads -> output split there; q split on
                            its sequence with k and v whole -> output split there (causal: each rank
                            reads the prefix of k and v up to its last query, see below); q, k, v
                            split on the sequence over an all-to-all axis -> re-split on the heads
    softmax, norms, sums    a split on a dim they do not reduce passes through

Where an op's inputs break its rule, a collective makes them fit (:meth:`Propagator.mend`):

    a partial sum           reduce-scattered on the dim another operand is split on (a residual
                            split on the rows), else all-reduced
    a whole input           of an element-wise op or a matmul, cut to this rank's piece where that
                            suffices (no communication: a replicated residual added to a split value,
                            x times a W split on K)
    a split value           all-gathered on its split dim: the fewest inputs that let the rule hold,
                            in argument order (``x @ W1`` with x split on rows and W1 on columns
                            gathers x; a softmax over a split row gathers the row). A permute's
                            result is gathered as the permute of its gathered input, so layout
                            permutes stay next to the attention that takes them in

Causal attention with its query sequence split (context parallelism, with the keys and values
all-gathered as in Llama 3) is the one rule whose graph differs between the ranks: rank ``c`` of
``n`` holds queries ``c*S/n .. (c+1)*S/n - 1``, which see the keys up to its last query. Its graph
reads the first ``c + 1`` of the ``n`` pieces of k and v (``tessera.prefix``, no communication) and
masks them bottom-right aligned, so query ``i`` of the rank sees keys ``j <= i + c*S/n``. It needs
the rank's mesh coordinates (``sharding["coords"]``, set for one rank's compile); without them the
rule raises :class:`RankDependent`. The queries and keys must be one sequence (equal lengths).

With contiguous pieces the last rank computes most of the causal triangle. An axis listed in
``sharding["zigzag"]`` (``ts.Split(..., zigzag=True)``) balances it: every dim split over it is cut
into ``2n`` pieces, and rank ``c`` holds pieces ``c`` and ``2n - 1 - c``, one after the other (its
gathers, slices and reduce-scatters follow that layout at run time). The causal attention then
becomes two on rank ``c``: the first half of its queries (``tessera.half``) over the first ``c + 1``
of the ``2n`` pieces of the gathered keys, the second half over the first ``2n - c``; their results,
each permuted back, are joined on the sequence (``tessera.concat``) where the attention's permute
back was.

An axis listed in ``sharding["attention_all_to_all"]`` (``ts.shard(..., attention="all_to_all")``,
DeepSpeed-Ulysses) re-splits an attention whose q, k and v are split on the sequence onto the heads
instead: q, k and v are all-to-all'd from the sequence to the heads, the attention runs split on
the heads over the whole sequence (causal ones too: no rank's coordinates needed), and its permute
back is all-to-all'd from the heads onto the sequence again. The heads must divide over the axis;
key/value heads that are fewer than its pieces and divide them are repeated up to them first.

What cannot be mended raises :class:`ShardingError`, naming the op and the remedy.

``tessera.InsertCollectives`` (a graph pass before fusion) adds these collectives, and at each
output what brings it to the sharding it must have, as bindings of the kernel function: their forms,
and how the runtime reads them, are :mod:`tessera_tvm.graph.collectives`'s.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from .. import op_table
from .._tvm import tvm
from ..errors import TesseraError
from .collectives import CUTTING_KINDS, collective_call, collective_node, split_pieces
from .collectives import value_dims as _dims
from .nodes import FlatFunction

relax = tvm.relax

SHARDING_ATTR = "tessera.sharding"
#: The attention bias's dim ([B, H, S_q, S_kv]) of each dim of the queries Relax splits ([B, S, H, D]).
_BIAS_DIM = {0: 0, 1: 2, 2: 1}

#: Element-wise ops (the op table's) a split passes through; a partial sum passes the linear ones too.
_LINEAR_UNARY = {op.relax for op in op_table.UNARY if op.sharding == "linear"}
_UNARY = {op.relax for op in (*op_table.UNARY, op_table.CLIP) if op.relax}
_BINARY = {op.relax for op in op_table.BINARY}
#: Anchors (the op table's) -> their sharding rule: matmul, attention, row (softmax, norms, reductions).
_ANCHOR_RULE = {op.relax[0]: op.sharding for op in op_table.ANCHORS if op.sharding}
_REDUCTIONS = op_table.relax_ops("reduce")


def dim_size(value, dim: int, env: Mapping[str, int]) -> int | None:
    """The size of ``value``'s ``dim`` with the symbolic dims bound to ``env`` (name -> int), or None
    where it stays symbolic or the value's shape is not known (a kernel's result after outlining)."""
    if getattr(value.struct_info, "shape", None) is None:
        return None
    expr = _dims(value)[dim]
    if isinstance(expr, int):
        return expr
    bound = {v: tvm.tirx.IntImm(v.dtype, env[v.name]) for v in tvm.tirx.analysis.undefined_vars(expr) if v.name in env}
    expr = tvm.arith.Analyzer().simplify(tvm.tirx.stmt_functor.substitute(expr, bound))
    return int(expr.value) if isinstance(expr, tvm.tirx.IntImm) else None


class ShardingError(TesseraError):
    """A sharding the kernel's ops cannot follow, or one that needs a collective Tessera does not place."""


class _Unmendable(ShardingError):
    """A rule's refusal that no collective on the inputs can mend."""


class RankDependent(_Unmendable):
    """A sharding whose graph differs between the ranks (causal attention with the query sequence
    split), traced without the rank's mesh coordinates."""


def _rank(value) -> int:
    return len(value.struct_info.shape.values)


def _dim_text(d) -> str:
    """A dim as the user wrote it: its value, or the names of the symbolic dims it is made of."""
    if isinstance(d, tvm.tirx.IntImm):
        return str(int(d.value))
    return ", ".join(sorted({str(v.name) for v in tvm.tirx.analysis.undefined_vars(d)})) or str(d)


def _is_one(d) -> bool:
    return isinstance(d, tvm.tirx.IntImm) and int(d.value) == 1


def _tensor(value) -> bool:
    return isinstance(getattr(value, "struct_info", None), relax.TensorStructInfo) and _rank(value) > 0


class Propagator:
    """Follows one kernel's sharding through its flat graph (the rules above), mending the inputs of
    each op that breaks its rule with collectives (:meth:`mend`); ``run()`` gives each value's state."""

    def __init__(self, flat: FlatFunction, sharding: dict, kernel: str):
        self.flat = flat
        self.kernel = kernel
        self.mesh: dict[str, int] = dict(sharding["mesh"])
        self.coords: dict[str, int] | None = sharding.get("coords")  # one rank's compile only
        self.zigzag: set[str] = set(sharding.get("zigzag", ()))  # axes whose pieces are load-balanced
        # axes over which a sequence-split attention is re-split on its heads (DeepSpeed-Ulysses)
        self.all_to_all: set[str] = set(sharding.get("attention_all_to_all", ()))
        self.state: dict[Any, dict[str, tuple]] = {}
        params = {str(p.name_hint): p for p in flat.params}
        for name, splits in sharding["params"].items():
            for axis, dim in splits.items():
                self.state.setdefault(params[name], {})[axis] = ("split", int(dim))

    def of(self, value) -> dict[str, tuple]:
        return self.state.get(value, {}) if isinstance(value, relax.Var) else {}

    def fail(self, node, axis: str, why: str, fix: str, cls: type = ShardingError) -> ShardingError:
        return cls(f"kernel {self.kernel}: {node.name} = {node.op}(...) over mesh axis {axis!r}: {why}; {fix}")

    def needs_sum(self, node, axis: str) -> ShardingError:
        """A partial sum reaching an op that needs the whole sum: :meth:`mend` sums it first."""
        return self.fail(node, axis, "a partial sum reaches it", "its all-reduce comes first")

    def run(self) -> dict[Any, dict[str, tuple]]:
        """The state of every value. Where an op's inputs break its rule, the collectives that make
        them fit are placed first (``self.nodes`` is the node list with them)."""
        self.nodes: list = []
        self.producers: dict[Any, Any] = {}
        self.placed: dict[tuple, Any] = {}  # (value, kind, axis, dim) -> the collective's var
        self.joined: dict[Any, tuple] = {}  # a zigzag attention's var -> (its halves' results, axis)
        self.heads: dict[Any, tuple] = {}  # an all-to-all attention's var -> (its head-split result, axis)
        for node in self.flat.nodes:
            out, causal, back = {}, None, None
            if node.op == "nn.attention" and self.all_to_all:
                node, back = self._heads_for_sequence(node)
            for axis in self.mesh:
                ins = [self.of(a).get(axis) for a in node.args]
                if all(s is None for s in ins):
                    continue
                try:
                    result = self.rule(node, axis, ins)
                except _Unmendable:
                    raise
                except ShardingError as exc:
                    node, result = self.mend(node, axis, exc)
                if result == ("split", 1) and node.op == "nn.attention" and node.attrs.get("causal_mask"):
                    causal = axis
                if result is not None:
                    out[axis] = result
            if causal is not None and causal in self.zigzag:  # two attentions, joined at its permute back
                self.state[node.var] = out
                self.joined[node.var] = (self._causal_zigzag(node, causal), causal)
                continue
            if causal is not None:
                node = self._causal_prefix(node, causal)
            if back is not None:  # a head-split attention; its permute back re-splits on the sequence
                var, axis = back
                self._append(node, out)
                self.state[var] = {**out, axis: ("split", 1)}  # what the attention's own result is
                self.heads[var] = (node.var, axis)
                continue
            if node.op == "permute_dims" and node.args[0] in self.joined:
                node = self._join_halves(node)  # its permute back: the halves' results joined
            if node.op == "permute_dims" and node.args[0] in self.heads:
                node = self._sequence_again(node)
            self._append(node, out)
        self._drop_unused()
        return self.state

    def _drop_unused(self) -> None:
        """Drop the nodes a gather left unread (a permute now applied to the gathered input)."""
        while True:
            used = {a for n in self.nodes for a in n.args if isinstance(a, relax.Var)}
            used.update(o for o in self.flat.outputs if isinstance(o, relax.Var))
            kept = [n for n in self.nodes if n.var in used]
            if len(kept) == len(self.nodes):
                return
            self.nodes = kept

    def mend(self, node, axis: str, error: ShardingError) -> tuple[Any, tuple | None]:
        """``node`` reading collectives of its inputs over ``axis`` that let its rule hold, and the
        rule's result. Partial sums are summed first: reduce-scattered on the dim another operand is
        split on, else all-reduced. Then, if the rule still fails, a whole input is cut to this
        rank's piece where that suffices, else the fewest split inputs (in argument order) are
        all-gathered. ``error`` is raised when nothing helps."""
        ins = [self.of(a).get(axis) for a in node.args]
        if any(s == ("partial",) for s in ins):
            node = self._sum_partials(node, axis, ins)
            ins = [self.of(a).get(axis) for a in node.args]
            if all(s is None for s in ins):
                return node, None
            try:
                return node, self.rule(node, axis, ins)
            except _Unmendable:
                raise
            except ShardingError as exc:
                error = exc
        sliced = self._slice_whole_inputs(node, axis, ins)
        if sliced is not None:
            return sliced
        split = [k for k, s in enumerate(ins) if s is not None and s[0] == "split" and _tensor(node.args[k])]
        for size in range(1, len(split) + 1):
            for gathered in itertools.combinations(split, size):
                trial = [None if k in gathered else s for k, s in enumerate(ins)]
                try:
                    result = None if all(s is None for s in trial) else self.rule(node, axis, trial)
                except _Unmendable:
                    raise
                except ShardingError:
                    continue
                args = list(node.args)
                for k in gathered:
                    args[k] = self._gather(args[k], axis, ins[k][1])
                return _with_args(node, args), result
        raise error

    def _slice_whole_inputs(self, node, axis: str, ins: list) -> tuple[Any, tuple | None] | None:
        """``node`` reading one whole input cut to this rank's piece, where that lets its rule hold: no
        communication (a replicated residual added to a split sum, a whole ``x`` times a ``W`` split
        on K). The first input and dim that works, in order; None if none does."""
        if node.op not in _BINARY and _ANCHOR_RULE.get(node.op) not in ("matmul", "attention"):
            return None
        for k, (a, s) in enumerate(zip(node.args, ins, strict=True)):
            if s is not None or not _tensor(a) or (node.op == "nn.attention" and k != 3):  # attention: its bias
                continue
            for d, size in enumerate(_dims(a)):
                if _is_one(size):
                    continue
                trial = list(ins)
                trial[k] = ("split", d)
                try:
                    result = self.rule(node, axis, trial)
                except ShardingError:
                    continue
                args = list(node.args)
                args[k] = self._collective("slice", a, axis, d)
                return _with_args(node, args), result
        return None

    def _sum_partials(self, node, axis: str, ins: list):
        """``node`` reading each partial input over ``axis`` summed: reduce-scattered on the dim an
        element-wise op's other operand is split on (then the sum arrives split as that operand is),
        else all-reduced."""
        args = list(node.args)
        out_rank = _rank(node.var) if _tensor(node.var) else 0
        split_dims = {
            out_rank - _rank(a) + s[1]
            for a, s in zip(node.args, ins, strict=True)
            if s is not None and s[0] == "split" and _tensor(a)
        }
        for k, (a, s) in enumerate(zip(node.args, ins, strict=True)):
            if s != ("partial",):
                continue
            scatter = None
            if node.op in _BINARY and len(split_dims) == 1:
                (d,) = split_dims
                local = d - (out_rank - _rank(a))
                if local >= 0 and not _is_one(_dims(a)[local]):
                    scatter = local
            if scatter is None:
                args[k] = self._collective("all_reduce", a, axis, None)
            else:
                args[k] = self._collective("reduce_scatter", a, axis, scatter)
        return _with_args(node, args)

    def _gather(self, value, axis: str, dim: int):
        """``value`` all-gathered on ``dim`` over ``axis``; a permute's result as the permute of its
        gathered input (:meth:`_through_permute`)."""
        source = self._permute_input(value)
        if source is not None and self.of(source).get(axis) == ("split", self._source_dim(value, dim)):

            def gather(source, source_dim):
                return self._gather(source, axis, source_dim)

            return self._through_permute(value, "gather", axis, dim, gather, str(value.name_hint))
        return self._collective("all_gather", value, axis, dim)

    def _permute_input(self, value):
        """The input of the permute that made ``value``, or None."""
        producer = self.producers.get(value)
        if producer is not None and producer.op == "permute_dims" and isinstance(producer.args[0], relax.Var):
            return producer.args[0]
        return None

    def _source_dim(self, value, dim: int) -> int:
        """The dim of the permute's input that became ``value``'s ``dim``."""
        return list(self.producers[value].attrs["axes"])[dim]

    def _through_permute(self, value, kind: str, axis: str, dim: int, place, name: str):
        """``value``, a permute's result, as that permute of ``place(input, input's dim)`` (a collective
        on the input), bound to ``name`` and placed once: the layout permutes stay next to the op that
        reads them (an attention kernel takes its Q, K, V permutes in)."""
        key = (value, f"permuted_{kind}", axis, dim)
        if key not in self.placed:
            producer = self.producers[value]
            placed = place(producer.args[0], self._source_dim(value, dim))
            dims = _dims(placed)
            sinfo = relax.TensorStructInfo([dims[a] for a in producer.attrs["axes"]], value.struct_info.dtype)
            node = _with_args(producer, [placed], relax.Var(name, sinfo))
            self._append(node, {x: st for x, st in self.of(value).items() if x != axis})
            self.placed[key] = node.var
        return self.placed[key]

    def _heads_for_sequence(self, node):
        """Attention ``node`` with q, k and v split on the sequence over an all-to-all axis
        (``ts.shard(..., attention="all_to_all")``, DeepSpeed-Ulysses), as a head-split attention:
        q, k and v all-to-all'd from the sequence to the heads (each rank then holds every position
        of ``H / n`` heads), and a bias cut to match. Returns the new node, bound to a var of its own,
        and ``(node.var, axis)``: the caller binds ``node.var`` to its result all-to-all'd back onto
        the sequence. Causal or not, the ranks' graphs are one and their work equal. ``(node, None)``
        where no axis applies."""
        from .nodes import Node

        axes = [
            a
            for a in self.mesh
            if a in self.all_to_all and all(self.of(x).get(a) == ("split", 1) for x in node.args[:3])
        ]
        if not axes:
            return node, None
        (axis,) = axes  # one sequence, split over one axis
        back = [n for n in self.flat.nodes if any(a.same_as(node.var) for a in n.args)]
        if len(back) != 1 or back[0].op != "permute_dims":
            raise self.fail(
                node,
                axis,
                "its result is read other than through one permute back",
                "shard with attention='all_gather'",
                _Unmendable,
            )
        pieces = split_pieces(self.mesh[axis], axis in self.zigzag)
        args = list(node.args)
        for k, (name, x) in enumerate(zip(("q", "k", "v"), args[:3], strict=False)):
            heads = _dims(x)[2]  # symbolic until the shapes are bound: checked then
            if not isinstance(heads, tvm.tirx.IntImm | int) or int(heads) % pieces == 0:
                continue
            if name != "q" and pieces % int(heads) == 0:  # fewer key/value heads than pieces: each repeated
                args[k] = self._repeat(x, axis, 2, pieces // int(heads))
                continue
            raise self.fail(
                node,
                axis,
                f"attention='all_to_all' splits the heads over the {pieces} pieces of {axis!r}, and {name} "
                f"has {_dim_text(heads)} heads",
                "give it a multiple of that many heads"
                + (" (or key/value heads that divide it)" if name != "q" else "")
                + ", or shard with attention='all_gather'",
                _Unmendable,
            )
        args[:3] = [self._all_to_all(x, axis, 2, 1) for x in args[:3]]
        if len(args) > 3:  # [B, H, S_q, S_kv]: its queries (or keys) whole, as the heads' attention reads them
            bias, split = args[3], self.of(args[3]).get(axis)
            bias_heads = _dims(bias)[1]
            whole_heads = _is_one(bias_heads) or (isinstance(bias_heads, tvm.tirx.IntImm) and int(bias_heads) % pieces)
            if split == ("split", 2) and not whole_heads:
                args[3] = self._all_to_all(bias, axis, 1, 2)
            elif split in (("split", 2), ("split", 3)):
                args[3] = self._gather(bias, axis, split[1])  # whole (then cut on the heads, if it has them)
        q, v = args[0], args[2]
        sinfo = relax.TensorStructInfo([*_dims(q)[:3], _dims(v)[3]], node.var.struct_info.dtype)
        heads = Node(relax.Var(f"{node.var.name_hint}_heads", sinfo), node.op, args, node.call, node.attrs)
        return heads, (node.var, axis)

    def _sequence_again(self, permute):
        """An all-to-all attention's permute back (to ``[B, H, S, D]``), as the permute of its head-split
        result all-to-all'd from the heads back onto the sequence, bound to the permute's var."""
        from .nodes import node_of

        heads, axis = self.heads[permute.args[0]]
        axes = list(permute.attrs["axes"])
        sinfo = relax.TensorStructInfo([_dims(heads)[a] for a in axes], heads.struct_info.dtype)
        permuted = node_of(relax.Var(f"{heads.name_hint}_back", sinfo), relax.op.permute_dims(heads, axes))
        self._append(permuted, {**self.of(heads), axis: ("split", axes.index(2))})
        again = collective_node(
            "all_to_all", permuted.var, axis, axes.index(1), self.mesh[axis], axes.index(2), zigzag=axis in self.zigzag
        )
        return _with_args(again, again.args, permute.var)

    def _repeat(self, value, axis: str, dim: int, times: int):
        """``value`` with each entry of ``dim`` ``times`` times in a row (no communication): grouped-query
        attention's key/value heads, fewer than the all-to-all's pieces, repeated up to them. Query
        head ``h`` reads repeated head ``h // (H / (H_kv * times))``, the head ``h // (H / H_kv)`` it
        read before, so each rank's query heads keep their key/value head."""
        var = self._cut(value, "repeat", axis, dim, times)
        self.state[var] = dict(self.of(value))  # still split as it was (a cut through a permute drops the axis)
        return var

    def _all_to_all(self, value, axis: str, dim: int, from_dim: int):
        """``value``, split on ``from_dim`` over ``axis``, re-split on ``dim`` (one all-to-all); a
        permute's result as the permute of its input's all-to-all."""
        if self._permute_input(value) is not None:
            source_from = self._source_dim(value, from_dim)

            def place(source, source_dim):
                return self._collective("all_to_all", source, axis, source_dim, source_from)

            name = f"{value.name_hint}_all_to_all"
            var = self._through_permute(value, f"all_to_all{from_dim}", axis, dim, place, name)
            self.state[var] = {**self.state[var], axis: ("split", dim)}
            return var
        return self._collective("all_to_all", value, axis, dim, from_dim)

    def _causal_prefix(self, node, axis: str):
        """Causal ``node`` with its query sequence split over ``axis``, as this rank computes it: k
        and v cut to their first ``c + 1`` of ``n`` pieces (rank coordinate ``c``), masked
        bottom-right aligned, so this rank's query ``i`` (``c*S/n + i`` of the whole sequence) sees
        keys ``j <= i + c*S/n``, as in the whole attention."""
        from .nodes import node_of

        pieces = self.coords[axis] + 1
        q, k, v, *rest = node.args
        if pieces < self.mesh[axis]:  # the last rank reads all of them
            k, v = (self._prefix(x, axis, 1, pieces) for x in (k, v))
            rest = [self._prefix(b, axis, 3, pieces) for b in rest]  # a bias's keys (never broadcast: see ops)
        call = relax.op.nn.attention(q, k, v, *rest, scale=node.attrs.get("scale"), causal_mask="BottomRight")
        return node_of(node.var, call)

    def _causal_zigzag(self, node, axis: str) -> list:
        """Causal ``node`` with its query sequence split load-balanced over ``axis`` (zigzag): the
        sequence is cut into ``2n`` pieces and rank ``c`` holds pieces ``c`` and ``2n - 1 - c``, so
        every rank computes the same share of the causal triangle. Each half of its queries is one
        attention over the keys up to its last query (the first ``c + 1``, then ``2n - c``, of the
        ``2n`` pieces of the gathered keys, bottom-right aligned), and its permute back to
        ``[B, H, S, D]`` (the attention kernel's). Their results, joined where ``node``'s own
        permute back was (:meth:`_join_halves`)."""
        from .nodes import node_of

        back = [n for n in self.flat.nodes if any(a.same_as(node.var) for a in n.args)]
        if len(back) != 1 or back[0].op != "permute_dims":
            raise self.fail(
                node, axis, "its result is read other than through one permute back", "keep the sequence whole"
            )
        n, c = self.mesh[axis], self.coords[axis]
        q, k, v, *rest = node.args
        state = {x: st for x, st in self.of(q).items() if x != axis}
        halves = []
        for which, pieces in enumerate((c + 1, 2 * n - c)):
            qh = self._cut(q, "half", axis, 1, which)
            kh, vh = (x if pieces == 2 * n else self._cut(x, "prefix", axis, 1, pieces) for x in (k, v))
            bias = []
            for b in rest:  # [B, H, S_q, S_kv]: its queries halved, its keys cut like the keys
                b = b if _is_one(_dims(b)[2]) else self._cut(b, "half", axis, 2, which)
                bias.append(b if pieces == 2 * n else self._cut(b, "prefix", axis, 3, pieces))
            call = relax.op.nn.attention(qh, kh, vh, *bias, scale=node.attrs.get("scale"), causal_mask="BottomRight")
            b_, s_, h_, _ = _dims(qh)
            sinfo = relax.TensorStructInfo([b_, s_, h_, _dims(vh)[3]], node.var.struct_info.dtype)
            name = f"{node.var.name_hint}_{('first', 'second')[which]}"
            part = node_of(relax.Var(name, sinfo), call)
            self._append(part, {**state, axis: ("split", 1)})
            axes = list(back[0].attrs["axes"])
            permuted = relax.TensorStructInfo([_dims(part.var)[a] for a in axes], sinfo.dtype)
            node_back = node_of(relax.Var(f"{name}_back", permuted), relax.op.permute_dims(part.var, axes))
            self._append(node_back, {**state, axis: ("split", axes.index(1))})
            halves.append(node_back.var)
        return halves

    def _join_halves(self, permute):
        """A zigzag attention's permute back, as its halves' results joined on the sequence."""
        from .nodes import node_of

        halves, axis = self.joined[permute.args[0]]
        dim = list(permute.attrs["axes"]).index(1)
        call = collective_call("concat", halves[0], axis, dim, self.mesh[axis], others=halves[1:])
        # declared with the permute's own shape (S, not S // 2 * 2, which no kernel signature can bind)
        call = relax.Call(call.op, call.args, call.attrs, [permute.var.struct_info])
        return node_of(permute.var, call)

    def _prefix(self, value, axis: str, dim: int, pieces: int):
        """The first ``pieces`` of the ``n`` pieces of ``value``'s ``dim`` over ``axis`` (no
        communication); a permute's result as the permute of its input's prefix."""
        return self._cut(value, "prefix", axis, dim, pieces)

    def _cut(self, value, kind: str, axis: str, dim: int, pieces: int):
        """``kind`` (a prefix, a half of this rank's zigzag piece, or a repeat) of ``value``'s ``dim``
        over ``axis``, no communication; a permute's result as the permute of its input's cut."""
        if self._permute_input(value) is not None:

            def cut(source, source_dim):
                return self._collective(kind, source, axis, source_dim, pieces)

            name = f"{value.name_hint}_{kind}{pieces if kind == 'half' else ''}"
            return self._through_permute(value, f"{kind}{pieces}", axis, dim, cut, name)
        return self._collective(kind, value, axis, dim, pieces)

    def _append(self, node, state: dict) -> None:
        self.nodes.append(node)
        self.producers[node.var] = node
        self.state[node.var] = state

    def _collective(self, kind: str, value, axis: str, dim: int | None, pieces: int | None = None):
        """The var of ``kind`` of ``value`` over ``axis`` (placed once per value, kind, axis, dim)."""
        key = (value, kind, axis, dim, pieces)
        if key not in self.placed:
            node = collective_node(kind, value, axis, dim, self.mesh[axis], pieces, zigzag=axis in self.zigzag)
            after = {x: st for x, st in self.of(value).items() if x != axis or kind == "repeat"}
            if kind in CUTTING_KINDS or kind == "all_to_all":
                after[axis] = ("split", dim)
            self._append(node, after)
            self.placed[key] = node.var
        return self.placed[key]

    # ---- rules: the output's state on one axis from the inputs' (None: replicated) ----
    def rule(self, node, axis: str, ins: list) -> tuple | None:
        op = node.op
        partial = [s is not None and s[0] == "partial" for s in ins]
        if op in _UNARY:
            (s,) = ins[:1]
            if s[0] == "partial" and op not in _LINEAR_UNARY:
                raise self.needs_sum(node, axis)
            return s
        if op in _BINARY:
            return self.elementwise(node, axis, ins, partial)
        if op == "permute_dims":
            s = ins[0]
            if s[0] == "split":
                axes = list(node.attrs["axes"])
                return ("split", axes.index(s[1]))
            return s
        rule = _ANCHOR_RULE.get(op)
        if rule == "matmul":
            return self.matmul(node, axis, ins)
        if rule == "attention":
            return self.attention(node, axis, ins)
        if rule == "row":
            return self.row_op(node, axis, ins)
        raise self.fail(node, axis, f"{op} has no sharding rule", "keep its inputs replicated")

    def elementwise(self, node, axis, ins, partial) -> tuple | None:
        if any(partial):
            others = [s for s, p in zip(ins, partial, strict=True) if not p]
            tensors = [a for a in node.args if _tensor(a)]
            if node.op in ("add", "subtract") and all(partial[k] for k, a in enumerate(node.args) if _tensor(a)):
                if len(tensors) == len(node.args):
                    return ("partial",)  # a sum of partial sums
            if node.op == "multiply" and sum(partial) == 1 and all(o is None for o in others):
                return ("partial",)  # (sum of x_i) * y = sum of (x_i * y)
            if node.op == "divide" and partial[0] and not partial[1] and all(o is None for o in others):
                return ("partial",)
            raise self.needs_sum(node, axis)
        out_rank = _rank(node.var)
        dims = {out_rank - _rank(a) + st[1] for a, st in zip(node.args, ins, strict=True) if st is not None}
        if len(dims) > 1:
            raise self.fail(
                node, axis, f"its operands are split on different dims {sorted(dims)}", "split them on the same dim"
            )
        (d,) = dims
        for a, st in zip(node.args, ins, strict=True):
            if st is None and _tensor(a) and not self._broadcast(a, d, out_rank):
                name = getattr(a, "name_hint", "a constant")
                raise self.fail(
                    node,
                    axis,
                    f"{name} is replicated but the other operand is split on dim {d}",
                    f"split {name} on that dim too",
                )
        return ("split", d)

    @staticmethod
    def _broadcast(value, d: int, out_rank: int) -> bool:
        """Whether ``value`` is broadcast along output dim ``d`` (absent or of size 1 there)."""
        k = d - (out_rank - _rank(value))
        return k < 0 or _is_one(_dims(value)[k])

    def matmul(self, node, axis, ins) -> tuple | None:
        a, b = node.args
        sa, sb = ins
        ra, rb, ro = _rank(a), _rank(b), _rank(node.var)
        if (sa is not None and sa[0] == "partial") or (sb is not None and sb[0] == "partial"):
            if sa is not None and sb is not None:
                raise self.fail(node, axis, "both operands carry a split or partial sum", "keep one replicated")
            return ("partial",)
        ka, kb = ra - 1, rb - 2  # contraction dims
        if sa is not None and sb is not None:
            if sa[1] == ka and sb[1] == kb:
                return ("partial",)
            if ra > 2 and rb > 2 and sa[1] < ra - 2 and ro - ra + sa[1] == ro - rb + sb[1]:
                return ("split", ro - ra + sa[1])  # the same batch dim
            raise self.fail(
                node,
                axis,
                f"a is split on dim {sa[1]} and b on dim {sb[1]}",
                "split a on its last dim and b on its second to last (K), or only one of them",
            )
        if sa is not None:
            if sa[1] == ka:
                raise self.fail(
                    node,
                    axis,
                    "a is split on its contraction dim but b is replicated",
                    "split b on its contraction dim (second to last) too",
                )
            return ("split", ro - ra + sa[1])  # rows or batch
        if sb[1] == kb:
            raise self.fail(
                node, axis, "b is split on its contraction dim but a is replicated", "split a on its last dim too"
            )
        if sb[1] == rb - 1:
            return ("split", ro - 1)  # columns
        return ("split", ro - rb + sb[1])  # batch

    def attention(self, node, axis, ins) -> tuple | None:
        q, k, v = ins[:3]
        if q == ("split", 1) and k is None and v is None:  # the query sequence (nn.attention is B, S, H, D)
            if node.attrs.get("causal_mask") is not None:
                self._check_causal_split(node, axis)
            result = q  # each rank's queries against all keys (causal: a prefix of them, _causal_prefix)
        elif any(s is None for s in ins[:3]) or len(set(ins[:3])) != 1 or q[0] != "split" or q[1] not in (0, 2):
            raise self.fail(
                node,
                axis,
                "q, k and v must be split alike on batch or heads",
                "split Q, K and V on the batch or the head dim (H and H_kv), nothing else",
            )
        else:
            result = q
        if len(ins) > 3:
            self._check_bias(node, axis, ins[3], result)
        return result

    def _check_bias(self, node, axis: str, bias: tuple | None, result: tuple) -> None:
        """An attention bias ``[B, H, S_q, S_kv]`` must be split as the scores are: on the dim the
        queries are split on (batch, heads or query sequence), or whole where it is broadcast there."""
        dim = _BIAS_DIM[result[1]]
        wanted = None if _is_one(_dims(node.args[3])[dim]) else ("split", dim)
        if bias != wanted:
            raise self.fail(
                node,
                axis,
                f"its bias is {'whole' if bias is None else f'split on dim {bias[1]}'}",
                f"split the bias on dim {dim} as the queries are" if wanted else "keep the bias whole",
            )

    def _check_causal_split(self, node, axis: str) -> None:
        """Causal attention with the query sequence split: each rank reads a prefix of the keys
        (:meth:`_causal_prefix`), which needs this rank's coordinates and one sequence for queries
        and keys."""
        if self.coords is None:
            raise self.fail(
                node,
                axis,
                "causal attention with the query sequence split compiles per rank (each rank reads the keys "
                "up to its last query)",
                "compile it under torch.distributed (after init_process_group), or pass rank= to graph() or "
                "inspect_ir()",
                RankDependent,
            )
        n = self.mesh[axis]
        q_len, k_len = _dims(node.args[0])[1], _dims(node.args[1])[1]
        if self.of(node.args[1]).get(axis) == ("split", 1):  # to be gathered (mend) before the rule holds
            k_len = k_len * n
        if not tvm.arith.Analyzer().can_prove_equal(q_len * n, k_len):
            raise self.fail(
                node,
                axis,
                f"the keys' sequence ({_dim_text(k_len)}) is not the queries' whole sequence "
                f"({_dim_text(q_len)} on each of {n} ranks)",
                "give queries and keys one sequence dim (split alike), or keep the sequence whole",
                _Unmendable,
            )

    def row_op(self, node, axis, ins) -> tuple | None:
        s = ins[0]
        if s is None:
            if any(x is not None for x in ins[1:]):
                raise self.fail(node, axis, "a weight is split but the input is not", "keep norm weights replicated")
            return None
        if s[0] == "partial":
            raise self.needs_sum(node, axis)
        rank = _rank(node.args[0])
        reduced = node.attrs.get("axis", node.attrs.get("axes"))
        reduced = [reduced] if isinstance(reduced, int) else list(reduced or range(rank))
        reduced = [r % rank for r in reduced]
        if s[1] in reduced or any(x is not None for x in ins[1:]):
            raise self.fail(
                node,
                axis,
                f"it reduces over dim {s[1]}, which is split",
                "split a dim it does not reduce (e.g. the rows)",
            )
        if node.op in _REDUCTIONS and not node.attrs.get("keepdims", False):
            return ("split", s[1] - sum(1 for r in reduced if r < s[1]))
        return s


def _with_args(node, args: list, var=None):
    from .nodes import Node

    return Node(node.var if var is None else var, node.op, args, node.call, node.attrs)
