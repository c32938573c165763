"""tt.TilePad: pad every DRAM buffer to whole 32x32 tiles and drop the bounds masks that implies.

Tenstorrent moves whole tiles, so a 50x70 matrix lives in DRAM as 64x96: the host writes the
padding as zeros and reads back only the logical part of an output. The function gets

    tt.padding = {buffer: {shape: [50, 70], padded_shape: [64, 96]}}   # buffers that are not whole tiles

and the masks a tile program uses for edge tiles become unnecessary, so they are removed where
they only test an index against its buffer's logical extent:

    T.if_then_else(j < N, bias[j], 0)   ->  bias[j]      the padding reads as 0 already
    if r < M and c < N: C[r, c] = v     ->  C[r, c] = v  the padding of an output is dropped by the host

Any other condition (a causal mask, a data-dependent test) is kept; ``tt.Tensorize`` then reports
it as unsupported.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, register_pass
from tessera_tvm.target.tt import TILE_HEIGHT, TILE_WIDTH

from . import common


def padding(shards: dict) -> dict:
    out = {}
    for name, shard in shards.items():
        shape = shard["shape"]
        rows, cols = (1, shape[0]) if len(shape) == 1 else shape
        padded = [shard["tiles"][0] * TILE_HEIGHT, shard["tiles"][1] * TILE_WIDTH]
        if [rows, cols] != padded:
            out[name] = {"shape": list(shape), "padded_shape": padded}
    return out


def _clauses(cond) -> list:
    if isinstance(cond, tvm.tirx.And):
        return _clauses(cond.a) + _clauses(cond.b)
    return [cond]


def _strip_casts(expr):
    while isinstance(expr, tvm.tirx.Cast):
        expr = expr.value
    return expr


def _is_bounds_check(clause, access) -> bool:
    """``idx < extent`` where ``idx`` indexes dimension d of DRAM ``access`` and extent is its size."""
    if not isinstance(clause, tvm.tirx.LT) or not common.is_dram(access.buffer):
        return False
    extent = common.const_int(clause.b)
    for index, dim in zip(access.indices, access.buffer.shape, strict=True):
        if tvm.ir.structural_equal(index, clause.a) and common.const_int(dim) == extent:
            return True
    return False


def _is_zero(expr) -> bool:
    expr = _strip_casts(expr)
    return isinstance(expr, tvm.tirx.IntImm | tvm.tirx.FloatImm) and float(expr.value) == 0.0


def strip_masks(body):
    tirx = tvm.tirx

    def post(node):
        if common.op_name(node) == "tirx.if_then_else":
            cond, value, other = node.args
            load = _strip_casts(value)
            if (
                isinstance(load, tirx.BufferLoad)
                and _is_zero(other)
                and all(_is_bounds_check(c, load) for c in _clauses(cond))
            ):
                return value
            return None
        if isinstance(node, tirx.IfThenElse) and node.else_case is None:
            store = node.then_case
            if isinstance(store, tirx.BufferStore) and all(
                _is_bounds_check(c, store) for c in _clauses(node.condition)
            ):
                return store
        return None

    return tirx.stmt_functor.ir_transform(body, None, post, ["tirx.Call", "tirx.IfThenElse"])


@register_pass("tt.TilePad", doc="pad DRAM buffers to 32x32 tiles and drop the edge masks that makes redundant")
def tile_pad(ctx: BuildContext):
    def pad(name, func):
        shards = common.require_attr(func, common.SHARD, name, "tt.InferShard")
        return func.with_body(strip_masks(func.body)).with_attr(common.PADDING, padding(shards))

    return common.module_pass(pad, name="tt.TilePad")
