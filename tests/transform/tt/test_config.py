"""configs/tenstorrent.yaml: arch selection, resources from the arch table, and the pass lists."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from tessera_tvm import ConfigError, load_config, pass_names
from tessera_tvm.config import parse_config
from tessera_tvm.target.tt.arch import get_arch

from .helpers import tt_config


def _shared_names() -> list[str]:
    text = resources.files("tessera_tvm.configs").joinpath("shared/lower_and_legalize.yaml").read_text()
    return [e if isinstance(e, str) else e["pass"] for e in yaml.safe_load(text)["passes"]]


def test_lower_and_legalize_is_an_in_order_subset_of_the_shared_list():
    tt_names = pass_names("tenstorrent", "lower_and_legalize")
    assert tt_names[0] == "tt.ApplyTTDefaults"
    shared = _shared_names()
    position = -1
    for name in (n for n in tt_names if not n.startswith("tt.")):
        later = [k for k, s in enumerate(shared) if s == name and k > position]
        assert later, f"{name} is not in the shared list after position {position}"
        position = later[0]
    # the tile operations must still be there for tt.Tensorize: nothing from LayoutInference on
    assert "tl.LayoutInference" not in tt_names and "tl.LowerTileOp" not in tt_names


def test_optimize_for_target_is_the_tt_pipeline():
    assert pass_names("tenstorrent", "optimize_for_target") == [
        "tt.InferSchedule",
        "tt.InferShard",
        "tt.GridToPersistent",
        "tt.ShardToCoreMap",
        "tt.LowerMemorySpace",
        "tt.TilePad",
        "tt.Tensorize",
        "tt.VerifyTTIR",
    ]


def test_wormhole_is_the_default_and_its_resources_come_from_the_arch_table():
    cfg = load_config("tenstorrent")
    arch = get_arch("wormhole_b0")
    assert cfg.tt_dict["arch"] == "wormhole_b0" and cfg.codegen_kind == "tt"
    assert cfg.resource_limits == {
        "l1_bytes_per_core": arch.l1_budget_bytes,
        "circular_buffers_per_core": 32,
        "dst_tiles": 16,
    }
    assert cfg.tvm_target().kind.name == "c" and "tenstorrent" in cfg.tvm_target().keys


def test_blackhole_by_arch_key_and_aliases():
    cfg = tt_config(tt={"arch": "p150"})  # an alias of blackhole
    assert cfg.tt_dict["arch"] == "blackhole"
    assert cfg.resource_limits["l1_bytes_per_core"] == get_arch("blackhole").l1_budget_bytes
    assert tt_config(tt={"fp32_dest_acc_en": True}).resource_limits["dst_tiles"] == 8


def test_resources_may_tighten_but_not_widen_the_arch():
    assert tt_config(resources={"l1_bytes_per_core": 65536}).resource_limits["l1_bytes_per_core"] == 65536
    with pytest.raises(
        ConfigError,
        match=r"resources.l1_bytes_per_core: 2000000 is more than arch 'wormhole_b0' "
        r"has \(1499136\)",
    ):
        tt_config(resources={"l1_bytes_per_core": 2_000_000})


def test_bad_tt_sections_are_config_errors():
    with pytest.raises(ConfigError, match=r"tt.arch: unknown Tenstorrent arch 'grayskull'; known: blackhole"):
        tt_config(tt={"arch": "grayskull"})
    with pytest.raises(ConfigError, match=r"tt.math_fidelity: expected LoFi, HiFi2, HiFi3 or HiFi4"):
        tt_config(tt={"math_fidelity": "HiFi5"})
    with pytest.raises(ConfigError, match=r"tt.fp32_acc: unknown key \(did you mean 'fp32_dest_acc_en'\?\)"):
        tt_config(tt={"fp32_acc": True})
    data = dict(load_config("tenstorrent").raw, target={"kind": "c"})
    with pytest.raises(ConfigError, match=r"target.keys: codegen tt needs target \{kind: c, keys: \[tenstorrent\]\}"):
        parse_config(data, "no_keys.yaml")


def test_only_tenstorrent_configs_take_a_tt_section(tmp_path):
    data = yaml.safe_load(open(load_config("cpu").source).read())
    data["tt"] = {"arch": "wormhole_b0"}
    path = tmp_path / "cpu_tt.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"tt: only Tenstorrent configs \(codegen.kind: tt\) take a `tt:` section"):
        load_config(path)
