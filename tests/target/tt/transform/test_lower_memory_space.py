"""tt.LowerMemorySpace: DRAM <-> core tiles get L1 circular buffers, within the arch's L1 and CB ids."""

from __future__ import annotations

import pytest
from tvm.script import tirx as T

from tessera_tvm.target.tt.transform.common import TTResourceError

from .helpers import WORMHOLE, assert_pass, run_pass, tt_config
from .tile_ops import copy, fill, gemm


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
    "A": _shard([64, 64], [2, 2]),
    "B": _shard([64, 96], [2, 3]),
    "bias": _shard([96], [1, 3]),
    "C": _shard([64, 96], [2, 3]),
}


@T.prim_func
def before(
    A: T.Buffer((64, 64), "bfloat16"),
    B: T.Buffer((64, 96), "bfloat16"),
    bias: T.Buffer((96,), "bfloat16"),
    C: T.Buffer((64, 96), "bfloat16"),
    start_tile: T.int32,
    num_tiles: T.int32,
):
    T.func_attr({"tt.arch": WORMHOLE, "tt.shard": SHARDS})
    for tile_id in T.serial(
        start_tile, start_tile + num_tiles, annotations={"tt.persistent": {"grid": [3, 2], "order": "row_major"}}
    ):
        bx: T.int32 = tile_id % 3
        by: T.int32 = tile_id // 3
        with T.sblock("tilelang_root"):
            T.reads()
            T.writes()
            A_s = T.sblock_alloc_buffer((32, 32), "bfloat16", scope="shared.dyn")
            B_s = T.sblock_alloc_buffer((32, 32), "bfloat16", scope="shared.dyn")
            C_l = T.sblock_alloc_buffer((32, 32), scope="local.fragment")
            T.evaluate(fill(C_l[0, 0]))
            for k in range(2):
                T.evaluate(copy(A[by * 32, k * 32], A_s[0, 0]))
                T.evaluate(copy(B[k * 32, bx * 32], B_s[0, 0]))
                T.evaluate(gemm(A_s[0, 0], B_s[0, 0], C_l[0, 0]))
            for i, j in T.grid(32, 32):
                C_l[i, j] = C_l[i, j] + T.Cast("float32", bias[bx * 32 + j])
            T.evaluate(copy(C_l[0, 0], C[by * 32, bx * 32]))


def _cb(cb_id, name, role, dram, tile, pages=2):
    return {
        "id": cb_id,
        "name": name,
        "role": role,
        "dram": dram,
        "tile": tile,
        "num_pages": pages,
        "page_size": 2048,
        "data_format": "Float16_b",
    }


@T.prim_func
def expected(
    A: T.Buffer((64, 64), "bfloat16"),
    B: T.Buffer((64, 96), "bfloat16"),
    bias: T.Buffer((96,), "bfloat16"),
    C: T.Buffer((64, 96), "bfloat16"),
    start_tile: T.int32,
    num_tiles: T.int32,
):
    T.func_attr(
        {
            "tt.arch": WORMHOLE,
            "tt.shard": SHARDS,
            "tt.circular_buffers": [
                _cb(0, "A_s", "input", "A", "A_s"),
                _cb(1, "B_s", "input", "B", "B_s"),
                _cb(2, "bias", "input", "bias", ""),  # read inside the epilogue loop
                _cb(16, "C_l", "output", "C", "C_l"),
            ],
        }
    )
    for tile_id in T.serial(
        start_tile, start_tile + num_tiles, annotations={"tt.persistent": {"grid": [3, 2], "order": "row_major"}}
    ):
        bx: T.int32 = tile_id % 3
        by: T.int32 = tile_id // 3
        with T.sblock("tilelang_root"):
            T.reads()
            T.writes()
            A_s = T.sblock_alloc_buffer((32, 32), "bfloat16", scope="tt.cb")  # was shared.dyn
            B_s = T.sblock_alloc_buffer((32, 32), "bfloat16", scope="tt.cb")
            C_l = T.sblock_alloc_buffer((32, 32), scope="tt.cb")  # was local.fragment
            T.evaluate(fill(C_l[0, 0]))
            for k in range(2):
                T.evaluate(copy(A[by * 32, k * 32], A_s[0, 0]))
                T.evaluate(copy(B[k * 32, bx * 32], B_s[0, 0]))
                T.evaluate(gemm(A_s[0, 0], B_s[0, 0], C_l[0, 0]))
            for i, j in T.grid(32, 32):
                C_l[i, j] = C_l[i, j] + T.Cast("float32", bias[bx * 32 + j])
            T.evaluate(copy(C_l[0, 0], C[by * 32, bx * 32]))


def test_tiles_moving_between_dram_and_the_core_get_circular_buffers():
    assert_pass("tt.LowerMemorySpace", before, expected)


def test_page_counts_come_from_the_pass_arguments():
    after = run_pass("tt.LowerMemorySpace", before, input_pages=3, output_pages=1)
    pages = {int(cb["id"]): int(cb["num_pages"]) for cb in after["main"].attrs["tt.circular_buffers"]}
    assert pages == {0: 3, 1: 3, 2: 3, 16: 1}


def test_l1_over_budget_names_kernel_amount_limit_and_fix():
    config = tt_config(resources={"l1_bytes_per_core": 8192})
    with pytest.raises(TTResourceError) as info:
        run_pass("tt.LowerMemorySpace", before.with_attr("tt.arch", {**WORMHOLE, "l1_bytes": 8192}), config)
    msg = str(info.value)
    assert (info.value.amount, info.value.limit) == (4 * 2 * 2048, 8192)  # 4 CBs x 2 pages x one bf16 tile
    assert "needs 16384 bytes of L1 per core for circular buffers" in msg and "at most 8192" in msg
    assert "input_pages/output_pages" in msg and "CB 2 bias: 2 x 2048 B" in msg


def test_more_input_tiles_than_input_cb_ids_is_rejected():
    small = {**WORMHOLE, "num_cbs": 4}  # inputs c_0..c_1, outputs c_2, intermediates c_3
    with pytest.raises(TTResourceError, match="needs 3 input circular buffers .* at most 2"):
        run_pass("tt.LowerMemorySpace", before.with_attr("tt.arch", small))
