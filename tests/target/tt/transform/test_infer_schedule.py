"""tt.InferSchedule: output tiles (one per block) split over the arch's worker cores, contiguous, row-major."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm.script import tirx as T

from tessera_tvm.target.tt.transform.common import UnsupportedTTOperationError
from tessera_tvm.target.tt.transform.infer_schedule import schedule, split_contiguous

from .helpers import DEFAULTS, WORMHOLE, assert_pass, run_pass


@T.prim_func
def before(C: T.Buffer((64, 96), "bfloat16")):
    T.func_attr({"tt.arch": WORMHOLE, "tt.defaults": DEFAULTS})
    bx = T.launch_thread("blockIdx.x", 3)
    by = T.launch_thread("blockIdx.y", 2)
    C[by * 32, bx * 32] = T.bfloat16(0)


@T.prim_func
def expected(C: T.Buffer((64, 96), "bfloat16")):
    T.func_attr(
        {
            "tt.arch": WORMHOLE,
            "tt.defaults": DEFAULTS,
            "tt.schedule": {
                "policy": "contiguous",
                "order": "row_major",
                "grid": [3, 2],
                "total_tiles": 6,
                "num_cores": 6,
                "assignments": [[0, 0, 1], [1, 1, 1], [2, 2, 1], [3, 3, 1], [4, 4, 1], [5, 5, 1]],
            },
        }
    )
    bx = T.launch_thread("blockIdx.x", 3)
    by = T.launch_thread("blockIdx.y", 2)
    C[by * 32, bx * 32] = T.bfloat16(0)


@T.prim_func
def expected_two_cores(C: T.Buffer((64, 96), "bfloat16")):
    T.func_attr(
        {
            "tt.arch": WORMHOLE,
            "tt.defaults": DEFAULTS,
            "tt.schedule": {
                "policy": "contiguous",
                "order": "row_major",
                "grid": [3, 2],
                "total_tiles": 6,
                "num_cores": 2,
                "assignments": [[0, 0, 3], [1, 3, 3]],
            },
        }
    )
    bx = T.launch_thread("blockIdx.x", 3)
    by = T.launch_thread("blockIdx.y", 2)
    C[by * 32, bx * 32] = T.bfloat16(0)


def test_one_tile_per_core_when_the_grid_is_small():
    assert_pass("tt.InferSchedule", before, expected)


def test_cores_argument_limits_the_grid():
    assert_pass("tt.InferSchedule", before, expected_two_cores, cores=2)


def test_more_tiles_than_cores_first_cores_take_the_remainder():
    # 30 tiles over 8 cores -> 4,4,4,4,4,4,3,3 (the split the hand-written reference plans use)
    assert split_contiguous(30, 8) == [(0, 4), (4, 4), (8, 4), (12, 4), (16, 4), (20, 4), (24, 3), (27, 3)]
    sched = schedule([10, 10], 64)
    assert sched["num_cores"] == 64 and sched["total_tiles"] == 100
    assert [a[2] for a in sched["assignments"]] == [2] * 36 + [1] * 28


@settings(max_examples=60, deadline=None)
@given(nx=st.integers(1, 40), ny=st.integers(1, 40), workers=st.integers(1, 140))
def test_every_tile_is_assigned_exactly_once_contiguously(nx, ny, workers):
    sched = schedule([nx, ny], workers)
    tiles = [t for _core, start, count in sched["assignments"] for t in range(start, start + count)]
    assert tiles == list(range(nx * ny))  # contiguous, in row-major order, each once
    counts = [count for *_, count in sched["assignments"]]
    assert max(counts) - min(counts) <= 1 and len(counts) == min(nx * ny, workers)


@T.prim_func
def batched(C: T.Buffer((64, 96), "bfloat16")):
    T.func_attr({"tt.arch": WORMHOLE, "tt.defaults": DEFAULTS})
    bx = T.launch_thread("blockIdx.x", 3)
    bz = T.launch_thread("blockIdx.z", 4)
    C[0, bx * 32 + bz] = T.bfloat16(0)


def test_a_third_grid_axis_is_rejected_by_name():
    with pytest.raises(UnsupportedTTOperationError, match=r"third grid axis \(blockIdx.z = 4"):
        run_pass("tt.InferSchedule", batched)
