"""configs/tenstorrent.yaml: arch selection, resources from the arch table, and the pass lists."""

from __future__ import annotations

import copy

import pytest
import yaml

from tessera_tvm import ConfigError, load_config, pass_names
from tessera_tvm.config import parse_config
from tessera_tvm.target.tt.arch import get_arch

from .transform.helpers import tt_config


def _with_lower_and_legalize(value, name="tt_variant.yaml"):
    data = copy.deepcopy(dict(load_config("tenstorrent").raw))
    data["pipeline"]["lower_and_legalize"] = value
    return parse_config(data, name)


def test_lower_and_legalize_is_the_shared_list_up_to_layout_inference():
    """`{shared: true, until: tl.LayoutInference}`: the tile operations must still be there for
    tt.Tensorize, so nothing from LayoutInference on; and no hand copy to drift from the shared list."""
    whole = pass_names(_with_lower_and_legalize("shared"), "lower_and_legalize")  # this config's features
    tt_names = pass_names("tenstorrent", "lower_and_legalize")
    assert tt_names == ["tt.ApplyTTDefaults", *whole[: whole.index("tl.LayoutInference")]]
    assert "tl.LayoutInference" not in tt_names and "tl.LowerTileOp" not in tt_names


def test_an_edit_of_the_shared_list_reaches_tenstorrent(monkeypatch):
    from tessera_tvm import config_pipeline

    real = config_pipeline.packaged
    shared = config_pipeline.SHARED_LISTS["lower_and_legalize"]

    def edited(name):
        text, source = real(name)
        return (text.replace("  - tl.InjectAssumes\n", "") if name == shared else text), source

    assert "tl.InjectAssumes" in pass_names("tenstorrent", "lower_and_legalize")
    monkeypatch.setattr(config_pipeline, "packaged", edited)
    assert "tl.InjectAssumes" not in pass_names(load_config("tenstorrent"), "lower_and_legalize")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"shared": True, "until": "tl.LayoutInferense"}, r"\[1\].until: 'tl.LayoutInferense' is not in the shared"),
        ({"shared": False}, r"\[1\].shared: expected true, found False"),
        ({"shared": True, "upto": "tl.Simplify"}, r"\[1\].upto: unknown key"),
    ],
)
def test_a_bad_shared_entry_is_a_config_error(entry, message):
    with pytest.raises(ConfigError, match=r"tt_variant.yaml: pipeline.lower_and_legalize" + message):
        _with_lower_and_legalize(["tt.ApplyTTDefaults", entry])


def test_optimize_for_target_is_the_tt_pipeline():
    assert pass_names("tenstorrent", "optimize_for_target") == [
        "tt.InferSchedule",
        "tt.InferShard",
        "tt.GridToPersistent",
        "tt.ShardToCoreMap",
        "tt.LowerMemorySpace",
        "tt.TilePad",
        "tt.Tensorize",
        "tl.Simplify",  # seed 003's common optimisations: the one that applies (configs/tenstorrent.yaml)
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
