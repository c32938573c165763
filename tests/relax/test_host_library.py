"""export_library on the CPU (tessera_tvm.target.cpu.host_library): one object per C source, kernels
with the precompiled prelude, objects kept in the kernel cache and checked before they are linked."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from tessera_tvm.errors import TesseraError, TesseraWarning
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
    # TVM's host code on its own; the kernels with the precompiled prelude first on their include
    # path: the attention kernel (a big source) alone, the five small ones as one translation unit
    # (one g++ and one prelude load for all five; test_small_kernels_compile_together... below).
    assert len(set(built.report.kernels)) == 6 and len(kernels) == 2, [c[-1] for c in objects]
    assert len(objects) == len(kernels) + 1
    assert not any(c[-1].endswith("devc.c") for c in compiles)
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


def _kernel(name: str, body: str, *, pragma: bool = False, absolute: bool = False) -> str:
    """A kernel source as TileLang's C codegen writes one (``absolute``: its prelude included by
    absolute path, as export_library hands it over), or as host_library compiles it."""
    from tessera_tvm.target.toolchain import tilelang_include_dirs

    spec = '#pragma GCC optimize("tree-loop-if-convert")\n' if pragma else ""
    prelude = f'"{tilelang_include_dirs()[0]}/tl_templates/cpp/common.h"' if absolute else "<tl_templates/cpp/common.h>"
    return (
        f"#include {prelude}\n{spec}\n"
        f'#ifdef __cplusplus\nextern "C"\n#endif\nint32_t {name}(int32_t x) {{\n{body}\n}}\n'
    )


def test_small_kernels_are_grouped_by_preamble_and_the_rest_compile_alone():
    from tessera_tvm.target.cpu.host_library import TOGETHER_MAX_BYTES, TOGETHER_PER_UNIT, _Source, _translation_units

    command = ("g++", "-O3")

    def unit(name, source, cmd=command):
        return _Source(cmd, source, ".cc", name)

    plain = [unit(f"k{i}", _kernel(f"k{i}", f"  return x + {i};")) for i in range(2 * TOGETHER_PER_UNIT + 3)]
    spec = [unit(f"s{i}", _kernel(f"s{i}", f"  return x * {i};", pragma=True)) for i in range(3)]
    defines = unit("d", _kernel("d", "#define TWICE(v) (2 * (v))\n  return TWICE(x);"))
    big = unit("big", _kernel("big", "  return x;" + " " * TOGETHER_MAX_BYTES))
    host = unit("host", "void* __tvm_ffi__library_ctx = 0;\n")
    other = unit("o", _kernel("o", "  return x;"), ("g++", "-O2"))
    units = _translation_units([*plain, *spec, defines, big, host, other], workers=2)
    names = sorted(sorted(m.stem for m in members) for members in units)
    # One preamble and one command per unit; a directive after the preamble (it would reach the next
    # source), a big source and TVM's host C alone; a group split between the workers.
    assert ["big"] in names and ["d"] in names and ["host"] in names and ["o"] in names
    assert sorted(s.stem for s in spec) in names
    plain_units = [u for u in names if u[0].startswith("k")]
    assert len(plain_units) == 2 and sorted(sum(plain_units, [])) == sorted(p.stem for p in plain)
    assert all(len(u) >= TOGETHER_PER_UNIT for u in plain_units)
    assert len(_translation_units(plain[: TOGETHER_PER_UNIT + 1], workers=2)) == 1  # too few to split
    # The same sources in another order form the same units (a second build finds their objects).
    again = _translation_units([other, host, big, defines, *reversed(spec), *reversed(plain)], workers=2)
    assert sorted(sorted(m.stem for m in members) for members in again) == names
    assert {tuple(m.stem for m in u) for u in again} == {tuple(m.stem for m in u) for u in units}


def test_kernels_that_clash_together_are_compiled_alone_and_both_work(own_cache, compiles, tmp_path):
    # Two kernels, each with a helper of the same name in an anonymous namespace: legal one by one,
    # a redefinition in one translation unit. The export still builds, from each alone.
    import ctypes

    from tessera_tvm.config import load_config
    from tessera_tvm.relax.build import export_options, host_library_flags

    sources = []
    for name, factor in (("triple", 3), ("quintuple", 5)):
        path = tmp_path / f"{name}.cc"
        helper = f"namespace {{ int32_t helper(int32_t v) {{ return {factor} * v; }} }}\n"
        path.write_text(_kernel(name, "  return helper(x);", absolute=True).replace("\n#ifdef", f"\n{helper}#ifdef", 1))
        sources.append(str(path))
    output = tmp_path / "clash.so"
    host_library.build_host_library(str(output), sources, export_options("cpu"), host_library_flags(load_config("cpu")))
    units = [c for c in compiles if "-c" in c]
    assert len(units) == 3  # together (rejected), then each alone
    library = ctypes.CDLL(str(output))
    assert library.triple(7) == 21 and library.quintuple(7) == 35


def test_tvms_host_c_compiles_in_pieces_that_define_each_function_once(
    cpu_block, own_cache, compiles, tmp_path, monkeypatch
):
    # The block's host C (~250 KB) in two pieces (a model's is the longest compile, in one g++
    # otherwise): each function in one piece, the library context defined in one and declared in the
    # other, and the library still runs the block right.
    monkeypatch.setattr(host_library, "HOST_PART_BYTES", 64 * 1024)
    monkeypatch.setattr(host_library.os, "cpu_count", lambda: 2)
    built, params = cpu_block
    _run(export_library(built.executable, tmp_path / "m.so", "cpu"), params)
    host = [c for c in compiles if "-c" in c and "-Dhalf=_Float16" in c]
    assert len(host) == 2, [c[-1] for c in host]


def test_host_c_is_split_only_where_its_layout_is_the_one_expected():
    from tessera_tvm.target.cpu.host_library import _host_parts

    guard = '#ifdef __cplusplus\nextern "C"\n#endif\n'

    def function(name, lines=2000):
        body = "".join(f"  v = v * 3 + {i};\n" for i in range(lines))
        return f"{guard}TVM_DLL int32_t __tvm_ffi_{name}(void* self_handle, void* args, int32_t n, void* r) {{\n{body}  return 0;\n}}\n"

    preamble = '#include "tvm/runtime/base.h"\nvoid* __tvm_ffi__library_ctx = NULL;\nstatic void* cached = NULL;\n'
    names = [f"f{i}" for i in range(6)]
    source = preamble + "\n".join(function(n, 2000 + 100 * i) for i, n in enumerate(names))
    parts = _host_parts(source, workers=2)
    assert parts is not None and len(parts) == 2
    assert sum(p.count("void* __tvm_ffi__library_ctx = NULL;") for p in parts) == 1
    assert sum(p.count("extern void* __tvm_ffi__library_ctx;") for p in parts) == 1
    assert all(p.count("static void* cached = NULL;") == 1 for p in parts)  # each piece its own cache
    for name in names:  # each function defined once, whole
        assert sum(p.count(f"__tvm_ffi_{name}(") for p in parts) == 1
    assert abs(len(parts[0]) - len(parts[1])) < len(source) // 4  # balanced by size
    assert _host_parts(source, workers=2) == parts  # the same pieces every time: their objects are reused
    assert _host_parts(source, workers=1) is None
    assert _host_parts(preamble + function("small", 10), workers=2) is None  # too small to split
    # Anything else at the top level after the preamble: compiled whole.
    assert _host_parts(source + "static int helper(void) { return 1; }\n", workers=2) is None
    assert _host_parts(source.replace("void* __tvm_ffi__library_ctx = NULL;", ""), workers=2) is None


def test_tvms_host_c_takes_the_optimisation_level_asked_for_and_the_kernels_keep_the_configs(
    cpu_block, own_cache, compiles, tmp_path, monkeypatch
):
    """TESSERA_HOST_C_OPT (the suite sets -O0) changes only TVM's host C; unset, everything is
    compiled with the config's -O3 and still gives the block's values."""
    built, params = cpu_block

    def levels(command: list[str]) -> list[str]:
        return [a for a in command if re.fullmatch(r"-O[0-3sg]", a)]

    for wanted, host_last in (("-O0", "-O0"), ("", "-O3")):
        monkeypatch.setenv(host_library.HOST_OPT_ENV, wanted)
        compiles.clear()
        _run(export_library(built.executable, tmp_path / (wanted or "default") / "m.so", "cpu"), params)
        objects = [c for c in compiles if "-c" in c and not c[-1].endswith("imports.S")]
        kernels = [c for c in objects if any(a.endswith(".gch") or "/pch/" in a for a in c)]
        (host,) = [c for c in objects if c not in kernels]
        assert levels(host)[-1] == host_last, host  # the last -O on a g++ line wins
        # compiled by the first export, at the config's level; the second reuses them: same command
        assert all(levels(c)[-1] == "-O3" for c in kernels) and bool(kernels) == (wanted == "-O0")
    monkeypatch.setenv(host_library.HOST_OPT_ENV, "-O9")
    with pytest.raises(TesseraError, match=r"TESSERA_HOST_C_OPT='-O9': expected an optimisation level"):
        export_library(built.executable, tmp_path / "bad" / "m.so", "cpu")


def test_an_objects_sha256_is_in_the_cache_before_the_object(own_cache, monkeypatch):
    """Another process building a model with the same kernel takes an object without its SHA-256 for
    damaged and removes it; the SHA-256 must be there first (a CI run's link failed with "cannot
    find ... .o" when two xdist workers built the same kernel)."""
    import os

    unit = host_library._Source(
        (host_library.require_tool("g++"), "-fPIC", "-x", "c++"), "int f(int x) { return x + 1; }\n", ".c", "f"
    )
    target = own_cache / "objects" / "ab" / "abcdef.o"
    moved: list[bool] = []
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst) == target:  # the object moving into place: its SHA-256 is already beside it
            checksum = _checksum_of(target)
            moved.append(checksum.is_file() and checksum.read_text().strip() == toolchain.sha256_file(src))
        return real_replace(src, dst)

    monkeypatch.setattr(host_library.os, "replace", replace)
    host_library._compile(unit, target, own_cache / "objects")
    assert moved == [True] and host_library._intact(target)
