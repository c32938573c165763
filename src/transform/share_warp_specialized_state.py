"""tessera.ShareWarpSpecializedState: per-thread state that both warp groups of a warp-specialised
kernel read is updated in both.

``tl.ProducerConsumerWarpSpecialized`` (TileLang 0.1.15) splits a pipelined region into ``if tx <
P: <producer> else: <consumer>`` and puts every statement that is not a copy into the consumer's
branch, scalar bookkeeping too. A stream-K GEMM keeps its position in a ``T.alloc_var``
(``it = it + (k_end - k_begin)`` after each tile segment), and the loop around the split reads it
(``if it < stop``). After the split only the consumer threads advance ``it``: the producer threads
load the same segment again, wait for a stage the consumer never releases, and the kernel hangs
on the GPU. TileLang's own ``tilelang.lower`` builds that kernel (found on an H200, 2026-11-28).

This pass runs right after the split. A per-thread buffer (scope ``local`` or ``local.var``) that
one branch writes and code outside that branch reads is written in the other branch too: the
writes are top-level statements of their branch, so they are appended, in order, to the end of
the other branch, which must neither read nor write the buffer itself (then where the copy goes
does not matter) and must have every value they read (no buffer the first branch writes, no
variable it binds). Where that does not hold, the pass fails with a LoweringError that names the
buffer and how to build the kernel without warp specialisation. Kernels without such state are
returned unchanged, so their source stays TileLang's.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.errors import LoweringError
from tessera_tvm.registry import BuildContext, prim_func_pass, register_pass

tirx = tvm.tirx

SCOPE_KEY = "kWarpSpecializationScope"
PER_THREAD = ("local", "local.var")
WORKAROUND = (
    "build it without warp specialisation: PassContext(config={'tl.disable_warp_specialized': True}), "
    "or features: {warp_specialization: false} in the target config"
)


def _visit(node, fn) -> None:
    tirx.stmt_functor.post_order_visit(node if isinstance(node, tirx.Stmt) else tirx.Evaluate(node), fn)


class _Uses:
    """The per-thread buffers a statement writes, and the variables it binds."""

    def __init__(self, node):
        self.stores: dict = {}  # data var -> buffer
        self.bound: list = []

        def visit(n):
            if isinstance(n, tirx.BufferStore) and n.buffer.scope() in PER_THREAD:
                self.stores.setdefault(n.buffer.data, n.buffer)
            elif isinstance(n, tirx.For):
                self.bound.append(n.loop_var)
            elif isinstance(n, tirx.Bind):
                self.bound.append(n.var)

        _visit(node, visit)

    def writes(self, data) -> bool:
        return any(data.same_as(d) for d in self.stores)

    def binds(self, var) -> bool:
        return any(var.same_as(v) for v in self.bound)


def _accesses(node, data, kind) -> list:
    """The ``kind`` nodes (BufferLoad or BufferStore) in ``node`` of the buffer whose data is ``data``."""
    found: list = []
    _visit(node, lambda n: found.append(n) if isinstance(n, kind) and n.buffer.data.same_as(data) else None)
    return found


def _top_level(branch) -> list:
    return list(branch.seq) if isinstance(branch, tirx.SeqStmt) else [branch]


def _copyable(store, owner: _Uses) -> bool:
    """Whether ``store`` computes the same value in the other branch: it reads no per-thread buffer
    that its branch writes (but its own) and no variable its branch binds."""
    loads: list = []
    free: list = []

    def visit(n):
        if isinstance(n, tirx.BufferLoad):
            loads.append(n.buffer.data)
        elif isinstance(n, tirx.Var):
            free.append(n)

    for expr in [store.value, *store.indices]:
        _visit(expr, visit)
    if any(owner.binds(v) for v in free):
        return False
    return all(data.same_as(store.buffer.data) or not owner.writes(data) for data in loads)


def _share(kernel: str, split, total_loads) -> tirx.Stmt | None:
    """The ``split`` (an AttrStmt over the producer/consumer if) with shared state copied into both
    branches, or None when nothing needs it."""
    branch_if = split.body
    branches = [branch_if.then_case, branch_if.else_case]
    uses = [_Uses(b) for b in branches]
    buffers: dict = {}
    for use in uses:
        for data, buffer in use.stores.items():
            if not any(data.same_as(d) for d in buffers):
                buffers[data] = buffer
    added: list[list] = [[], []]
    for data, buffer in buffers.items():
        stores = [_accesses(b, data, tirx.BufferStore) for b in branches]
        loads = [len(_accesses(b, data, tirx.BufferLoad)) for b in branches]
        outside = total_loads(data) - sum(loads)
        where = f"kernel {kernel!r}: tl.ProducerConsumerWarpSpecialized splits the updates of the per-thread variable {buffer.name!r}"
        if stores[0] and stores[1]:
            if len(stores[0]) == len(stores[1]) and all(
                tvm.ir.structural_equal(x, y) for x, y in zip(stores[0], stores[1], strict=True)
            ):
                continue  # both warp groups update it alike
            fewer = [len(stores[side]) < len(stores[1 - side]) or len(stores[0]) == len(stores[1]) for side in (0, 1)]
            if outside or any(loads[side] and fewer[side] for side in (0, 1)):
                raise LoweringError(
                    f"{where} unevenly between the warp groups of `if {branch_if.condition}` (each has some), "
                    f"and a warp group that misses some reads it: the kernel would compute with a stale value "
                    f"on the GPU; {WORKAROUND}"
                )
            continue
        side = 0 if stores[0] else 1
        if not outside and not loads[1 - side]:
            continue  # only the warp group that updates it reads it (e.g. its pipeline phase counter)
        group = f"the {'then' if side == 0 else 'else'} branch of `if {branch_if.condition}`"
        where = f"{where}: only one warp group ({group}) updates it, but the other reads it"
        if loads[1 - side]:
            raise LoweringError(
                f"{where} inside its own branch, where it would see a stale value on the GPU; {WORKAROUND}"
            )
        top = [s for s in _top_level(branches[side]) if isinstance(s, tirx.BufferStore) and s.buffer.data.same_as(data)]
        if len(top) != len(stores[side]) or not all(_copyable(s, uses[side]) for s in top):
            raise LoweringError(
                f"{where} after the split, and the updates cannot be repeated in the other warp group "
                f"(inside a loop, or reading that warp group's own values): the kernel would hang or "
                f"compute the wrong tiles on the GPU; {WORKAROUND}"
            )
        added[1 - side].extend(top)
    if not added[0] and not added[1]:
        return None
    new = [tirx.SeqStmt(_top_level(b) + extra) if extra else b for b, extra in zip(branches, added, strict=True)]
    body = tirx.IfThenElse(branch_if.condition, new[0], new[1])
    return tirx.AttrStmt(split.node, split.attr_key, split.value, body)


def share_state(kernel: str, func):
    """``func`` with its warp-specialised splits' shared per-thread state written in both branches
    (the same object when there is none)."""
    splits: list = []
    _visit(
        func.body,
        lambda n: (
            splits.append(n)
            if isinstance(n, tirx.AttrStmt)
            and n.attr_key == SCOPE_KEY
            and isinstance(n.body, tirx.IfThenElse)
            and n.body.else_case is not None
            else None
        ),
    )
    if not splits:
        return func
    replaced: list = []
    for split in splits:
        new = _share(kernel, split, lambda data: len(_accesses(func.body, data, tirx.BufferLoad)))
        if new is not None:
            replaced.append((split, new))
    if not replaced:
        return func

    def swap(node):
        for old, new in replaced:
            if node.same_as(old):
                return new
        return None

    return func.with_body(tirx.stmt_functor.ir_transform(func.body, None, swap, ["tirx.AttrStmt"]))


@register_pass(
    "tessera.ShareWarpSpecializedState",
    doc="per-thread state both warp groups read is updated in both (a stream-K GEMM hung on Hopper)",
)
def share_warp_specialized_state(ctx: BuildContext):
    del ctx
    return prim_func_pass(lambda gv, func: share_state(gv.name_hint, func), name="tessera.ShareWarpSpecializedState")
