# ruff: noqa: F821, F722  (Tensor["M", "K", ...] dims are strings, not names)
"""Clean failures of the toolchain: g++ / nvcc failing or missing.

``TESSERA_CXX`` / ``TESSERA_NVCC`` point at a fake compiler that prints an error and exits 1, or at
a path that does not exist. The error must name the command that failed and carry its output; the
out_dir must hold nothing from the failed compile (no source without its library), the kernel cache
no entry; and the next compile, with the real toolchain, must work.
"""

# No `from __future__ import annotations`: the kernel annotates with module-level dtypes.

import shutil
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops
from tests.programs import gemm as programs

from .test_bad_input import assert_clean

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

FAKE = """#!/bin/sh
echo "fake-compiler: error: simulated failure (args: $*)" >&2
echo "fake-compiler: more output on stdout"
exit 1
"""


@pytest.fixture
def fake_compiler(tmp_path):
    path = tmp_path / "bin" / "fake-cc"
    path.parent.mkdir()
    path.write_text(FAKE)
    path.chmod(0o755)
    return path


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private, empty kernel cache; the in-memory cache of ts.compile is cleared around the test."""
    from tessera.compiler import clear_cache

    root = tmp_path / "cache"
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(root))
    monkeypatch.delenv("TESSERA_DISABLE_CACHE", raising=False)
    clear_cache()
    yield root
    clear_cache()


def cache_entries(root: Path) -> list[Path]:
    """Every file under the cache root (entries, staging or trash directories alike), but the crash
    captures a failure leaves on purpose in ``repro/`` (tessera_tvm.capture) and the empty files
    that serialise compiles of one key across processes in ``locks/`` (tessera_tvm.cache)."""
    if not root.exists():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] not in ("repro", "locks"))


def files(out: Path) -> list[str]:
    return (
        sorted(str(p.relative_to(out.parent)) for p in out.parent.rglob("*") if p.is_file())
        if out.parent.exists()
        else []
    )


@ts.kernel
def linear(A: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]):
    return ops.relu(ops.matmul(A, W) + b)


def _arrays():
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((33, 17)).astype(np.float32),
        rng.standard_normal((17, 9)).astype(np.float32),
        rng.standard_normal(9).astype(np.float32),
    )


@pytest.mark.parametrize("how", ["fails", "missing"])
def test_gxx_failure_in_lower_leaves_nothing_behind(tmp_path, monkeypatch, cache_dir, fake_compiler, how):
    out = tmp_path / "out" / "gemm"
    (out.parent).mkdir()
    program = programs.cpu_gemm(61, 37, 29)
    monkeypatch.setenv("TESSERA_CXX", str(fake_compiler) if how == "fails" else str(tmp_path / "no" / "g++"))
    with pytest.raises(tessera_tvm.ToolchainError) as info:
        tessera_tvm.lower(program, "cpu", out_dir=out)
    if how == "fails":
        assert_clean(info.value, str(fake_compiler), "exit code 1", "simulated failure", "-shared", str(out))
        assert "more output on stdout" in info.value.output
    else:
        assert isinstance(info.value, tessera_tvm.errors.ToolchainMissingError)
        assert_clean(info.value, "TESSERA_CXX", str(tmp_path / "no" / "g++"))
    assert files(out) == [], f"a failed compile left files behind: {files(out)}"
    assert cache_entries(cache_dir) == [], "a failed compile left a kernel-cache entry"

    monkeypatch.delenv("TESSERA_CXX")
    low = tessera_tvm.lower(program, "cpu", out_dir=out)
    assert Path(low.artifacts["library"]).parent == out and Path(low.artifacts["library"]).is_file()
    a = np.random.default_rng(1).standard_normal((61, 29)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((29, 37)).astype(np.float32)
    c = np.zeros((61, 37), np.float32)
    low(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    assert cache_entries(cache_dir), "the successful compile was not cached"


def test_gxx_failure_in_ts_compile_then_recovery(tmp_path, monkeypatch, cache_dir, fake_compiler):
    dump = tmp_path / "dump"
    monkeypatch.setenv("TESSERA_CXX", str(fake_compiler))
    compiled = ts.compile(linear, target="cpu", dump=["target"], dump_dir=dump)
    with pytest.raises(tessera_tvm.ToolchainError) as info:
        compiled(*_arrays())
    assert_clean(info.value, str(fake_compiler), "simulated failure")
    leftovers = [p for p in dump.rglob("*") if p.is_file()] if dump.exists() else []
    assert not [p for p in leftovers if p.suffix in (".so", ".cpp")], leftovers
    assert cache_entries(cache_dir) == []

    monkeypatch.delenv("TESSERA_CXX")
    # The same CompiledKernel and a fresh ts.compile both work now (nothing failed was cached).
    for k in (compiled, ts.compile(linear, target="cpu")):
        out = k(*_arrays())
        np.testing.assert_allclose(out, linear.reference(*_arrays()), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("how", ["fails", "missing"])
def test_nvcc_failure(tmp_path, monkeypatch, cache_dir, fake_compiler, how):
    out = tmp_path / "out" / "gemm"
    (out.parent).mkdir()
    program = programs.gemm(256, 256, 128)
    if how == "fails":
        monkeypatch.setenv("TESSERA_NVCC", str(fake_compiler))
        with pytest.raises(tessera_tvm.ToolchainError) as info:
            tessera_tvm.lower(program, "hopper", out_dir=out)
        assert_clean(info.value, str(fake_compiler), "simulated failure", "sm_90a")
        assert files(out) == [], f"a failed compile left files behind: {files(out)}"
        assert cache_entries(cache_dir) == []
    else:
        # Documented: without nvcc the CUDA source is the artifact and a note says why there is no cubin.
        monkeypatch.setenv("TESSERA_NVCC", str(tmp_path / "no" / "nvcc"))
        low = tessera_tvm.lower(program, "hopper", out_dir=out)
        assert "cubin" not in low.artifacts and Path(low.artifacts["source"]).is_file()
        assert any("nvcc" in n and "TESSERA_NVCC" in n for n in low.notes), low.notes
    monkeypatch.delenv("TESSERA_NVCC")
    low = tessera_tvm.lower(program, "hopper", out_dir=out)  # the real nvcc, or none: sources only
    assert Path(low.artifacts["source"]).is_file()
    from tessera_tvm.target.cuda import nvcc_available

    assert ("cubin" in low.artifacts) == nvcc_available()
