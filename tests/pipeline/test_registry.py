"""The pass registry resolves every configured name and explains unknown ones."""

from __future__ import annotations

import pytest

import tessera_tvm
from tessera_tvm import PassNotFoundError, get_pass, list_passes
from tessera_tvm.pipeline import ensure_registered


def test_every_config_pass_is_registered():
    ensure_registered()
    for name in tessera_tvm.available_configs():
        for pass_name in tessera_tvm.pass_names(name):
            assert get_pass(pass_name).name == pass_name


def test_names_are_namespaced_by_owner():
    ensure_registered()
    origins = {spec.origin for spec in list_passes()}
    assert {"tl", "tirx", "s_tir", "tessera"} <= origins


def test_unknown_name_lists_closest():
    ensure_registered()
    with pytest.raises(PassNotFoundError) as err:
        get_pass("tl.LayoutInferance")
    assert err.value.suggestions[0] == "tl.LayoutInference"
    assert "did you mean tl.LayoutInference" in str(err.value)


def test_unqualified_name_suggests_the_qualified_one():
    ensure_registered()
    with pytest.raises(PassNotFoundError, match=r"did you mean .*tl.FlattenBuffer"):
        get_pass("FlattenBuffer")


def test_factories_build_passes_named_like_the_registry():
    from tessera_tvm.pipeline import build_phase

    seq = build_phase("hopper", "optimize_for_target")
    assert seq.info.name == "tessera.OptimizeForTarget"


def test_register_pass_rejects_unnamespaced_names():
    with pytest.raises(ValueError, match="namespaced"):
        tessera_tvm.register_pass("MyPass")(lambda ctx: None)
