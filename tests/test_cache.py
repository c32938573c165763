"""The persistent kernel cache: keys, integrity, atomic concurrent writers."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

import tessera_tvm
from tessera_tvm import cache as cache_mod
from tessera_tvm._tvm import tvm
from tessera_tvm.cache import KernelCache, cache_key
from tests.programs import gemm as programs


@pytest.fixture(scope="module")
def program():
    return tvm.IRModule({"main": programs.gemm(256, 256, 256, 64, 64, 32, stages=2)})


def _files(tmp_path: Path, text: str = "kernel source") -> dict[str, Path]:
    src = tmp_path / "k.cu"
    src.write_text(text)
    meta = tmp_path / "metadata.json"
    meta.write_text("[]\n")
    return {"source": src, "metadata": meta}


def test_key_depends_on_program_config_build_and_versions(program, monkeypatch):
    hopper, ampere = tessera_tvm.load_config("hopper"), tessera_tvm.load_config("ampere")
    key = cache_key(program, hopper, build=True)
    assert key == cache_key(program, hopper, build=True)
    assert key != cache_key(program, ampere, build=True)
    assert key != cache_key(program, hopper, build=False)
    other = tvm.IRModule({"main": programs.gemm(256, 256, 512, 64, 64, 32, stages=2)})
    assert key != cache_key(other, hopper, build=True)
    real = cache_mod.versions
    monkeypatch.setattr(cache_mod, "versions", lambda cfg: {**real(cfg), "tilelang": "0.1.16"})
    assert key != cache_key(program, hopper, build=True)


def test_store_then_load_round_trips(tmp_path):
    cache = KernelCache(tmp_path / "cache")
    stored = cache.store("ab" * 32, {"name": "k"}, _files(tmp_path))
    loaded = cache.load("ab" * 32)
    assert loaded is not None and stored is not None
    assert loaded.record["name"] == "k"
    assert loaded.files["source"].read_text() == "kernel source"
    assert cache.load("cd" * 32) is None


def test_corrupted_entry_is_removed_not_loaded(tmp_path):
    cache = KernelCache(tmp_path / "cache")
    entry = cache.store("ab" * 32, {"name": "k"}, _files(tmp_path))
    entry.files["source"].write_text("tampered")
    assert cache.load("ab" * 32) is None
    assert not entry.path.exists()


def test_truncated_manifest_is_a_miss(tmp_path):
    cache = KernelCache(tmp_path / "cache")
    entry = cache.store("ab" * 32, {"name": "k"}, _files(tmp_path))
    (entry.path / "manifest.json").write_text('{"files": ')
    assert cache.load("ab" * 32) is None


def test_disabled_cache_never_stores(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")
    cache = KernelCache.from_env()
    assert not cache.enabled
    assert cache.store("ab" * 32, {}, _files(tmp_path)) is None and cache.load("ab" * 32) is None


def test_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.delenv("TESSERA_DISABLE_CACHE", raising=False)
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "here"))
    assert KernelCache.from_env().root == tmp_path / "here"


def _writer(args):
    root, workdir, index = args
    cache = KernelCache(root)
    files = _files(Path(workdir) / str(index), text="same kernel")
    for _ in range(20):
        entry = cache.store("ee" * 32, {"writer": index}, files)
        assert entry is not None and entry.files["source"].read_text() == "same kernel"
    return True


def test_concurrent_writers_both_succeed(tmp_path):
    for i in range(4):
        (tmp_path / "work" / str(i)).mkdir(parents=True)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_writer, [(tmp_path / "cache", tmp_path / "work", i) for i in range(4)])
    assert all(results)
    entry = KernelCache(tmp_path / "cache").load("ee" * 32)
    assert entry is not None
    leftovers = [p.name for p in entry.path.parent.iterdir() if p.name != entry.path.name]
    assert leftovers == [], f"staging or trash directories left behind: {leftovers}"
    assert json.loads((entry.path / "manifest.json").read_text())["key"] == "ee" * 32
