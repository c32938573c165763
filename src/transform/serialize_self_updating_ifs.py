"""tessera.SerializeSelfUpdatingIfs: keep vectorised loops whose ``if`` changes its own condition serial.

``tl.IfStmtBinding`` turns ``if c: a = ...; b = ...`` into ``if_condition = c`` followed by ``if
if_condition: a = ...`` and ``if if_condition: b = ...``. That is right as long as the condition is
evaluated once. When ``tl.VectorizeLoop`` (TileLang 0.1.15) cannot vectorise such a loop, it
scalarises each statement into a loop of its own, and each loop evaluates the condition again. If an
earlier statement writes a buffer that the condition reads, the later statements see the new value.
For ``if w[i] > best[i]: best[i] = w[i]; which[i] = 1``, ``which`` is then never set. This wrong
answer is silent and comes on every target: a T.Parallel loop over fragments becomes such a loop
after layout inference, and so does a ``T.vectorized`` loop written by hand.

This pass runs just before ``tl.VectorizeLoop``. A vectorised loop whose body has that shape (a
bound condition guarding two or more ``if``s, and an ``if`` that is not the last writing a buffer
the condition reads) becomes a serial loop. There the binding is evaluated once per element, as
written. Other loops are left alone, so every other program keeps the same code as TileLang's.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, prim_func_pass, register_pass

from . import analysis

tirx = tvm.tirx


def _buffers(node, kind) -> list:
    """The data vars of the buffers that ``node`` loads (``kind`` BufferLoad) or stores (BufferStore)."""
    found: list = []

    def visit(n):
        if isinstance(n, kind) and not any(n.buffer.data.same_as(v) for v in found):
            found.append(n.buffer.data)

    tirx.stmt_functor.post_order_visit(node if isinstance(node, tirx.Stmt) else tirx.Evaluate(node), visit)
    return found


def self_updating_condition(loop) -> str | None:
    """The buffer through which an ``if`` in ``loop``'s body changes the bound condition of a later
    ``if`` (its name), or None when there is none."""
    bound: list = []  # (condition var, its value)
    guarded: list = []  # (condition var, the if statement), in program order

    def visit(node):
        if isinstance(node, tirx.Bind):
            bound.append((node.var, node.value))
        elif isinstance(node, tirx.IfThenElse) and isinstance(node.condition, tirx.Var):
            guarded.append((node.condition, node))

    tirx.stmt_functor.post_order_visit(loop.body, visit)  # siblings in program order
    for var, value in bound:
        ifs = [stmt for cond, stmt in guarded if cond.same_as(var)]
        if len(ifs) < 2:
            continue
        read = _buffers(value, tirx.BufferLoad)
        for stmt in ifs[:-1]:
            for data in _buffers(stmt, tirx.BufferStore):
                if any(data.same_as(r) for r in read):
                    return str(data.name)
    return None


def serialize_loops(func, should) -> object:
    """``func`` with every loop for which ``should(loop)`` holds made serial (the same object when
    there is none). tessera.GuardDecoupledCasts uses it too."""

    def serial(node):
        if not should(node):
            return None
        return tirx.For(
            node.loop_var,
            node.min,
            node.extent,
            tirx.ForKind.SERIAL,
            node.body,
            node.thread_binding,
            node.annotations,
            node.step,
        )

    return analysis.rewrite_nodes(func, serial, ["tirx.For"])


def serialize_self_updating_ifs(func):
    """``func`` with such vectorised loops made serial (the same object when there are none)."""
    return serialize_loops(
        func, lambda loop: loop.kind == tirx.ForKind.VECTORIZED and self_updating_condition(loop) is not None
    )


@register_pass(
    "tessera.SerializeSelfUpdatingIfs",
    doc="keep vectorised loops serial when an if writes what its bound condition reads (TileLang would re-test it)",
)
def _serialize_self_updating_ifs(_ctx: BuildContext):
    return prim_func_pass(lambda _gv, func: serialize_self_updating_ifs(func), name="tessera.SerializeSelfUpdatingIfs")
