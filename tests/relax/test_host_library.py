"""export_library on the CPU (tessera_tvm.target.cpu.host_library): one object per C source, kernels
with the precompiled prelude, objects kept in the kernel cache and checked before they are linked."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from tessera_tvm.errors import TesseraWarning
from tessera_tvm.relax.build import export_library
from tessera_tvm.target import toolchain
from tessera_tvm.target.cpu import host_library
from tessera_tvm.target.cpu.build import _checksum_of

from .models import block_inputs, block_reference


@pytest.fixture
def compiles(monkeypatch):
    """The g++ command lines the export runs (still run)."""
    seen: list[list[str]] = []
    real = host_library.run_tool

    def counting(command, **kwargs):
        seen.append([str(c) for c in command])
        return real(command, **kwargs)

    monkeypatch.setattr(host_library, "run_tool", counting)
    return seen


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TESSERA_DISABLE_CACHE", raising=False)
    return tmp_path / "cache"


def _run(path, params):
    from tessera_tvm import tvm

    vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
    arrays = block_inputs(params)
    out = vm["forward"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    np.testing.assert_allclose(out, block_reference(*arrays), rtol=1e-4, atol=1e-4)


def test_each_source_is_an_object_and_a_second_export_only_links(cpu_block, own_cache, compiles, tmp_path, capfd):
    built, params = cpu_block
    capfd.readouterr()
    _run(export_library(built.executable, tmp_path / "a" / "m.so", "cpu"), params)
    err = capfd.readouterr().err  # progress of the build, on stderr
    started = re.search(r"tessera: compiling (\d+) object\(s\) of m\.so with g\+\+, \d+ at a time\n", err)
    finished = re.search(r"tessera: (\d+) object\(s\) compiled in [\d.]+ s\n", err)
    assert started and finished, err
    # The packed imports (the VM executable with its weights) are assembled from their bytes, not
    # compiled from TVM's hex C array (devc.c: ResNet-18's made g++ parse 235 MB).
    (packed,) = [c for c in compiles if c[-1].endswith("imports.S")]
    objects = [c for c in compiles if "-c" in c and c is not packed]
    kernels = [c for c in objects if any(a.endswith(".gch") or "/pch/" in a for a in c)]
    # TVM's host code and one source per Tessera kernel, each compiled on its own; the kernels find
    # the precompiled prelude first on their include path.
    assert len(objects) == len(set(built.report.kernels)) + 1, [c[-1] for c in objects]
    assert not any(c[-1].endswith("devc.c") for c in compiles)
    assert len(kernels) == len(set(built.report.kernels))
    assert int(started[1]) == int(finished[1]) == len(objects)
    assert all(not any(a.startswith("-Dhalf=") for a in c) for c in kernels)  # it would void the prelude
    assert len(list(own_cache.glob("objects/*/*.o"))) == len(objects)
    # Each compiles in a directory of its own under objects/, held while it runs: the cache's start-up
    # cleanup removes one whose process died (tests/test_cache_untrusted.py).
    staging = {Path(c[c.index("-o") + 1]).parent for c in objects}
    assert len(staging) == len(objects) and all(d.parent == own_cache / "objects" for d in staging)
    assert all(d.name.startswith(".") and not d.exists() for d in staging)
    compiles.clear()
    _run(export_library(built.executable, tmp_path / "b" / "m.so", "cpu"), params)
    # the imports assembled again (well under a second), then the link
    assert len(compiles) == 2 and compiles[0][-1].endswith("imports.S") and "-shared" in compiles[1]
    assert "tessera: compiling" not in capfd.readouterr().err  # nothing to compile, nothing said


def test_a_damaged_object_is_compiled_again_with_a_warning(cpu_block, own_cache, compiles, tmp_path):
    built, params = cpu_block
    export_library(built.executable, tmp_path / "a" / "m.so", "cpu")
    damaged = sorted(own_cache.glob("objects/*/*.o"), key=lambda p: p.stat().st_size)[-1]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    compiles.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run(export_library(built.executable, tmp_path / "b" / "m.so", "cpu"), params)
    assert len([c for c in compiles if "-c" in c and not c[-1].endswith("imports.S")]) == 1
    assert any(issubclass(w.category, TesseraWarning) and str(damaged) in str(w.message) for w in caught)
    assert toolchain.sha256_file(damaged) == _checksum_of(damaged).read_text().strip()


def test_without_a_cache_the_objects_stay_in_the_workspace(cpu_block, monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")
    built, params = cpu_block
    _run(export_library(built.executable, tmp_path / "m.so", "cpu"), params)


def test_export_library_and_export_options_have_the_upstream_set_ups_names():
    import tessera_tvm

    assert tessera_tvm.export_library is export_library
    assert tessera_tvm.export_options("cpu") == tessera_tvm.relax.export_options("cpu")
    assert "-fopenmp" in tessera_tvm.export_options("cpu")


def test_a_vm_loaded_from_a_scratch_library_leaves_no_file_behind(cpu_block, monkeypatch, tmp_path):
    # load_vm without a path exports to a scratch directory; once loaded the library stays mapped, so
    # the directory goes (it used to stay: one per build, 47 MB for ResNet-18, until /tmp filled).
    import tempfile

    from tessera_tvm import tvm
    from tessera_tvm.relax.build import load_vm

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    built, params = cpu_block
    vm = load_vm(built.executable, "cpu")
    assert list(tmp_path.iterdir()) == []
    arrays = block_inputs(params)
    out = vm["forward"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    np.testing.assert_allclose(out, block_reference(*arrays), rtol=1e-4, atol=1e-4)
    # A library given a path stays where it was asked to be.
    kept = tmp_path / "kept" / "m.so"
    vm = load_vm(built.executable, "cpu", path=kept)
    assert kept.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
    out = vm["forward"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    np.testing.assert_allclose(out, block_reference(*arrays), rtol=1e-4, atol=1e-4)
