"""tt.ApplyTTDefaults: the arch row, compute config and defaults, once, onto every function."""

from __future__ import annotations

import pytest
from tvm.script import tirx as T

from tessera_tvm.config import load_config
from tessera_tvm.errors import LoweringError

from .helpers import assert_pass, run_pass, tt_config


@T.prim_func
def before(A: T.Buffer((64,), "bfloat16")):
    A[0] = T.bfloat16(0)


@T.prim_func
def expected(A: T.Buffer((64,), "bfloat16")):
    T.func_attr(
        {
            "tt.arch": {
                "name": "wormhole_b0",
                "board": "n150",
                "grid": [8, 8],
                "l1_bytes": 1499136,
                "num_cbs": 32,
                "dst_tiles": 16,
                "dram_banks": 12,
                "tile_shape": [32, 32],
            },
            "tt.compute_config": {"math_fidelity": "HiFi4", "fp32_dest_acc_en": False, "math_approx_mode": False},
            "tt.defaults": {
                "schedule_policy": "contiguous",
                "schedule_order": "row_major",
                "memory": "dram_interleaved",
            },
        }
    )
    A[0] = T.bfloat16(0)


def test_wormhole_defaults_from_the_arch_table():
    assert_pass("tt.ApplyTTDefaults", before, expected)


def test_blackhole_is_selected_by_the_arch_key():
    after = run_pass("tt.ApplyTTDefaults", before, tt_config(tt={"arch": "blackhole"}))
    arch = after["main"].attrs["tt.arch"]
    assert list(arch["grid"]) == [14, 10] and str(arch["board"]) == "p150" and int(arch["dram_banks"]) == 8


def test_fp32_accumulation_halves_dst_and_a_tighter_l1_budget_is_used():
    config = tt_config(tt={"fp32_dest_acc_en": True}, resources={"l1_bytes_per_core": 65536})
    arch = run_pass("tt.ApplyTTDefaults", before, config)["main"].attrs["tt.arch"]
    assert int(arch["dst_tiles"]) == 8 and int(arch["l1_bytes"]) == 65536


def test_attrs_already_set_are_kept():
    custom = before.with_attr(
        "tt.defaults",
        {
            "schedule_policy": "contiguous",
            "schedule_order": "row_major",
            "memory": "dram_interleaved",
            "note": "frontend",
        },
    )
    after = run_pass("tt.ApplyTTDefaults", custom)["main"]
    assert str(after.attrs["tt.defaults"]["note"]) == "frontend" and "tt.arch" in after.attrs


def test_a_non_tenstorrent_config_is_an_error():
    with pytest.raises(LoweringError, match="need a Tenstorrent config .* config 'cpu' has none"):
        run_pass("tt.ApplyTTDefaults", before, load_config("cpu"))
