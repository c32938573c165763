"""The Tenstorrent arch table: facts, lookups, immutability."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tessera_tvm.target import tt
from tessera_tvm.target.tt.arch import ARCHS, TTArch, get_arch


def test_wormhole_n150():
    wh = get_arch("wormhole_b0")
    assert wh.board == "n150"
    assert wh.worker_grid == (8, 8) and wh.num_workers == 64
    assert wh.l1_bytes == 1_499_136 and wh.l1_budget_bytes == 1_499_136
    assert wh.dram_banks == 12
    assert wh.num_cbs == 32
    assert wh.dst_tiles(False) == 16 and wh.dst_tiles(fp32_dest_acc_en=True) == 8
    assert (wh.tile_height, wh.tile_width) == (32, 32)


def test_blackhole_p150():
    bh = get_arch("blackhole")
    assert bh.worker_grid == (14, 10) and bh.num_workers == 140
    assert bh.l1_bytes == 1536 * 1024
    assert bh.l1_budget_bytes <= bh.l1_bytes
    assert bh.dram_banks == 8
    assert bh.num_cbs == 32
    assert (bh.dst_tiles_bf16, bh.dst_tiles_fp32) == (16, 8)


@pytest.mark.parametrize(
    "alias, canonical",
    [
        ("Wormhole_B0", "wormhole_b0"),
        ("wormhole", "wormhole_b0"),
        ("n150", "wormhole_b0"),
        ("wormhole-b0", "wormhole_b0"),
        ("BLACKHOLE", "blackhole"),
        ("p150", "blackhole"),
    ],
)
def test_aliases(alias, canonical):
    assert get_arch(alias) is ARCHS[canonical]


def test_get_arch_passes_rows_through():
    wh = ARCHS["wormhole_b0"]
    assert get_arch(wh) is wh


def test_unknown_arch_error_names_the_known_ones():
    with pytest.raises(KeyError) as info:
        get_arch("grayskull")
    msg = str(info.value)
    assert "grayskull" in msg and "wormhole_b0" in msg and "blackhole" in msg
    with pytest.raises(ValueError):  # also a ValueError, for callers validating configs
        get_arch("quasar")
    with pytest.raises(TypeError):
        get_arch(8)  # type: ignore[arg-type]


def test_rows_are_frozen():
    wh = get_arch("wormhole_b0")
    assert dataclasses.is_dataclass(wh) and isinstance(wh, TTArch)
    with pytest.raises(dataclasses.FrozenInstanceError):
        wh.dram_banks = 8  # type: ignore[misc]


def test_contains_core():
    wh = get_arch("wormhole_b0")
    assert wh.contains_core(0, 0) and wh.contains_core(7, 7)
    assert not wh.contains_core(8, 0) and not wh.contains_core(0, 8) and not wh.contains_core(-1, 0)


def test_pinned_version():
    assert re.fullmatch(r"v0\.\d+\.\d+", tt.TT_METAL_VERSION)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", tt.TT_METAL_RELEASE_DATE)
    assert tt.TT_METAL_VERSION in tt.TT_METAL_VERSION_STRING
