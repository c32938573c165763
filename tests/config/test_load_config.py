"""load_config: the shipped configs load, and every kind of bad file gets a precise error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

import tessera_tvm
from tessera_tvm import ConfigError, load_config

SHIPPED = ["ampere", "cpu", "hopper", "rocm"]


def test_available_configs_lists_the_shipped_targets():
    assert set(SHIPPED) <= set(tessera_tvm.available_configs())


@pytest.mark.parametrize(
    "name, kind, key, value",
    [
        ("hopper", "cuda", "arch", "sm_90a"),
        ("ampere", "cuda", "arch", "sm_80"),
        ("rocm", "hip", "mcpu", "gfx942"),
        ("cpu", "c", None, None),
    ],
)
def test_shipped_config_names_its_target(name, kind, key, value):
    cfg = load_config(name)
    assert cfg.name == name
    assert cfg.tvm_kind == kind == cfg.target_kind
    if key:
        assert cfg.target_dict[key] == value
    assert cfg.tvm_target().kind.name == kind


def test_gpu_configs_declare_resource_limits():
    for name in ("hopper", "ampere", "rocm"):
        limits = load_config(name).resource_limits
        assert limits["shared_memory_per_block"] > 0 and limits["threads_per_block"] == 1024
    assert load_config("hopper").resource_limits["shared_memory_per_block"] == 232448


def test_config_is_hashable_and_fingerprint_is_stable(tmp_path):
    a, b = load_config("hopper"), load_config("hopper")
    assert hash(a) == hash(b) and a.fingerprint() == b.fingerprint()
    assert load_config("ampere").fingerprint() != a.fingerprint()


def _write(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _hopper_data() -> dict:
    return yaml.safe_load(Path(load_config("hopper").source).read_text())


def _write_data(tmp_path: Path, data: dict, name: str = "custom.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_user_config_by_path_without_warp_specialisation(tmp_path):
    data = _hopper_data()
    data["name"] = "hopper_no_ws"
    data["features"]["warp_specialization"] = False
    cfg = load_config(_write_data(tmp_path, data))
    names = tessera_tvm.pass_names(cfg)
    assert cfg.name == "hopper_no_ws"
    assert "tl.ProducerConsumerWarpSpecialized" not in names
    assert "tl.AnnotateWarpGroupRegAlloc" not in names
    assert "tl.ProducerConsumerWarpSpecialized" in tessera_tvm.pass_names("hopper")


def test_unknown_top_level_key_names_file_key_and_line(tmp_path):
    path = _write(
        tmp_path,
        """\
        name: x
        target: {kind: cuda, arch: sm_90a}
        pipline: {}
        pipeline: {optimize_for_target: [tl.Simplify]}
        """,
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert f"{path}:3: pipline: unknown key (did you mean 'pipeline'?)" in msg
    assert err.value.line == 3 and err.value.key == "pipline"


def test_wrong_type_is_reported_with_expected_type(tmp_path):
    data = _hopper_data()
    data["resources"]["shared_memory_per_block"] = "lots"
    with pytest.raises(
        ConfigError, match=r"resources.shared_memory_per_block: expected a positive integer .*found str 'lots'"
    ):
        load_config(_write_data(tmp_path, data))


def test_boolean_is_not_accepted_as_an_integer(tmp_path):
    data = _hopper_data()
    data["resources"]["threads_per_block"] = True
    with pytest.raises(ConfigError, match="threads_per_block: expected a positive integer"):
        load_config(_write_data(tmp_path, data))


def test_unknown_pass_name_suggests_closest(tmp_path):
    path = _write(
        tmp_path,
        """\
        name: x
        target: {kind: cuda, arch: sm_90a}
        pipeline:
          optimize_for_target:
            - tl.Simplify
            - tl.LayoutInferense
        """,
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert f"{path}:6:" in msg and "pipeline.optimize_for_target[1]" in msg
    assert "unknown pass 'tl.LayoutInferense'" in msg and "did you mean tl.LayoutInference" in msg


def test_missing_target_is_an_error(tmp_path):
    path = _write(
        tmp_path,
        """\
        name: x
        pipeline: {optimize_for_target: [tl.Simplify]}
        """,
    )
    with pytest.raises(ConfigError, match=r"target: is missing; every config needs `target`"):
        load_config(path)


def test_missing_target_kind_and_unknown_kind(tmp_path):
    with pytest.raises(ConfigError, match=r"target.kind: is missing"):
        load_config(_write(tmp_path, "name: x\ntarget: {arch: sm_90a}\npipeline: {}\n"))
    with pytest.raises(ConfigError, match=r"target.kind: unsupported target kind 'vulkan'"):
        load_config(_write(tmp_path, "name: x\ntarget: {kind: vulkan}\npipeline: {}\n", "b.yaml"))


def test_cuda_arch_must_look_like_sm(tmp_path):
    with pytest.raises(ConfigError, match=r"target.arch: expected a CUDA arch like 'sm_90a'"):
        load_config(_write(tmp_path, "name: x\ntarget: {kind: cuda, arch: hopper}\npipeline: {}\n"))


def test_invalid_yaml_gives_line(tmp_path):
    path = _write(tmp_path, "name: x\ntarget: {kind: cuda\npipeline: []\n")
    with pytest.raises(ConfigError, match=rf"{path}:\d+: is not valid YAML"):
        load_config(path)


def test_empty_file_and_empty_pipeline(tmp_path):
    with pytest.raises(ConfigError, match="is empty"):
        load_config(_write(tmp_path, ""))
    data = _hopper_data()
    data["pipeline"] = {"lower_and_legalize": [], "optimize_for_target": []}
    with pytest.raises(ConfigError, match="pipeline: is empty"):
        load_config(_write_data(tmp_path, data))


def test_unknown_feature_and_condition(tmp_path):
    data = _hopper_data()
    data["features"]["warp_specialisation"] = True
    with pytest.raises(
        ConfigError, match=r"features.warp_specialisation: unknown key \(did you mean 'warp_specialization'\?\)"
    ):
        load_config(_write_data(tmp_path, data))
    data = _hopper_data()
    data["pipeline"]["optimize_for_target"][0] = {"pass": "tl.LowerSharedTmem", "when": "sometimes"}
    with pytest.raises(ConfigError, match=r"optimize_for_target\[0\].when: unknown condition 'sometimes'"):
        load_config(_write_data(tmp_path, data))
    data["pipeline"]["optimize_for_target"][0] = {"pass": "tl.LowerSharedTmem", "when": "ir.has_tmaa"}
    with pytest.raises(ConfigError, match=r"unknown IR predicate.*ir.has_tma"):
        load_config(_write_data(tmp_path, data))


def test_pass_arguments_are_checked(tmp_path):
    data = _hopper_data()
    data["pass_args"]["tl.VectorizeLoop"] = {"enable": True}
    with pytest.raises(
        ConfigError,
        match=r"pass_args.tl.VectorizeLoop.enable: pass tl.VectorizeLoop takes no argument 'enable'; its arguments: enable_vectorize",
    ):
        load_config(_write_data(tmp_path, data))
    data = _hopper_data()
    data["pass_args"]["tl.VectorizeLoop"] = {"enable_vectorize": "yes"}
    with pytest.raises(ConfigError, match=r"argument 'enable_vectorize' expects bool, found 'yes'"):
        load_config(_write_data(tmp_path, data))


def test_pass_args_for_a_pass_not_in_the_pipeline(tmp_path):
    data = _hopper_data()
    data["pass_args"]["tl.LowerCPUAtomics"] = {}
    with pytest.raises(ConfigError, match=r"pass_args.tl.LowerCPUAtomics: has arguments but the pass is not in"):
        load_config(_write_data(tmp_path, data))


def test_unknown_config_name_suggests(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown target config.*did you mean 'hopper'"):
        load_config("hoper")
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.yaml")


def test_codegen_must_match_target_kind(tmp_path):
    data = _hopper_data()
    data["codegen"]["kind"] = "hip"
    with pytest.raises(
        ConfigError, match=r"codegen.kind: codegen 'hip' needs target kind 'hip', but target.kind is 'cuda'"
    ):
        load_config(_write_data(tmp_path, data))


def test_duplicate_key_is_an_error(tmp_path):
    path = _write(tmp_path, "name: x\nname: y\ntarget: {kind: c}\npipeline: {}\n")
    with pytest.raises(ConfigError, match=rf"{path}:2: name: appears twice"):
        load_config(path)


def test_a_schedule_typo_names_the_file_line_and_the_key(tmp_path):
    text = (
        Path(load_config("hopper").source)
        .read_text()
        .replace("  block_k: 64\n  stages: 4", "  blok_k: 64\n  stages: 4")
    )
    path = tmp_path / "typo.yaml"
    path.write_text(text)
    line = text.splitlines().index("  blok_k: 64") + 1
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:{line}: schedule.blok_k: unknown key (did you mean 'block_k'?)")


def test_schedule_keys_are_the_tile_schedules_fields():
    """The loader's list and TileSchedule must not drift apart (a field the loader refused, or let
    through for TileSchedule.from_config to drop without a word)."""
    import dataclasses

    from tessera_tvm.config import SCHEDULE_FAMILIES, SCHEDULE_KEYS
    from tessera_tvm.tile import SPEC_FAMILIES, TileSchedule

    assert set(SCHEDULE_KEYS) == {f.name for f in dataclasses.fields(TileSchedule)}
    assert SCHEDULE_FAMILIES == SPEC_FAMILIES


def test_a_per_family_schedule_loads(tmp_path):
    data = _hopper_data()
    data["schedule"]["attention"] = {"block_m": 64, "stages": 2}
    path = tmp_path / "fam.yaml"
    path.write_text(yaml.safe_dump(data))
    assert dict(load_config(path).schedule)["attention"] == (("block_m", 64), ("stages", 2))


def test_a_rocm_target_is_built_once_and_says_nothing_about_a_rocm_version(capfd):
    # Without a ROCm runtime TVM printed "Unable to detect ROCm version, assuming >= 3.5" for every
    # ROCm target it built, and one was built per lowering step: 215 lines in the demo.
    from tessera_tvm import _tvm

    _tvm._target.cache_clear()
    config = load_config("rocm")
    first, second = config.tvm_target(), config.tvm_target()
    assert first.same_as(second) and first.attrs["thread_warp_size"] == 64
    assert "ROCm version" not in capfd.readouterr().err
