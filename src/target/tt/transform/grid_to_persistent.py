"""tt.GridToPersistent: turn the block grid into one persistent loop per worker core.

A Tenstorrent core does not get one launch per block: the host starts each core once and gives
it a range of output tiles (``tt.schedule``). The ``blockIdx`` launch attrs are replaced by

    def main(..., start_tile: T.int32, num_tiles: T.int32):       # per-core runtime args
        for tile_id in T.serial(start_tile, start_tile + num_tiles, annotations={"tt.persistent": {...}}):
            bx: T.int32 = tile_id % nx                               # row-major: the block indices
            by: T.int32 = tile_id // nx                              # are recovered from the tile id
            <the block's body, unchanged>

with ``tt.persistent = {grid: [nx, ny], order: "row_major"}``. The block variables keep their
identity, so the body and every later annotation still read ``bx``/``by``.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, register_pass

from . import common

START_TILE = "start_tile"
NUM_TILES = "num_tiles"
TILE_ID = "tile_id"


def _is_block_launch(node) -> bool:
    return (
        isinstance(node, tvm.tirx.AttrStmt)
        and node.attr_key == "thread_extent"
        and str(node.node.thread_tag).startswith("blockIdx.")
    )


def _persistent(launch, start, count):
    tirx = tvm.tirx
    chain = []
    node = launch
    while _is_block_launch(node):
        chain.append(node)
        node = node.body
    extents = {str(a.node.thread_tag): int(a.value) for a in chain}
    nx, ny = extents.get("blockIdx.x", 1), extents.get("blockIdx.y", 1)
    tile = tirx.Var(TILE_ID, "int32")
    recover = {
        "blockIdx.x": tirx.floormod(tile, nx) if ny > 1 else tile,
        "blockIdx.y": tirx.floordiv(tile, nx),
        "blockIdx.z": tirx.IntImm("int32", 0),
    }
    binds = [
        tirx.Bind(a.node.var, recover[str(a.node.thread_tag)])
        for a in sorted(chain, key=lambda a: str(a.node.thread_tag))
    ]
    body = tirx.SeqStmt([*binds, node])
    return tirx.For(
        tile,
        start,
        count,
        tirx.ForKind.SERIAL,
        body,
        annotations={common.PERSISTENT: {"grid": [nx, ny], "order": "row_major"}},
    )


def to_persistent(name: str, func):
    tirx = tvm.tirx
    if common.persistent_loop(func) is not None:
        return func  # already persistent
    if not common.launch_grid(func):
        raise common.UnsupportedTTOperationError(
            f"kernel {name!r} has no T.Kernel grid launch; Tenstorrent kernels are tile programs with T.Kernel(...)"
        )
    for tag, _var, extent in common.launch_grid(func):
        if extent is None:
            raise common.UnsupportedTTOperationError(f"kernel {name!r}: launch extent of {tag} is not a constant")
    start, count = tirx.Var(START_TILE, "int32"), tirx.Var(NUM_TILES, "int32")

    def pre(node):
        if _is_block_launch(node):
            return _persistent(node, start, count)
        return None

    body = tirx.stmt_functor.ir_transform(func.body, pre, None, ["tirx.AttrStmt"])
    return tirx.PrimFunc([*func.params, start, count], body, func.ret_type, func.buffer_map, func.attrs)


@register_pass("tt.GridToPersistent", doc="replace the block grid by a per-core loop over assigned tiles")
def grid_to_persistent(ctx: BuildContext):
    return common.module_pass(to_persistent, name="tt.GridToPersistent")
