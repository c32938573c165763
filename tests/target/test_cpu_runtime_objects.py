"""With ``TESSERA_CPU_RUNTIME=linked`` (the suite's setting, tests/conftest.py), Tessera's CPU runtime
entries (tessera/cpu.h's packing, GEMM and convolution micro-kernels) are compiled once per flag set
into the runtime objects and linked into the kernels that call them; the kernels are compiled against
cpu_api.h's declarations (tessera_tvm.target.cpu.build.runtime_link). The default compiles them inline."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

import tessera_tvm
import tessera_tvm.cache
from tessera_tvm.errors import TesseraError, ToolchainError
from tessera_tvm.target.cpu import build as cpu_build
from tessera_tvm.target.toolchain import find_tool
from tessera_tvm.tile import EpilogueOp, GemmSpec, build_tile_program
from tests.tile.conftest import assert_close, random_inputs, run_cpu
from tests.tile.test_gemm import reference

API = cpu_build.RUNTIME_INCLUDE_DIR / "tessera" / "cpu_api.h"
SPEC = GemmSpec(40, 48, 24, dtype_a="float32", epilogue=(EpilogueOp("bias", operand="bias"), EpilogueOp("gelu_erf")))


def _declared() -> set[str]:
    """The entries cpu_api.h declares, without their ``tessera_cpu_`` prefix."""
    return set(re.findall(r"\btessera_cpu_(\w+)\(", API.read_text()))


def _defined(obj) -> set[str]:
    """The ``tessera_cpu_*`` functions an object defines (strong or merged), without the prefix."""
    listing = subprocess.run(["nm", "--defined-only", str(obj)], capture_output=True, text=True, check=True).stdout
    return {m.group(1) for m in re.finditer(r" [TW] tessera_cpu_(\w+)$", listing, re.M)}


def _flags():
    return tuple(tessera_tvm.load_config("cpu").codegen_dict["flags"])


def test_every_declared_entry_is_in_the_object_a_kernel_that_calls_it_links():
    # A kernel links the objects runtime_parts names for the entries it calls: each declared entry
    # must be defined there, and every entry an object defines must be declared (a kernel would not
    # see it otherwise).
    cxx, flags = find_tool("g++"), _flags()
    objects = {part: cpu_build.runtime_object(cxx, flags, part) for part in cpu_build.RUNTIME_PARTS}
    assert None not in objects.values(), objects
    defined = {part: _defined(obj) for part, obj in objects.items()}
    declared = _declared()
    assert len(declared) >= 30
    assert set().union(*defined.values()) == declared
    for name in sorted(declared):
        (part,) = cpu_build.runtime_parts(f"x = tessera_cpu_{name}(a, b);")
        assert name in defined[part], f"tessera_cpu_{name} is not in the {part} object"
    assert cpu_build.runtime_parts("int32_t k(float* A) { return 0; }") == []


def test_a_generated_kernel_is_compiled_against_the_declarations_and_links_the_gemm_object(monkeypatch, tmp_path):
    monkeypatch.setenv(cpu_build.RUNTIME_ENV, "linked")
    commands = []
    real_run = cpu_build.run_tool
    monkeypatch.setattr(
        cpu_build, "run_tool", lambda command, **kw: commands.append(command) or real_run(command, **kw)
    )
    inputs = random_inputs(SPEC, np.random.default_rng(0))
    got = run_cpu(SPEC, inputs, "cpu", tmp_path)
    assert_close(got["C"], reference(SPEC, inputs), "float32", atol_scale=4)
    (kernel,) = [c for c in commands if any(str(a).endswith(".cpp") for a in c)]
    gemm = cpu_build.runtime_object(find_tool("g++"), _flags(), "gemm")
    assert cpu_build.RUNTIME_LINKED in kernel and str(gemm) in kernel
    assert not any(str(a).endswith(("_conv.o", "_winograd.o", "_int8.o")) for a in kernel)  # only what it calls
    library = next(tmp_path.rglob("*.so"))
    exported = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
    assert "tessera_cpu_" not in exported  # hidden: another library's copy never stands in for this one's


def test_by_default_kernels_compile_the_entries_inline_and_the_mode_is_in_the_cache_key(monkeypatch):
    cxx, flags = find_tool("g++"), _flags()
    source = tessera_tvm.lower(build_tile_program(SPEC, None, "c"), "cpu", build=False).source
    monkeypatch.setenv(cpu_build.RUNTIME_ENV, "linked")
    assert cpu_build.runtime_link(cxx, flags, source)[0] == cpu_build.RUNTIME_LINKED
    linked = tessera_tvm.cache.versions(tessera_tvm.load_config("cpu"))
    monkeypatch.delenv(cpu_build.RUNTIME_ENV)
    assert cpu_build.runtime_mode() == "inline" and cpu_build.runtime_link(cxx, flags, source) == []
    inline = tessera_tvm.cache.versions(tessera_tvm.load_config("cpu"))
    assert inline != linked and {k for k in inline if inline[k] != linked[k]} == {"isa"}
    monkeypatch.setenv(cpu_build.RUNTIME_ENV, "static")
    with pytest.raises(
        TesseraError, match=r"TESSERA_CPU_RUNTIME='static': expected 'inline' \(the default\) or 'linked'"
    ):
        cpu_build.runtime_link(cxx, flags, source)


def test_without_a_cache_a_kernel_compiles_the_entries_itself(monkeypatch, tmp_path):
    monkeypatch.setenv(cpu_build.RUNTIME_ENV, "linked")
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")
    monkeypatch.delenv("TESSERA_PCH_DIR", raising=False)
    assert cpu_build.runtime_object(find_tool("g++"), _flags(), "gemm") is None
    source = tessera_tvm.lower(build_tile_program(SPEC, None, "c"), "cpu", build=False).source
    assert cpu_build.runtime_link(find_tool("g++"), _flags(), source) == []
    inputs = random_inputs(SPEC, np.random.default_rng(1))
    assert_close(run_cpu(SPEC, inputs, "cpu", tmp_path)["C"], reference(SPEC, inputs), "float32", atol_scale=4)


def test_a_damaged_runtime_object_is_rebuilt_not_linked(monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_PCH_DIR", str(tmp_path / "pch"))
    cxx, flags = find_tool("g++"), _flags()
    obj = cpu_build.runtime_object(cxx, flags, "int8")
    intact = obj.read_bytes()
    obj.write_bytes(intact[: len(intact) // 2])  # cut short, as by a full disk
    cpu_build._intact_preludes.clear()  # a new process: nothing verified yet
    assert cpu_build.runtime_object(cxx, flags, "int8") == obj
    assert obj.read_bytes() == intact  # rebuilt; g++ gives the same bytes for the same source
    leftovers = sorted(p.name for p in obj.parent.iterdir() if p.name not in (obj.name, obj.name + ".sha256"))
    assert leftovers == [], f"staging files left behind: {leftovers}"


def test_a_declaration_that_no_longer_matches_its_definition_fails_the_objects_build(monkeypatch, tmp_path):
    include = tmp_path / "include"
    shutil.copytree(cpu_build.RUNTIME_INCLUDE_DIR, include)
    api = include / "tessera" / "cpu_api.h"
    text = api.read_text()
    wrong = re.sub(r"(tessera_cpu_pack_b_s8x4\([^;]*?)int32_t depth\)", r"\1int64_t depth)", text, count=1)
    assert wrong != text
    api.write_text(wrong)
    monkeypatch.setattr(cpu_build, "RUNTIME_INCLUDE_DIR", include)
    cxx, flags = find_tool("g++"), _flags()
    obj = tmp_path / "out" / "tessera_cpu_int8.o"
    with pytest.raises(ToolchainError, match="tessera_cpu_pack_b_s8x4"):
        cpu_build._build_runtime_object(cxx, flags, cpu_build.precompiled_prelude(cxx, flags), "cpu_int8.h", obj)
    assert not obj.exists() and sorted(p.name for p in obj.parent.iterdir()) == []
