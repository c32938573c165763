"""tessera.GuardDecoupledCasts: keep the vectorised loops that tl.DecoupleTypeCast would unguard serial.

``tl.DecoupleTypeCast`` (TileLang 0.1.15) splits a vectorised loop that casts between a register
value and memory into copy-in, compute and copy-out loops through a staging buffer. It carries one
guard over to the copy loops: a single ``if`` without ``else`` at the top of the body. Any other
guard is lost. For ``if a: if m: O[i] = cast(...)``, the copy-out loop is guarded by ``a`` only,
so lanes where ``m`` is false get uninitialised staging values. For ``if a: O[i] = ... else: P[i]
= ...``, both outputs are written on every lane. And with that one ``if``, its compute loop tests
the guard on staged copies that hold values only where the guard held: a store into a register
buffer (which no copy loop guards) lands on lanes the guard excluded. The answer is wrong, silently, on every target
(tile-ai/tilelang#2616). Masked mixed-precision epilogues have this shape.

This pass runs just before ``tl.DecoupleTypeCast``. A vectorised loop that the pass would split,
with a guard other than that one ``if``, becomes a serial loop, which the pass leaves alone.
Nothing else changes, so other programs keep TileLang's code.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, prim_func_pass, register_pass

from . import analysis
from .serialize_self_updating_ifs import serialize_loops

tirx = tvm.tirx


def _flat(stmt):
    """``stmt`` without the leading ``Bind``s of a sequence (DecoupleTypeCast inlines them), or
    None when a statement other than a Bind precedes the last (a sequence: it leaves those alone)."""
    if isinstance(stmt, tirx.SeqStmt):
        *head, last = list(stmt.seq)
        if not all(isinstance(s, tirx.Bind) for s in head):
            return None
        return _flat(last)
    if isinstance(stmt, tirx.IfThenElse):
        then = _flat(stmt.then_case)
        other = None if stmt.else_case is None else _flat(stmt.else_case)
        if then is None or (stmt.else_case is not None and other is None):
            return None
        return tirx.IfThenElse(stmt.condition, then, other)
    return stmt


def _has(node, kind) -> bool:
    return analysis.uses(node, lambda n: isinstance(n, kind))


def loses_a_guard(loop) -> bool:
    """Whether ``tl.DecoupleTypeCast`` would split ``loop`` and drop part of its guard."""
    if loop.kind != tirx.ForKind.VECTORIZED or not isinstance(loop.extent, tirx.IntImm):
        return False
    body = _flat(loop.body)
    if body is None or not _has(body, tirx.Cast):
        return False
    if isinstance(body, tirx.IfThenElse) and body.else_case is None:
        # The one guard the pass keeps, on its copy loops. Its compute loop tests the guard on the
        # staged copies, which hold values only where the guard held: a store there that no copy
        # loop guards (a register buffer's) then writes on lanes the guard excluded.
        if _stores_outside_memory(body.then_case) and _reads_memory(body.condition):
            return True
        body = body.then_case
    return _has(body, tirx.IfThenElse)


def _memory(buffer) -> bool:
    return buffer.scope() in ("global", "shared", "shared.dyn")


def _stores_outside_memory(stmt) -> bool:
    return analysis.uses(stmt, lambda n: isinstance(n, tirx.BufferStore) and not _memory(n.buffer))


def _reads_memory(expr) -> bool:
    return analysis.uses(tirx.Evaluate(expr), lambda n: isinstance(n, tirx.BufferLoad) and _memory(n.buffer))


def guard_decoupled_casts(func):
    """``func`` with such loops made serial (the same object when there are none)."""
    return serialize_loops(func, loses_a_guard)


@register_pass(
    "tessera.GuardDecoupledCasts",
    doc="keep vectorised cast loops serial when tl.DecoupleTypeCast would drop their nested or else guard",
)
def _guard_decoupled_casts(_ctx: BuildContext):
    return prim_func_pass(lambda _gv, func: guard_decoupled_casts(func), name="tessera.GuardDecoupledCasts")
