"""The persistent kernel cache: keys, integrity, atomic concurrent writers."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
from pathlib import Path

import pytest

import tessera_tvm
from tessera_tvm import cache as cache_mod
from tessera_tvm._tvm import tvm
from tessera_tvm.cache import KernelCache, cache_key
from tessera_tvm.errors import TesseraWarning
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


def test_key_depends_on_tessera_code_and_kernel_headers(program, tmp_path, monkeypatch):
    """An edited pass or kernel header (same version number) must not be served an old entry."""
    hopper = tessera_tvm.load_config("hopper")
    keys = [cache_key(program, hopper, build=True)]
    root = tmp_path / "tessera_tvm"  # stands in for the installed package: its .py files and headers
    (root / "include" / "tessera").mkdir(parents=True)
    # tessera_tvm's directory is read from cache.py's own path (the cache does not import the package's facade)
    for module in (cache_mod, tessera_tvm.target, tessera_tvm.transform):
        monkeypatch.setattr(module, "__file__", str(root / "__init__.py"))
    monkeypatch.setattr(cache_mod, "_code_digest", cache_mod._code_digest.__wrapped__)  # not the per-process value
    header = root / "include" / "tessera" / "cpu.h"
    header.write_text("// v1\n")
    keys.append(cache_key(program, hopper, build=True))
    header.write_text("// v2\n")
    keys.append(cache_key(program, hopper, build=True))
    (root / "unique_shared_buffer_names.py").write_text("# a pass\n")
    keys.append(cache_key(program, hopper, build=True))
    assert len(set(keys)) == 4
    assert cache_key(program, hopper, build=True) == keys[-1]


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
    with pytest.warns(TesseraWarning, match="k.cu does not match its checksum"):
        assert cache.load("ab" * 32) is None
    assert not entry.path.exists()


def test_truncated_manifest_is_a_miss(tmp_path):
    cache = KernelCache(tmp_path / "cache")
    entry = cache.store("ab" * 32, {"name": "k"}, _files(tmp_path))
    (entry.path / "manifest.json").write_text('{"files": ')
    with pytest.warns(TesseraWarning, match="manifest.json is not a manifest"):
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


# --- tessera_tvm.lower through the cache ------------------------------------------------------


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("TESSERA_DISABLE_CACHE", raising=False)
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "kernels"))
    return tmp_path / "kernels"


def test_second_lower_is_served_from_the_cache(private_cache, tmp_path):
    import numpy as np

    prog = programs.cpu_gemm(96, 80, 40)
    first = tessera_tvm.lower(prog, "cpu")
    second = tessera_tvm.lower(programs.cpu_gemm(96, 80, 40), "cpu", out_dir=tmp_path / "out")
    assert not first.from_cache and second.from_cache
    assert second.source == first.source and second.metadata == first.metadata
    assert [r.name for r in second.pass_log] == [r.name for r in first.pass_log]
    assert second.artifacts["library"].parent == tmp_path / "out"
    assert list(second.artifacts) == list(first.artifacts)  # in the order written, not sorted
    a = np.ones((96, 40), np.float32)
    b = np.ones((40, 80), np.float32)
    c = np.zeros((96, 80), np.float32)
    second(a, b, c)
    assert np.all(c == 40.0)


def test_a_build_after_a_look_at_the_source_runs_only_the_toolchain(private_cache, monkeypatch):
    import numpy as np

    lower_module = importlib.import_module("tessera_tvm.lower")
    passes_ran = []
    real = lower_module._lower
    monkeypatch.setattr(lower_module, "_lower", lambda *a, **k: passes_ran.append(1) or real(*a, **k))
    looked = tessera_tvm.lower(programs.cpu_gemm(48, 40, 24), "cpu", build=False)
    assert "library" not in looked.artifacts and len(passes_ran) == 1
    built = tessera_tvm.lower(programs.cpu_gemm(48, 40, 24), "cpu")  # the passes' result from the cache
    assert len(passes_ran) == 1 and not built.from_cache  # g++ ran for it
    assert built.source == looked.source and built.artifacts["library"].is_file()
    a, b, c = np.ones((48, 24), np.float32), np.ones((24, 40), np.float32), np.zeros((48, 40), np.float32)
    built(a, b, c)
    assert np.all(c == 24.0)
    assert tessera_tvm.lower(programs.cpu_gemm(48, 40, 24), "cpu").from_cache  # the built entry from then on
    # The other way: a look after a build takes the built entry's lowering and leaves its library.
    first = tessera_tvm.lower(programs.cpu_gemm(32, 40, 24), "cpu")
    again = tessera_tvm.lower(programs.cpu_gemm(32, 40, 24), "cpu", build=False)
    assert len(passes_ran) == 2 and again.source == first.source and "library" not in again.artifacts
    assert first.artifacts["library"].is_file()


def test_a_cpu_kernel_for_another_cpus_instructions_is_a_miss(private_cache, monkeypatch):
    # -march=native: the same config builds other code on another CPU, so a cache shared by two
    # machines (or copied from one) must not serve this one a kernel with instructions it lacks.
    from tessera_tvm.target.cpu import build as cpu_build

    prog = programs.cpu_gemm(64, 48, 32)
    first = tessera_tvm.lower(prog, "cpu")
    here = cpu_build.instruction_sets(cpu_build.DEFAULT_CPU_FLAGS)
    assert first.metadata[0]["instruction_sets"] == list(here)  # what the library may execute
    assert tessera_tvm.lower(prog, "cpu").from_cache
    real = cpu_build._macros_of

    def without_avx512(flags, compiler):  # the same g++ on a CPU of x86-64-v3's level (AVX2, no AVX-512)
        return real(tuple("-march=x86-64-v3" if f == "-march=native" else f for f in flags), compiler)

    monkeypatch.setattr(cpu_build, "_macros_of", without_avx512)
    other = tessera_tvm.lower(prog, "cpu")
    assert not other.from_cache
    assert "avx512f" not in other.metadata[0]["instruction_sets"]
    assert tessera_tvm.lower(prog, "cpu").from_cache  # that CPU's own entry, from then on


def test_config_change_is_a_miss(private_cache):
    prog = programs.gemm(256, 256, 256, 64, 64, 32, stages=2)
    tessera_tvm.lower(prog, "hopper", build=False)
    assert not tessera_tvm.lower(prog, "ampere", build=False).from_cache
    assert tessera_tvm.lower(prog, "ampere", build=False).from_cache


def test_version_change_is_a_miss(private_cache, monkeypatch):
    prog = programs.gemm(256, 256, 256, 64, 64, 32, stages=2)
    tessera_tvm.lower(prog, "rocm")
    real = cache_mod.versions
    monkeypatch.setattr(cache_mod, "versions", lambda cfg: {**real(cfg), "tessera": "9.9.9"})
    assert not tessera_tvm.lower(prog, "rocm").from_cache


def test_corrupted_entry_is_recompiled(private_cache):
    prog = programs.cpu_gemm(64, 64, 32)
    first = tessera_tvm.lower(prog, "cpu")
    # Replace the file rather than write into it: this process has the library mapped, and truncating
    # a mapped file makes the next touch of its pages a SIGBUS (at the latest, at interpreter exit).
    library = first.artifacts["library"]
    damaged = library.with_name(library.name + ".damaged")
    damaged.write_bytes(b"not a shared library")
    os.replace(damaged, library)
    with pytest.warns(TesseraWarning, match="damaged"):
        again = tessera_tvm.lower(prog, "cpu")
    assert not again.from_cache  # the damaged entry failed its checksum and was rebuilt
    assert tessera_tvm.lower(prog, "cpu").from_cache


def test_dump_dir_bypasses_the_cache(private_cache, tmp_path):
    prog = programs.elementwise_add(128, 64)
    tessera_tvm.lower(prog, "hopper", build=False)
    dumped = tessera_tvm.lower(prog, "hopper", build=False, dump_dir=tmp_path / "dump")
    assert not dumped.from_cache and (tmp_path / "dump" / "timing.txt").is_file()


def test_disabled_cache_lowers_every_time(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")
    prog = programs.elementwise_add(128, 64)
    tessera_tvm.lower(prog, "rocm")
    assert not tessera_tvm.lower(prog, "rocm").from_cache


@pytest.mark.nvcc
def test_gpu_binaries_are_built_and_cached_without_out_dir(private_cache):
    prog = programs.gemm(256, 256, 256, 64, 64, 32, stages=2)
    first = tessera_tvm.lower(prog, "ampere")
    assert first.artifacts["cubin"].is_file() and str(private_cache) in str(first.artifacts["cubin"])
    second = tessera_tvm.lower(prog, "ampere")
    assert second.from_cache and second.artifacts["cubin"].read_bytes() == first.artifacts["cubin"].read_bytes()
    assert second.metadata[0]["resources"]["regs_per_thread"] > 0


# --- what the key covers beyond the program (issue #13) -----------------------------------------


def test_key_covers_the_pass_context(program):
    hopper = tessera_tvm.load_config("hopper")
    plain = cache_key(program, hopper, build=False)
    assert cache_key(program, hopper, build=False) == plain
    contexts = [
        tvm.transform.PassContext(config={"tl.disable_tma_lower": True}),
        tvm.transform.PassContext(config={"tl.disable_tma_lower": False}),
        tvm.transform.PassContext(disabled_pass=["tl.Simplify"]),
        tvm.transform.PassContext(required_pass=["tl.Simplify"]),
        tvm.transform.PassContext(opt_level=3),
    ]
    keys = set()
    for ctx in contexts:
        with ctx:
            keys.add(cache_key(program, hopper, build=False))
    assert plain not in keys and len(keys) == len(contexts)


def test_an_edit_of_the_shared_pipeline_changes_the_fingerprint(monkeypatch):
    """`lower_and_legalize: shared` names another file: the fingerprint covers what it expands to."""
    from tessera_tvm import config_pipeline

    before = tessera_tvm.load_config("hopper")
    real = config_pipeline.packaged

    def edited(name):
        found = real(name)
        if name != config_pipeline.SHARED_LISTS["lower_and_legalize"]:
            return found
        text, source = found
        return text.replace("  - tl.InjectAssumes\n", ""), source

    monkeypatch.setattr(config_pipeline, "packaged", edited)
    after = tessera_tvm.load_config("hopper")
    assert "tl.InjectAssumes" in tessera_tvm.pass_names(before)
    assert "tl.InjectAssumes" not in tessera_tvm.pass_names(after)  # not the in-process copy of the old list
    assert after.raw == before.raw and after.fingerprint() != before.fingerprint()


def test_a_pass_config_is_a_miss_and_is_honoured(private_cache):
    """As `@tilelang.jit(pass_configs=...)` passes them: under PassContext(config=...)."""
    prog = programs.gemm(256, 256, 256, 64, 64, 32, stages=2)
    with_tma = tessera_tvm.lower(prog, "hopper", build=False)
    with tvm.transform.PassContext(config={"tl.disable_warp_specialized": True}):
        without = tessera_tvm.lower(prog, "hopper", build=False)
        assert tessera_tvm.lower(prog, "hopper", build=False).from_cache
    assert not without.from_cache
    assert "tma_load" in with_tma.source and "tma_load" not in without.source
    assert tessera_tvm.lower(prog, "hopper", build=False).source == with_tma.source


def test_disabled_passes_are_a_miss(private_cache):
    prog = programs.cpu_gemm(256, 192, 128)  # 12 blocks: a parallel grid
    parallel = tessera_tvm.lower(prog, "cpu", build=False)
    with tvm.transform.PassContext(disabled_pass=["tessera.LowerParallelGrid", "tessera.ImportCpuRuntime"]):
        serial = tessera_tvm.lower(prog, "cpu", build=False)
    assert not serial.from_cache
    assert "TESSERA_PARALLEL_BEGIN" in parallel.source and "TESSERA_PARALLEL_BEGIN" not in serial.source


def test_instruments_bypass_the_lookup(private_cache):
    from tvm.ir.instrument import pass_instrument

    seen = []

    @pass_instrument
    class Names:
        def run_after_pass(self, mod, info):
            seen.append(info.name)

    prog = programs.elementwise_add(128, 64)
    tessera_tvm.lower(prog, "rocm", build=False)
    with tvm.transform.PassContext(instruments=[Names()]):
        observed = tessera_tvm.lower(prog, "rocm", build=False)
    assert not observed.from_cache and "tl.LayoutInference" in seen


def test_artifacts_without_a_home_are_removed_when_the_process_exits(tmp_path, monkeypatch):
    # No out_dir and no cache: the library goes to a scratch directory, one per compile, which a
    # long-running process must not leave behind in the temporary directory.
    from tessera_tvm import kernel_store

    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")
    monkeypatch.setattr(kernel_store, "_SCRATCH", [])
    monkeypatch.setattr(kernel_store.tempfile, "tempdir", str(tmp_path))
    lowered = tessera_tvm.lower(programs.elementwise_add(128, 64), "cpu")
    library = Path(lowered.artifacts["library"])
    assert library.is_file() and library.parent.parent == tmp_path
    kept = tessera_tvm.lower(programs.elementwise_add(128, 64), "cpu", out_dir=tmp_path / "mine")
    kernel_store._remove_scratch()  # what atexit runs
    assert not library.parent.exists()
    assert Path(kept.artifacts["library"]).is_file()  # a directory the user named stays
