"""tt.InferShard: every DRAM buffer interleaved over the DRAM banks in 32x32 tile pages."""

from __future__ import annotations

import pytest
from tvm.script import tirx as T

from tessera_tvm.target.tt.transform.common import UnsupportedTTOperationError

from .helpers import DEFAULTS, WORMHOLE, assert_pass, run_pass


@T.prim_func
def before(
    A: T.Buffer((50, 45), "bfloat16"),
    bias: T.Buffer((70,), "bfloat16"),
    h: T.Buffer((33, 64), "float16"),
    C: T.Buffer((64, 96), "float32"),
):
    T.func_attr({"tt.arch": WORMHOLE, "tt.defaults": DEFAULTS})
    C[0, 0] = T.Cast("float32", A[0, 0] + bias[0])


def _shard(shape, tiles, dtype="bfloat16", page=2048):
    return {
        "memory": "dram_interleaved",
        "layout": "tiled",
        "tile_shape": [32, 32],
        "shape": shape,
        "tiles": tiles,
        "dtype": dtype,
        "page_size": page,
        "dram_banks": 12,
    }


@T.prim_func
def expected(
    A: T.Buffer((50, 45), "bfloat16"),
    bias: T.Buffer((70,), "bfloat16"),
    h: T.Buffer((33, 64), "float16"),
    C: T.Buffer((64, 96), "float32"),
):
    T.func_attr(
        {
            "tt.arch": WORMHOLE,
            "tt.defaults": DEFAULTS,
            "tt.shard": {
                "A": _shard([50, 45], [2, 2]),
                "bias": _shard([70], [1, 3]),  # a 1-D buffer is one row of tiles
                "h": _shard([33, 64], [2, 2], "float16"),  # IEEE half: 2048-byte tiles as bfloat16
                "C": _shard([64, 96], [2, 3], "float32", 4096),
            },
        }
    )
    C[0, 0] = T.Cast("float32", A[0, 0] + bias[0])


def test_tile_pages_per_buffer_rounded_up_to_whole_tiles():
    assert_pass("tt.InferShard", before, expected)


@T.prim_func
def double(A: T.Buffer((64, 64), "float64")):
    T.func_attr({"tt.arch": WORMHOLE, "tt.defaults": DEFAULTS})
    A[0, 0] = T.float64(0)


@T.prim_func
def batched(A: T.Buffer((2, 64, 64), "bfloat16")):
    T.func_attr({"tt.arch": WORMHOLE, "tt.defaults": DEFAULTS})
    A[0, 0, 0] = T.bfloat16(0)


def test_unsupported_dtype_and_rank_name_the_buffer():
    with pytest.raises(
        UnsupportedTTOperationError, match="buffer 'A' has dtype float64; .* bfloat16, float16, float32"
    ):
        run_pass("tt.InferShard", double)
    with pytest.raises(UnsupportedTTOperationError, match=r"buffer 'A' has rank 3 \(shape \[2, 64, 64\]\)"):
        run_pass("tt.InferShard", batched)
