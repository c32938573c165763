"""Tests of tessera_tvm.target.cpu: g++ builds of TileLang C output, run against numpy.

The TileLang kernels live in this file (not in exec'd strings) because @T.prim_func reads its
source with inspect.getsource. Each kernel is lowered and built once per module.
"""

# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations of prim_funcs.
import multiprocessing
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tessera_tvm._tvm import tilelang, tvm  # TileLang and its TVM, the one-TVM way
from tessera_tvm.errors import TesseraError, ToolchainError, ToolchainMissingError
from tessera_tvm.target.cpu import (
    DEFAULT_CPU_FLAGS,
    PRELUDE,
    PRELUDE_INCLUDE,
    ArgumentError,
    CpuKernel,
    KernelParam,
    KernelRuntimeError,
    ParamSpecError,
    compile_cpu,
    cpu_build_command,
    load_cpu_kernel,
    numpy_dtype,
    precompiled_prelude,
)
from tessera_tvm.target.toolchain import BuildOptionError, find_tool, run_tool

T = tilelang.language
Target = tvm.target.Target


def matmul(M, N, K, bm, bn, bk, dtype="float32", accum="float32"):
    """CPU tile program: alloc_local accumulator, scalar triple loop (CPU rules, DESIGN.md section 3)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm)) as (bx, by):
            C_l = T.alloc_local((bm, bn), accum)
            T.clear(C_l)
            for k in T.serial(T.ceildiv(K, bk)):
                for i, j, kk in T.grid(bm, bn, bk):
                    C_l[i, j] += A[by * bm + i, k * bk + kk] * B[k * bk + kk, bx * bn + j]
            T.copy(C_l, C[by * bm, bx * bn])

    return main


def lower_c(func) -> str:
    with Target("c") as target:
        return tilelang.lower(func, target=target).kernel_source


def fp32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def assert_matmul_close(C: np.ndarray, A: np.ndarray, B: np.ndarray) -> None:
    # float32 with a different summation order than BLAS: each of the K products carries ~1e-7
    # relative rounding, so the error grows like sqrt(K)..K * eps * |a||b|; with inputs in [-1, 1)
    # 1e-4 * (K / 256) bounds it comfortably while still catching an indexing bug (errors ~ 1).
    K = A.shape[1]
    ref = A.astype(np.float64) @ B.astype(np.float64)
    np.testing.assert_allclose(C, ref, rtol=1e-4, atol=1e-4 * max(1.0, K / 256))


RNG = np.random.default_rng(0)
STATIC_PARAMS = [
    KernelParam("A", "buffer", "float32", (256, 128)),
    KernelParam("B", "buffer", "float32", (128, 192)),
    KernelParam("C", "buffer", "float32", (256, 192)),
]
SYMBOLIC_PARAMS = [
    KernelParam("A", "buffer", "float32", ("M", 128)),
    KernelParam("B", "buffer", "float32", (128, 128)),
    KernelParam("C", "buffer", "float32", ("M", 128)),
    KernelParam("M", "scalar", "int32"),
]


@pytest.fixture(scope="module")
def static_gemm(tmp_path_factory) -> CpuKernel:
    src = lower_c(matmul(256, 192, 128, 64, 64, 32))
    assert 'extern "C"' in src and "main_kernel(float* A, float* B, float* C)" in src
    so = compile_cpu(src, out_dir=tmp_path_factory.mktemp("static"), name="gemm")
    return load_cpu_kernel(so, "main_kernel", STATIC_PARAMS)


@pytest.fixture(scope="module")
def symbolic_gemm(tmp_path_factory) -> CpuKernel:
    src = lower_c(matmul(T.dynamic("M"), 128, 128, 64, 64, 32))
    assert "int32_t M)" in src  # the symbolic dim becomes a trailing scalar parameter
    so = compile_cpu(src, out_dir=tmp_path_factory.mktemp("symbolic"), name="gemm_dyn")
    return load_cpu_kernel(so, "main_kernel", SYMBOLIC_PARAMS)


HANDWRITTEN = r"""
#include <stdint.h>
#include <string.h>
extern "C" int32_t axpy(float* x, float* y, int64_t n, float alpha) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  return 0;
}
extern "C" int32_t fail(float* x) { return 7; }
// bfloat16 is the top half of a float32: widen, add one, narrow (truncating).
extern "C" int32_t bf16_add_one(uint16_t* x, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    uint32_t bits = (uint32_t)x[i] << 16; float f; memcpy(&f, &bits, 4); f += 1.0f;
    memcpy(&bits, &f, 4); x[i] = (uint16_t)(bits >> 16);
  }
  return 0;
}
extern "C" int32_t small(float* x, int8_t n) { return n == 127 ? 0 : 1; }
"""


@pytest.fixture(scope="module")
def handwritten_so(tmp_path_factory) -> Path:
    return compile_cpu(HANDWRITTEN, out_dir=tmp_path_factory.mktemp("hand"), name="hand", flags=("-O2",))


# ------------------------------------------------------------------------------------ numerics


def test_static_gemm_matches_numpy(static_gemm):
    A, B = fp32(RNG.uniform(-1, 1, (256, 128))), fp32(RNG.uniform(-1, 1, (128, 192)))
    C = np.full((256, 192), np.nan, np.float32)
    assert static_gemm(A, B, C) is None
    assert_matmul_close(C, A, B)


@pytest.mark.parametrize("M", [1, 64, 100, 257])  # includes non-multiples of the 64-row tile
def test_symbolic_gemm_fills_M_from_shapes(symbolic_gemm, M):
    A, B = fp32(RNG.uniform(-1, 1, (M, 128))), fp32(RNG.uniform(-1, 1, (128, 128)))
    C = np.zeros((M, 128), np.float32)
    symbolic_gemm(A, B, C)  # M is not passed: it comes from A.shape[0]
    assert_matmul_close(C, A, B)


def test_symbolic_scalar_may_be_passed_if_consistent(symbolic_gemm):
    A, B, C = np.ones((3, 128), np.float32), np.ones((128, 128), np.float32), np.zeros((3, 128), np.float32)
    symbolic_gemm(A, B, C, M=3)
    assert (C == 128).all()
    with pytest.raises(ArgumentError, match=r"scalar 'M' is 4 but the arrays give M = 3 \(from A.shape\[0\]\)"):
        symbolic_gemm(A, B, C, M=4)


def test_handwritten_scalars(handwritten_so):
    axpy = load_cpu_kernel(
        handwritten_so,
        "axpy",
        [
            KernelParam("x", "buffer", "float32", ("n",)),
            KernelParam("y", "buffer", "float32", ("n",)),
            KernelParam("n", "scalar", "int64"),
            KernelParam("alpha", "scalar", "float32"),
        ],
    )
    x, y = np.arange(5, dtype=np.float32), np.ones(5, np.float32)
    axpy(x, y, alpha=2)
    np.testing.assert_array_equal(y, 1 + 2 * np.arange(5))
    with pytest.raises(ArgumentError, match=r"kernel 'axpy': missing scalar argument 'alpha' \(float32\)"):
        axpy(x, y)
    with pytest.raises(ArgumentError, match=r"unexpected keyword argument\(s\) 'beta'; scalar parameters: alpha, n"):
        axpy(x, y, alpha=1.0, beta=2.0)
    with pytest.raises(ArgumentError, match=r"scalar 'alpha' is a str \('2'\), expected a number \(float32\)"):
        axpy(x, y, alpha="2")
    with pytest.raises(ArgumentError, match=r"symbolic dim 'n' is 4 in y.shape\[0\] but 5 in x.shape\[0\]"):
        axpy(x, np.ones(4, np.float32), alpha=1.0)


def test_nonzero_return_code_raises(handwritten_so):
    fail = load_cpu_kernel(handwritten_so, "fail", [KernelParam("x", "buffer", "float32", (2,))])
    with pytest.raises(KernelRuntimeError, match=r"kernel 'fail' .* returned error code 7, expected 0"):
        fail(np.zeros(2, np.float32))


def test_bfloat16_buffers_use_ml_dtypes(handwritten_so):
    k = load_cpu_kernel(
        handwritten_so,
        "bf16_add_one",
        [KernelParam("x", "buffer", "bfloat16", ("n",)), KernelParam("n", "scalar", "int32")],
    )
    x = np.array([1.0, 2.5, -3.0], dtype=ml_dtypes.bfloat16)
    k(x)
    np.testing.assert_array_equal(x.astype(np.float32), [2.0, 3.5, -2.0])
    with pytest.raises(ArgumentError, match=r"'x' has dtype float32, expected bfloat16 \(use x.astype\(ml_dtypes"):
        k(np.zeros(3, np.float32))


def test_dim_that_does_not_fit_the_scalar_type(handwritten_so):
    k = load_cpu_kernel(
        handwritten_so,
        "small",
        [KernelParam("x", "buffer", "float32", ("n",)), KernelParam("n", "scalar", "int8")],
    )
    k(np.zeros(127, np.float32))
    with pytest.raises(ArgumentError, match=r"scalar 'n' is 128, which does not fit int8 \(\[-128, 127\]\)"):
        k(np.zeros(128, np.float32))


# ------------------------------------------------------------------------------ argument errors


def test_shape_mismatch(static_gemm):
    A, B, C = (
        np.zeros((256, 128), np.float32),
        np.zeros((128, 100), np.float32),
        np.zeros((256, 192), np.float32),
    )
    with pytest.raises(
        ArgumentError,
        match=r"kernel 'main_kernel': argument 'B' has shape \(128, 100\), expected \(128, 192\): dim 1 is 100, expected 192",
    ):
        static_gemm(A, B, C)


def test_symbolic_dims_must_agree(symbolic_gemm):
    A, B, C = (
        np.zeros((10, 128), np.float32),
        np.zeros((128, 128), np.float32),
        np.zeros((12, 128), np.float32),
    )
    with pytest.raises(
        ArgumentError, match=r"argument 'C' .* symbolic dim 'M' is 12 in C.shape\[0\] but 10 in A.shape\[0\]"
    ):
        symbolic_gemm(A, B, C)


def test_wrong_dtype(static_gemm):
    A = np.zeros((256, 128), np.float64)
    with pytest.raises(
        ArgumentError,
        match=r"argument 'A' has dtype float64, expected float32 \(use A.astype\(np.float32\)\)",
    ):
        static_gemm(A, np.zeros((128, 192), np.float32), np.zeros((256, 192), np.float32))


def test_wrong_rank(static_gemm):
    with pytest.raises(
        ArgumentError,
        match=r"argument 'A' has rank 1 \(shape \(32768,\)\), expected rank 2 \(shape \(256, 128\)\)",
    ):
        static_gemm(
            np.zeros(256 * 128, np.float32),
            np.zeros((128, 192), np.float32),
            np.zeros((256, 192), np.float32),
        )


def test_non_contiguous(static_gemm):
    B = np.zeros((192, 128), np.float32).T  # right shape, Fortran order
    with pytest.raises(ArgumentError, match=r"argument 'B' is not C-contiguous .*np.ascontiguousarray\(B\)"):
        static_gemm(np.zeros((256, 128), np.float32), B, np.zeros((256, 192), np.float32))


def test_not_an_array_and_wrong_count(static_gemm):
    with pytest.raises(
        ArgumentError,
        match=r"argument 'A' is a list, expected a numpy.ndarray of float32 with shape \(256, 128\)",
    ):
        static_gemm([[0.0]], np.zeros((128, 192), np.float32), np.zeros((256, 192), np.float32))
    with pytest.raises(ArgumentError, match=r"takes 3 arrays \(A, B, C\), got 2"):
        static_gemm(np.zeros((256, 128), np.float32), np.zeros((128, 192), np.float32))
    assert issubclass(ArgumentError, TesseraError) and issubclass(ArgumentError, TypeError)


# ------------------------------------------------------------------------------- build and load


def test_gxx_failure_raises_and_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ToolchainError) as info:
        compile_cpu('extern "C" int32_t k(float* x) { return x[0] +; }', out_dir=out, name="bad")
    msg = str(info.value)
    assert "failed (exit code 1)" in msg and "-std=c++17 -shared -fPIC -O3 -march=native" in msg and "bad.cpp" in msg
    assert "bad.cpp:1:" in msg and "error" in msg  # the compiler's first error
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no .so/.cpp, no staging dir


def test_missing_gxx(monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_CXX", str(tmp_path / "nonexistent-g++"))
    with pytest.raises(ToolchainMissingError, match="TESSERA_CXX"):
        compile_cpu("int x;", out_dir=tmp_path / "out", name="k")
    assert not (tmp_path / "out").exists()


def test_rebuild_at_same_path_is_reloaded(tmp_path):
    # glibc's dlopen would return the first library for a path it has already loaded.
    params = [KernelParam("x", "buffer", "int32", (1,))]
    x = np.zeros(1, np.int32)
    for value in (1, 2):
        so = compile_cpu(
            f'extern "C" int x_is(int* x) {{ x[0] = {value}; return 0; }}',
            out_dir=tmp_path,
            name="k",
            flags=(),
        )
        load_cpu_kernel(so, "x_is", params)(x)
        assert x[0] == value
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.cpp", "k.so"]


def test_load_errors(handwritten_so, tmp_path):
    with pytest.raises(ParamSpecError, match=r"symbol 'nope' not found in .*hand.so"):
        load_cpu_kernel(handwritten_so, "nope", [])
    with pytest.raises(ParamSpecError, match="does not exist"):
        load_cpu_kernel(tmp_path / "missing.so", "axpy", [])
    with pytest.raises(ParamSpecError, match="appears twice"):
        load_cpu_kernel(handwritten_so, "fail", [KernelParam("x", "buffer", "float32", (2,))] * 2)


def test_kernel_param_validation():
    assert KernelParam("A", "buffer", "float16", ["M", 8]).shape == ("M", 8)
    with pytest.raises(ParamSpecError, match="kind is 'tensor'"):
        KernelParam("A", "tensor", "float32", (1,))
    with pytest.raises(ParamSpecError, match="dtype 'float4' has no numpy equivalent"):
        KernelParam("A", "buffer", "float4", (1,))
    with pytest.raises(ParamSpecError, match=r"dims are ints >= 0 or symbol names"):
        KernelParam("A", "buffer", "float32", (-1,))
    with pytest.raises(ParamSpecError, match="scalar dtype 'float16' cannot be passed"):
        KernelParam("s", "scalar", "float16")
    with pytest.raises(ParamSpecError, match=r"a scalar has shape \(\)"):
        KernelParam("s", "scalar", "int32", (1,))


def test_numpy_dtypes():
    assert numpy_dtype("float32") == np.float32 and numpy_dtype("bool") == np.bool_
    assert numpy_dtype("bfloat16") == ml_dtypes.bfloat16
    assert numpy_dtype("float8_e4m3fn") == ml_dtypes.float8_e4m3fn
    assert numpy_dtype("float8_e5m2") == ml_dtypes.float8_e5m2


def test_flags_must_be_a_sequence(tmp_path):
    with pytest.raises(BuildOptionError, match="not a string"):
        compile_cpu("int x;", out_dir=tmp_path, name="k", flags="-O3")


# ------------------------------------------------------------------------------- precompiled prelude


@pytest.fixture(scope="module")
def small_gemm_source() -> str:
    """TileLang's C source of a 64^3 GEMM: it includes the prelude first."""
    return lower_c(matmul(64, 64, 64, 32, 32, 32))


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TESSERA_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("TESSERA_PCH_DIR", raising=False)  # the prelude in this cache, as users have it
    return tmp_path / "cache"


def test_prelude_is_precompiled_once_and_gcc_uses_it(fresh_cache, tmp_path, small_gemm_source):
    src = small_gemm_source
    assert src.lstrip().splitlines()[1] == PRELUDE_INCLUDE  # first after TileLang's comment: precompilable
    compile_cpu(src, out_dir=tmp_path / "a", name="gemm")
    (gch,) = fresh_cache.glob(f"pch/*/{PRELUDE}.gch")
    built = gch.stat().st_mtime_ns
    compile_cpu(src, out_dir=tmp_path / "b", name="gemm")
    assert gch.stat().st_mtime_ns == built  # reused, not rebuilt
    # g++ -H marks a precompiled header it read with "!" (and one it rejected with "x").
    prelude = precompiled_prelude(find_tool("g++"), DEFAULT_CPU_FLAGS)
    command = cpu_build_command(find_tool("g++"), DEFAULT_CPU_FLAGS, "h.so", "gemm.cpp", prelude)
    shown = run_tool([*command, "-H"], cwd=tmp_path / "b").stderr.splitlines()
    assert f"! {gch}" in shown


def test_prelude_gives_the_same_library(fresh_cache, tmp_path, monkeypatch, small_gemm_source):
    src = small_gemm_source
    with_prelude = compile_cpu(src, out_dir=tmp_path / "with", name="gemm").read_bytes()
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")
    assert precompiled_prelude(find_tool("g++"), DEFAULT_CPU_FLAGS) is None  # no cache, no prelude
    assert compile_cpu(src, out_dir=tmp_path / "without", name="gemm").read_bytes() == with_prelude


def test_damaged_prelude_is_rebuilt_not_used(fresh_cache, tmp_path, small_gemm_source):
    import tessera_tvm.target.cpu as cpu

    src = small_gemm_source
    compile_cpu(src, out_dir=tmp_path / "a", name="gemm")
    (gch,) = fresh_cache.glob(f"pch/*/{PRELUDE}.gch")
    # Flip bytes inside a GCC-valid header: GCC would crash on it (internal compiler error).
    data = bytearray(gch.read_bytes())
    for offset in range(len(data) // 2, len(data), 4099):
        data[offset] ^= 0x5A
    gch.write_bytes(bytes(data))
    cpu._intact_preludes.clear()  # a new process: nothing verified yet
    so = compile_cpu(src, out_dir=tmp_path / "b", name="gemm")
    assert gch.read_bytes() != bytes(data)  # rebuilt
    kernel = load_cpu_kernel(so, "main_kernel", [KernelParam(n, "buffer", "float32", (64, 64)) for n in "ABC"])
    A, B = RNG.standard_normal((64, 64), np.float32), RNG.standard_normal((64, 64), np.float32)
    C = np.zeros((64, 64), np.float32)
    kernel(A, B, C)
    assert_matmul_close(C, A, B)


def test_sources_without_the_prelude_do_not_build_it(fresh_cache, tmp_path):
    compile_cpu('extern "C" int f(int* x) { return 0; }', out_dir=tmp_path, name="k")
    assert not (fresh_cache / "pch").exists()


def _prelude_worker(cache_dir: str) -> str:
    os.environ["TESSERA_CACHE_DIR"] = cache_dir
    os.environ.pop("TESSERA_DISABLE_CACHE", None)
    os.environ.pop("TESSERA_PCH_DIR", None)
    return str(precompiled_prelude(find_tool("g++"), DEFAULT_CPU_FLAGS))


def test_two_processes_share_one_prelude(tmp_path):
    """Autotuning workers start together: one builds the prelude under the lock, the other waits."""
    cache = tmp_path / "cache"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        first, second = pool.map(_prelude_worker, [str(cache)] * 2)
    assert first == second != "None"
    (gch,) = cache.glob(f"pch/*/{PRELUDE}.gch")
    assert str(gch).startswith(first)
    leftovers = [p.name for p in gch.parent.iterdir() if p.name not in (gch.name, gch.name + ".sha256")]
    assert leftovers == [], f"staging files left behind: {leftovers}"


def test_caches_share_one_prelude_through_tessera_pch_dir(tmp_path, monkeypatch, small_gemm_source):
    """TESSERA_PCH_DIR: caches of their own (the test suite's) build the prelude once between them."""
    monkeypatch.delenv("TESSERA_DISABLE_CACHE", raising=False)
    monkeypatch.setenv("TESSERA_PCH_DIR", str(tmp_path / "shared_pch"))
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "first"))
    first = precompiled_prelude(find_tool("g++"), DEFAULT_CPU_FLAGS)
    (gch,) = (tmp_path / "shared_pch").glob(f"*/{PRELUDE}.gch")
    built = gch.stat().st_mtime_ns
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "second"))
    assert precompiled_prelude(find_tool("g++"), DEFAULT_CPU_FLAGS) == first == gch.parent.parent.parent
    assert gch.stat().st_mtime_ns == built  # used, not built again
    lib = compile_cpu(small_gemm_source, out_dir=tmp_path / "out", name="gemm")
    assert lib.stat().st_size > 0
    assert not (tmp_path / "first" / "pch").exists() and not (tmp_path / "second" / "pch").exists()
    # With the kernel cache off, an explicit TESSERA_PCH_DIR still serves (the prelude is the compiler's)
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")
    assert precompiled_prelude(find_tool("g++"), DEFAULT_CPU_FLAGS) == first


def test_prelude_identity_follows_the_machine(tmp_path, monkeypatch):
    """-march=native means other code on another CPU: a shared cache keeps one prelude per CPU."""
    from tessera_tvm.target.cpu import _prelude_identity
    from tessera_tvm.target.cpu import build as cpu_build

    fake = tmp_path / "g++"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "g++ (fake) 12.2"; echo "Free Software Foundation"; exit 0; fi\n'
        'echo "#define __GNUC__ 12"; echo "#define $FAKE_CPU_FEATURE 1"\n'
    )
    fake.chmod(0o755)
    identities = set()
    for feature in ("__AVX512F__", "__AVX2__", "__AVX2__"):
        monkeypatch.setenv("FAKE_CPU_FEATURE", feature)
        cpu_build._predefined_macros.cache_clear()  # asked once per process: here, once per machine
        identities.add(_prelude_identity.__wrapped__(str(fake), DEFAULT_CPU_FLAGS))
    cpu_build._predefined_macros.cache_clear()
    assert len(identities) == 2 and None not in identities
    clang = tmp_path / "clang++"
    clang.write_text('#!/bin/sh\necho "clang version 17"\n')
    clang.chmod(0o755)
    assert _prelude_identity.__wrapped__(str(clang), DEFAULT_CPU_FLAGS) is None
