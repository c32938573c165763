"""tt.GridToPersistent: the blockIdx grid becomes each core's loop over its tiles."""

from __future__ import annotations

import pytest
from tvm.script import tirx as T

from tessera_tvm.target.tt.transform.common import UnsupportedTTOperationError

from .helpers import assert_pass, run_pass
from .tile_ops import copy


@T.prim_func
def before(A: T.Buffer((64, 96), "bfloat16"), C: T.Buffer((64, 96), "bfloat16")):
    bx = T.launch_thread("blockIdx.x", 3)
    by = T.launch_thread("blockIdx.y", 2)
    with T.sblock("tilelang_root"):
        T.reads()
        T.writes()
        A_s = T.sblock_alloc_buffer((32, 32), "bfloat16", scope="shared.dyn")
        T.evaluate(copy(A[by * 32, bx * 32], A_s[0, 0]))
        T.evaluate(copy(A_s[0, 0], C[by * 32, bx * 32]))


@T.prim_func
def expected(
    A: T.Buffer((64, 96), "bfloat16"), C: T.Buffer((64, 96), "bfloat16"), start_tile: T.int32, num_tiles: T.int32
):
    for tile_id in T.serial(
        start_tile, start_tile + num_tiles, annotations={"tt.persistent": {"grid": [3, 2], "order": "row_major"}}
    ):
        bx: T.int32 = tile_id % 3  # block indices recovered from the tile id, row-major
        by: T.int32 = tile_id // 3
        with T.sblock("tilelang_root"):
            T.reads()
            T.writes()
            A_s = T.sblock_alloc_buffer((32, 32), "bfloat16", scope="shared.dyn")
            T.evaluate(copy(A[by * 32, bx * 32], A_s[0, 0]))
            T.evaluate(copy(A_s[0, 0], C[by * 32, bx * 32]))


def test_grid_becomes_a_persistent_tile_loop():
    assert_pass("tt.GridToPersistent", before, expected)


@T.prim_func
def before_1d(C: T.Buffer((32, 160), "bfloat16")):
    bx = T.launch_thread("blockIdx.x", 5)
    C[0, bx * 32] = T.bfloat16(0)


@T.prim_func
def expected_1d(C: T.Buffer((32, 160), "bfloat16"), start_tile: T.int32, num_tiles: T.int32):
    for tile_id in T.serial(
        start_tile, start_tile + num_tiles, annotations={"tt.persistent": {"grid": [5, 1], "order": "row_major"}}
    ):
        bx: T.int32 = tile_id
        C[0, bx * 32] = T.bfloat16(0)


def test_a_one_dimensional_grid():
    assert_pass("tt.GridToPersistent", before_1d, expected_1d)


def test_already_persistent_is_left_alone():
    once = run_pass("tt.GridToPersistent", before)
    twice = run_pass("tt.GridToPersistent", once)
    assert twice["main"].same_as(once["main"]) or str(twice["main"]) == str(once["main"])


@T.prim_func
def no_grid(C: T.Buffer((32, 32), "bfloat16")):
    C[0, 0] = T.bfloat16(0)


def test_a_function_without_a_launch_is_rejected():
    with pytest.raises(UnsupportedTTOperationError, match="no T.Kernel grid launch"):
        run_pass("tt.GridToPersistent", no_grid)
