"""Tests of tessera_tvm.target.backend: one Backend manifest per codegen kind, found from a config."""

from pathlib import Path

import pytest

from tessera_tvm.config import load_config
from tessera_tvm.target.backend import Backend, UnknownBackendError, backend_for, known_kinds, register_backend

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_the_shipped_configs_are_all_here():
    assert {p.stem for p in CONFIGS} >= {"ampere", "cpu", "hopper", "rocm", "tenstorrent"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_resolves_to_the_backend_of_its_codegen_kind(path):
    config = load_config(path)
    backend = backend_for(config)
    assert isinstance(backend, Backend)
    assert backend.kind == config.codegen_kind
    assert backend_for(config.codegen_kind) is backend


def test_tenstorrent_is_keyed_on_its_codegen_kind_not_its_tvm_kind():
    config = load_config("tenstorrent")
    assert (config.target_kind, config.codegen_kind) == ("c", "tt")
    assert backend_for(config).kind == "tt"
    assert backend_for("c").kind == "c"  # TVM kind c alone is the CPU


def test_an_unknown_kind_names_itself_and_the_known_kinds():
    with pytest.raises(UnknownBackendError) as caught:
        backend_for("vulkan")
    message = str(caught.value)
    assert "'vulkan'" in message
    for kind in ("c", "cuda", "hip", "tt"):
        assert kind in message
    assert set(known_kinds()) >= {"c", "cuda", "hip", "tt"}


@pytest.mark.parametrize("kind, suffix", [("cuda", ".cu"), ("hip", ".hip.cpp"), ("c", ".cpp"), ("tt", ".tt.cpp")])
def test_source_suffixes(kind, suffix):
    assert backend_for(kind).source_suffix == suffix


@pytest.mark.parametrize("kind", ["cuda", "hip", "c", "tt"])
def test_every_hook_of_a_shipped_backend_imports(kind):
    """A hook is a "module:attribute" string: a typo would only show when that path first runs."""
    backend = backend_for(kind)
    hooks = ["tile_spec", "program_generator", "build", "entry", "run", "reload", "fixed_schedule"]
    for name in hooks:
        if getattr(backend, name) is not None:
            assert backend.hook(name) is not None, name
    for family in backend.tile_programs:
        assert callable(backend.tile_program(family)), family
    assert set(backend.tile_programs) == set(backend.program_fields)


def test_a_registered_backend_is_found_and_can_be_replaced():
    cpu = backend_for("c")
    try:
        custom = register_backend(Backend(**{**cpu.__dict__, "source_suffix": ".c"}))
        assert backend_for("c") is custom
    finally:
        register_backend(cpu)
    assert backend_for("c") is cpu
