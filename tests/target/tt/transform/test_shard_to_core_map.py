"""tt.ShardToCoreMap: schedule entries placed row-major on the arch's worker grid."""

from __future__ import annotations

from tvm.script import tirx as T

from tessera_tvm.target.tt.transform.infer_schedule import schedule
from tessera_tvm.target.tt.transform.shard_to_core_map import core_map

from .helpers import WORMHOLE, assert_pass, run_pass, tt_config

SCHEDULE = schedule([5, 2], 64)  # 10 tiles -> 10 cores


@T.prim_func
def before(C: T.Buffer((64, 160), "bfloat16")):
    T.func_attr({"tt.arch": WORMHOLE, "tt.schedule": SCHEDULE})
    C[0, 0] = T.bfloat16(0)


@T.prim_func
def expected(C: T.Buffer((64, 160), "bfloat16")):
    T.func_attr(
        {
            "tt.arch": WORMHOLE,
            "tt.schedule": SCHEDULE,
            "tt.core_map": {
                "arch_grid": [8, 8],
                "grid": [8, 2],
                "cores": [[0, 0], [1, 0], [2, 0], [3, 0], [4, 0], [5, 0], [6, 0], [7, 0], [0, 1], [1, 1]],
            },
        }
    )
    C[0, 0] = T.bfloat16(0)


def test_cores_fill_rows_of_the_worker_grid():
    assert_pass("tt.ShardToCoreMap", before, expected)


def test_the_whole_grid_of_each_arch():
    wormhole = core_map(64, [8, 8])
    assert wormhole["grid"] == [8, 8] and wormhole["cores"][-1] == [7, 7]
    assert len({tuple(c) for c in wormhole["cores"]}) == 64
    blackhole = core_map(140, [14, 10])
    assert blackhole["grid"] == [14, 10] and blackhole["cores"][-1] == [13, 9]


def test_blackhole_coordinates_come_from_its_arch_row():
    config = tt_config(tt={"arch": "blackhole"})
    mod = run_pass("tt.ApplyTTDefaults", before.without_attr("tt.arch"), config)
    mod = run_pass("tt.ShardToCoreMap", mod, config)
    cmap = mod["main"].attrs["tt.core_map"]
    assert [list(map(int, c)) for c in cmap["cores"]][-1] == [9, 0] and list(map(int, cmap["grid"])) == [10, 1]
