"""tt.TilePad: buffers padded to whole tiles, and the edge masks that padding makes redundant dropped."""

from __future__ import annotations

from tvm.script import tirx as T

from .helpers import assert_pass


def _shard(shape, tiles):
    return {
        "memory": "dram_interleaved",
        "layout": "tiled",
        "tile_shape": [32, 32],
        "shape": shape,
        "tiles": tiles,
        "dtype": "bfloat16",
        "page_size": 2048,
        "dram_banks": 12,
    }


SHARDS = {
    "X": _shard([33, 100], [2, 4]),
    "bias": _shard([100], [1, 4]),
    "Y": _shard([33, 100], [2, 4]),
    "Z": _shard([64, 128], [2, 4]),
}


@T.prim_func
def before(
    X: T.Buffer((33, 100), "bfloat16"),
    bias: T.Buffer((100,), "bfloat16"),
    Y: T.Buffer((33, 100), "bfloat16"),
    Z: T.Buffer((64, 128), "bfloat16"),
    start_tile: T.int32,
    num_tiles: T.int32,
):
    T.func_attr({"tt.shard": SHARDS})
    for tile_id in T.serial(start_tile, start_tile + num_tiles):
        bx: T.int32 = tile_id % 4
        by: T.int32 = tile_id // 4
        for i, j in T.grid(32, 32):
            if by * 32 + i < 33 and bx * 32 + j < 100:  # an edge mask on the store: dropped
                Y[by * 32 + i, bx * 32 + j] = X[by * 32 + i, bx * 32 + j] + T.if_then_else(
                    bx * 32 + j < 100, bias[bx * 32 + j], T.bfloat16(0)
                )  # a masked load reading 0: dropped
        for i, j in T.grid(32, 32):
            if i <= j:  # not a bounds check: kept
                Z[by * 32 + i, bx * 32 + j] = T.bfloat16(0)


@T.prim_func
def expected(
    X: T.Buffer((33, 100), "bfloat16"),
    bias: T.Buffer((100,), "bfloat16"),
    Y: T.Buffer((33, 100), "bfloat16"),
    Z: T.Buffer((64, 128), "bfloat16"),
    start_tile: T.int32,
    num_tiles: T.int32,
):
    T.func_attr(
        {
            "tt.shard": SHARDS,
            "tt.padding": {
                "X": {"shape": [33, 100], "padded_shape": [64, 128]},
                "bias": {"shape": [100], "padded_shape": [32, 128]},
                "Y": {"shape": [33, 100], "padded_shape": [64, 128]},
            },
        }
    )
    for tile_id in T.serial(start_tile, start_tile + num_tiles):
        bx: T.int32 = tile_id % 4
        by: T.int32 = tile_id // 4
        for i, j in T.grid(32, 32):
            Y[by * 32 + i, bx * 32 + j] = X[by * 32 + i, bx * 32 + j] + bias[bx * 32 + j]
        for i, j in T.grid(32, 32):
            if i <= j:
                Z[by * 32 + i, bx * 32 + j] = T.bfloat16(0)


def test_padding_recorded_and_edge_masks_dropped():
    assert_pass("tt.TilePad", before, expected)
