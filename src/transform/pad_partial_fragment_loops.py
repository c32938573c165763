"""tessera.PadPartialFragmentLoops: give every T.Parallel loop over a fragment the fragment's extent.

When T.Parallel loops of different extents index one dimension of a fragment (a 256-element
fragment written by ``T.Parallel(256)``, read by ``T.Parallel(100)``, then read again by
``T.Parallel(256)``), ``tl.LayoutInference`` (TileLang 0.1.15) lays the fragment out for the
shortest loop. Every loop over it is then lowered to that extent, so elements 100 to 255 are never
computed or stored. The answer is wrong, silently, on every target (tile-ai/tilelang#2957).

This pass runs just before ``tl.LayoutInference``. Such a loop is widened to the fragment's
extent and its body guarded, ``for i in T.Parallel(256): if i < 100: ...``, which computes the
same thing. Only fragment dimensions that loops of different extents index are touched, and only
loops that index them with their own variable from 0. Other programs keep TileLang's code.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, prim_func_pass, register_pass

tirx = tvm.tirx
FRAGMENT = "local.fragment"


def _nest(loop) -> tuple[list, object]:
    """The perfect nest of parallel loops from ``loop`` down, and the body inside it."""
    loops, node = [], loop
    while isinstance(node, tirx.For) and node.kind == tirx.ForKind.PARALLEL:
        loops.append(node)
        node = node.body
    return loops, node


def _indexed_dims(loops, body) -> dict[int, set]:
    """For each loop of the nest (by position), the (fragment data var, dim, dim extent) it indexes
    with its own variable: ``frag[..., i, ...]`` with ``i`` the loop's variable."""
    found: dict[int, set] = {k: set() for k in range(len(loops))}

    def visit(node):
        if not isinstance(node, tirx.BufferLoad | tirx.BufferStore) or node.buffer.scope() != FRAGMENT:
            return
        for dim, index in enumerate(node.indices):
            for k, loop in enumerate(loops):
                extent = node.buffer.shape[dim]
                if index.same_as(loop.loop_var) and isinstance(extent, tirx.IntImm):
                    found[k].add((node.buffer.data, dim, int(extent.value)))

    tirx.stmt_functor.post_order_visit(body, visit)
    return found


def _nests(func) -> list:
    """The outermost parallel loop of every nest in ``func``."""
    outer: list = []

    def pre(node):
        if isinstance(node, tirx.For) and node.kind == tirx.ForKind.PARALLEL:
            outer.append(node)
            return node  # do not look inside: its inner loops belong to this nest
        return None

    tirx.stmt_functor.ir_transform(func.body, pre, None, ["tirx.For"])
    return outer


def _key(data, dim) -> tuple[int, int]:
    return (hash(data), dim)


def pad_partial_fragment_loops(func):
    """``func`` with such loops widened and guarded (the same object when there are none)."""
    extents: dict[tuple[int, int], set[int]] = {}  # (fragment, dim) -> loop extents indexing it
    for outer in _nests(func):
        loops, body = _nest(outer)
        for k, uses in _indexed_dims(loops, body).items():
            for data, dim, _ in uses:
                if isinstance(loops[k].extent, tirx.IntImm):
                    extents.setdefault(_key(data, dim), set()).add(int(loops[k].extent.value))
    mixed = {key for key, seen in extents.items() if len(seen) > 1}
    if not mixed:
        return func
    changed: list = []

    def pre(node):
        if not (isinstance(node, tirx.For) and node.kind == tirx.ForKind.PARALLEL):
            return None
        loops, body = _nest(node)
        widths, guards = [], []
        for k, uses in _indexed_dims(loops, body).items():
            loop = loops[k]
            full = {extent for data, dim, extent in uses if _key(data, dim) in mixed}
            small = isinstance(loop.extent, tirx.IntImm) and isinstance(loop.min, tirx.IntImm) and loop.min.value == 0
            if len(full) == 1 and small and next(iter(full)) > loop.extent.value:
                widths.append(next(iter(full)))
                guards.append(tirx.LT(loop.loop_var, loop.extent))
            else:
                widths.append(None)
        if not guards:
            return node  # a nest to leave as it is (its inner loops too)
        changed.append(node)
        condition = guards[0]
        for guard in guards[1:]:
            condition = tirx.And(condition, guard)
        out = tirx.IfThenElse(condition, body, None)
        for loop, width in zip(reversed(loops), reversed(widths), strict=True):
            extent = loop.extent if width is None else tirx.IntImm(loop.extent.dtype, width)
            out = tirx.For(
                loop.loop_var, loop.min, extent, loop.kind, out, loop.thread_binding, loop.annotations, loop.step
            )
        return out

    new_body = tirx.stmt_functor.ir_transform(func.body, pre, None, ["tirx.For"])
    return func.with_body(new_body) if changed else func


@register_pass(
    "tessera.PadPartialFragmentLoops",
    doc="widen a T.Parallel loop shorter than the fragment it shares with longer loops, guarding its body",
)
def _pad_partial_fragment_loops(_ctx: BuildContext):
    return prim_func_pass(lambda _gv, func: pad_partial_fragment_loops(func), name="tessera.PadPartialFragmentLoops")
