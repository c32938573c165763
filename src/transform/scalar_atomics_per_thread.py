"""tessera.ScalarAtomicsPerThread: ``T.atomic_add(Out, x)`` of a one-element ``Out`` adds every thread's ``x``.

A per-thread value added into a one-element buffer given whole, ``T.atomic_add(Out, A[t])`` (the
parallel-reduction form; ``atomic_max`` and ``atomic_min`` too), becomes a tile operation over a
region of one element. ``tl.LowerTileOp`` (TileLang 0.1.15) lowers it as a parallel loop of one
iteration bound to thread 0, and the simplifier then reads ``A[0]``: one value is added instead of
128, silently (tile-ai/tilelang#2959). ``T.atomic_add(Out[0], A[t])`` is lowered right: each
thread's own atomic.

This pass rewrites the first form into the second before any tile operation is lowered: a tile
atomic whose value is a scalar and whose destination region has one element becomes the
element atomic on that element (with its memory order, if one was given). Other atomics are left
as they are, so other programs keep TileLang's code.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, prim_func_pass, register_pass

from . import analysis

tirx = tvm.tirx

#: tile atomic -> the element atomic TileLang's frontend emits for an element destination.
ELEMENT_OPS = {
    "tl.tileop.atomicadd": "tl.atomic_add_elem_op",
    "tl.tileop.atomicmax": "tl.atomic_max_elem_op",
    "tl.tileop.atomicmin": "tl.atomic_min_elem_op",
}
_READ_WRITE = 3  # tl.access_ptr's access mask: read and write


def _one_element(region) -> tirx.BufferLoad | None:
    """The element a ``tl.region(load, access, *extents)`` covers when every extent is 1."""
    if analysis.op_name(region) != "tl.region" or not isinstance(region.args[0], tirx.BufferLoad):
        return None
    extents = list(region.args[2:])
    if not extents or not all(isinstance(e, tirx.IntImm) and e.value == 1 for e in extents):
        return None
    return region.args[0]


def element_atomic(call):
    """The element atomic ``call`` stands for, or None when it is not a one-element tile atomic."""
    element_op = ELEMENT_OPS.get(analysis.op_name(call) or "")
    if element_op is None or len(call.args) != 2:
        return None
    value, region = call.args
    element = _one_element(region)
    if element is None or isinstance(value, tirx.Call) or value.dtype.lanes != 1:
        return None  # a region value (tl.region) or a vector: a real tile operation
    annotations = dict(call.annotations) if call.annotations is not None else {}
    order = annotations.pop("memory_order", None)
    if annotations:
        return None  # annotations the element atomic does not take
    pointer = tirx.Call("handle", tvm.ir.Op.get("tl.access_ptr"), [element, 1, _READ_WRITE])
    args = [pointer, value] + ([order] if order is not None else [])
    return tirx.Call("handle", tvm.ir.Op.get(element_op), args)


def scalar_atomics_per_thread(func):
    """``func`` with such atomics rewritten (the same object when there are none)."""
    return analysis.rewrite_nodes(func, element_atomic, ["tirx.Call"])


@register_pass(
    "tessera.ScalarAtomicsPerThread",
    doc="a tile atomic of a scalar into a one-element buffer becomes each thread's element atomic",
)
def _scalar_atomics_per_thread(_ctx: BuildContext):
    return prim_func_pass(lambda _gv, func: scalar_atomics_per_thread(func), name="tessera.ScalarAtomicsPerThread")
