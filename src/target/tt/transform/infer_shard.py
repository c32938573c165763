"""tt.InferShard: how each DRAM buffer of a kernel is laid out on a Tenstorrent device.

Every buffer parameter is stored in tile layout (32x32 tiles, four 16x16 faces each) and
interleaved over the arch's DRAM banks, one tile per page (page ``i`` is tile ``(i // cols, i % cols)``
of the tile grid, on bank ``i % banks``). A 1-D buffer is stored as one row. The function gets

    tt.shard = {buffer: {memory: "dram_interleaved", layout: "tiled", tile_shape: [32, 32],
                         shape, tiles: [rows, cols], dtype, page_size, dram_banks}}

Tile counts round up; ``tt.TilePad`` records the padding. Supported dtypes are the ones the
circular buffers carry (bfloat16, float16, float32); a buffer of another dtype or of rank > 2 is an
``UnsupportedTTOperationError`` naming it.
"""

from __future__ import annotations

from tessera_tvm.registry import BuildContext, register_pass
from tessera_tvm.target.tt import DTYPE_TO_FORMAT, TILE_HEIGHT, TILE_WIDTH, tile_bytes

from . import common


def _tiles(n: int, tile: int) -> int:
    return -(-n // tile)


def shard_of(name: str, buffer, banks: int, memory: str) -> dict:
    shape = [common.const_int(dim) for dim in buffer.shape]
    if any(dim is None for dim in shape):
        raise common.UnsupportedTTOperationError(
            f"kernel {name!r}: buffer {buffer.name!r} has a symbolic shape {list(buffer.shape)}; the Tenstorrent "
            "target needs static shapes"
        )
    if len(shape) not in (1, 2):
        raise common.UnsupportedTTOperationError(
            f"kernel {name!r}: buffer {buffer.name!r} has rank {len(shape)} (shape {shape}); the Tenstorrent target "
            "supports 1-D and 2-D buffers (reshape batched tensors to 2-D)"
        )
    dtype = str(buffer.dtype)
    if dtype not in DTYPE_TO_FORMAT:
        raise common.UnsupportedTTOperationError(
            f"kernel {name!r}: buffer {buffer.name!r} has dtype {dtype}; Tenstorrent circular buffers carry "
            f"{', '.join(sorted(DTYPE_TO_FORMAT))}"
        )
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    return {
        "memory": memory,
        "layout": "tiled",
        "tile_shape": [TILE_HEIGHT, TILE_WIDTH],
        "shape": shape,
        "tiles": [_tiles(rows, TILE_HEIGHT), _tiles(cols, TILE_WIDTH)],
        "dtype": dtype,
        "page_size": tile_bytes(DTYPE_TO_FORMAT[dtype]),
        "dram_banks": banks,
    }


@register_pass("tt.InferShard", doc="describe every DRAM buffer: interleaved, tile layout, 32x32 pages")
def infer_shard(ctx: BuildContext):
    def infer(name, func):
        arch = common.require_attr(func, common.ARCH, name, "tt.ApplyTTDefaults")
        memory = common.attr(func, common.DEFAULTS, {}).get("memory", "dram_interleaved")
        if memory != "dram_interleaved":
            raise common.TTLoweringError(
                f"kernel {name!r}: memory layout {memory!r} is not implemented; "
                "the Tenstorrent target places buffers dram_interleaved"
            )
        shards = {buf.name: shard_of(name, buf, arch["dram_banks"], memory) for buf in func.buffer_map.values()}
        return func.with_attr(common.SHARD, shards)

    return common.module_pass(infer, name="tt.InferShard")
