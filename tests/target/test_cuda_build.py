"""Tests of tessera_tvm.target.cuda: nvcc builds of TileLang GEMMs for Hopper and Ampere, no GPU needed.

One lowering and one nvcc build per arch for the whole module (module-scoped fixtures); each build
takes ~1.5 s. Tests that need nvcc are skipped when it is missing.
"""

# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations of prim_funcs.
import pytest

from tessera_tvm._tvm import tilelang, tvm  # TileLang and its TVM, the one-TVM way
from tessera_tvm.errors import ToolchainError, ToolchainMissingError
from tessera_tvm.target.cuda import (
    CudaBuild,
    compile_cuda,
    gencode_flag,
    nvcc_available,
    parse_ptxas_report,
)
from tessera_tvm.target.toolchain import BuildOptionError

T = tilelang.language
Target = tvm.target.Target

_skip_without_nvcc = pytest.mark.skipif(
    not nvcc_available(), reason="nvcc not on PATH: install the CUDA Toolkit or set TESSERA_NVCC"
)


def needs_nvcc(test):
    """Skip without nvcc (PATH or TESSERA_NVCC) and mark `nvcc`, so `pytest -m nvcc` selects it."""
    return pytest.mark.nvcc(_skip_without_nvcc(test))


def gemm_fp16(M: int, N: int, K: int, bm: int = 128, bn: int = 128, bk: int = 32):
    """fp16 in, fp32 accumulate: shared A/B tiles, a 3-stage pipeline, T.gemm (wgmma on sm_90a)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            C_f = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=3):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * bm, bx * bn])

    return main


def lower_cuda(arch: str) -> str:
    with Target({"kind": "cuda", "arch": arch}) as target:
        return tilelang.lower(gemm_fp16(1024, 1024, 1024), target=target).kernel_source


@pytest.fixture(scope="module")
def source_sm80() -> str:
    return lower_cuda("sm_80")


@pytest.fixture(scope="module")
def build_sm90a(tmp_path_factory) -> CudaBuild:
    if not nvcc_available():
        pytest.skip("nvcc not on PATH")
    out = tmp_path_factory.mktemp("sm90a")
    return compile_cuda(lower_cuda("sm_90a"), arch="sm_90a", out_dir=out, name="gemm")


@pytest.fixture(scope="module")
def build_sm80(tmp_path_factory, source_sm80) -> CudaBuild:
    if not nvcc_available():
        pytest.skip("nvcc not on PATH")
    out = tmp_path_factory.mktemp("sm80")
    return compile_cuda(source_sm80, arch="sm_80", out_dir=out, name="gemm")


# ---------------------------------------------------------------------------- real nvcc builds


@needs_nvcc
def test_sm90a_build_writes_cu_ptx_cubin(build_sm90a):
    b = build_sm90a
    assert b.source_path.name == "gemm.cu" and "__global__" in b.source_path.read_text()
    assert b.cubin_path.is_file() and b.cubin_path.stat().st_size > 0
    assert b.cubin_path.read_bytes()[:4] == b"\x7fELF"
    assert sorted(p.name for p in b.source_path.parent.iterdir()) == ["gemm.cu", "gemm.cubin", "gemm.ptx"]
    ptx = b.ptx_path.read_text()
    assert ".target sm_90a" in ptx
    assert "wgmma" in ptx  # Hopper tensor cores
    assert "cp.async.bulk.tensor" in ptx  # TMA loads
    assert b.seconds > 0
    assert all("-gencode=arch=compute_90a,code=sm_90a" in c for c in b.commands)


@needs_nvcc
def test_sm80_build_uses_mma_sync_and_cp_async(build_sm80):
    ptx = build_sm80.ptx_path.read_text()
    assert ".target sm_80" in ptx
    assert "mma.sync" in ptx and "cp.async" in ptx
    assert "wgmma" not in ptx
    assert build_sm80.cubin_path.stat().st_size > 0


@needs_nvcc
@pytest.mark.parametrize("which", ["build_sm90a", "build_sm80"])
def test_resource_usage_reports_the_kernel(which, request):
    usage = request.getfixturevalue(which).resource_usage
    assert set(usage) == {"main_kernel"}
    ru = usage["main_kernel"]
    assert 0 < ru["registers"] <= 255
    assert ru["spill_stores"] >= 0 and ru["spill_loads"] >= 0 and ru["shared_bytes"] >= 0
    assert {"registers", "shared_bytes", "spill_stores", "spill_loads"} <= set(ru)


@needs_nvcc
def test_header_warnings_are_logged_not_errors(build_sm80):
    # TileLang's headers make nvcc warn (deprecated longlong4, ...): the build still succeeds.
    assert "ptxas info" in build_sm80.log


@needs_nvcc
def test_syntax_error_raises_with_command_and_leaves_nothing(tmp_path, source_sm80):
    out = tmp_path / "out"
    with pytest.raises(ToolchainError) as info:
        compile_cuda(source_sm80 + "\nthis is not c++;\n", arch="sm_80", out_dir=out, name="broken")
    err = info.value
    assert not isinstance(err, ToolchainMissingError)
    msg = str(err)
    assert "nvcc failed (exit code" in msg
    assert "-gencode=arch=compute_80,code=sm_80" in msg and "broken.cu" in msg  # the command line
    assert "broken.cu(" in msg and "error" in msg  # the first error line, despite ~100 warning lines
    assert "nothing was written" in msg
    assert err.command[0].endswith("nvcc")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no staging directory left either


@needs_nvcc
def test_failed_rebuild_keeps_previous_artifacts(tmp_path):
    good = "__global__ void scale(float* x) { x[threadIdx.x] *= 2.0f; }\n"
    first = compile_cuda(good, arch="sm_80", out_dir=tmp_path, name="k", formats=("ptx",))
    before = first.ptx_path.read_text()
    with pytest.raises(ToolchainError):
        compile_cuda("garbage", arch="sm_80", out_dir=tmp_path, name="k", formats=("ptx",))
    assert first.ptx_path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.cu", "k.ptx"]


@needs_nvcc
def test_formats_and_extra_flags(tmp_path):
    src = "__global__ void scale(float* x) { x[threadIdx.x] *= SCALE; }\n"
    b = compile_cuda(src, arch="sm_80", out_dir=tmp_path, name="k", formats=("cubin",), extra_flags=["-DSCALE=3.0f"])
    assert b.ptx_path is None and b.cubin_path.is_file()
    # sm_80 is portable: a fatbin (magic 0xBA55ED50) of its SASS and PTX, which newer GPUs JIT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.cu", "k.fatbin"]
    assert b.cubin_path.read_bytes()[:4] == bytes.fromhex("50ed55ba")
    assert "-gencode=arch=compute_80,code=[sm_80,compute_80]" in b.commands[0]
    assert b.resource_usage["_Z5scalePf"]["registers"] > 0  # C++ kernels keep their mangled names
    assert len(b.commands) == 1 and "-DSCALE=3.0f" in b.commands[0]


def test_missing_nvcc_raises(monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_NVCC", str(tmp_path / "nonexistent" / "nvcc"))
    assert not nvcc_available()
    with pytest.raises(ToolchainMissingError, match="TESSERA_NVCC"):
        compile_cuda("__global__ void k() {}", arch="sm_80", out_dir=tmp_path / "out", name="k")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------- no nvcc needed


def test_gencode_flag():
    assert gencode_flag("sm_90a") == "-gencode=arch=compute_90a,code=sm_90a"
    assert gencode_flag("sm_80") == "-gencode=arch=compute_80,code=sm_80"
    assert gencode_flag("sm_100f") == "-gencode=arch=compute_100f,code=sm_100f"
    for bad in ["sm90", "compute_90", "sm_90x", "cuda -arch=sm_90", ""]:
        with pytest.raises(BuildOptionError, match="not of the form sm_"):
            gencode_flag(bad)


def test_bad_options_fail_before_running_nvcc(tmp_path):
    with pytest.raises(BuildOptionError, match="formats"):
        compile_cuda("", arch="sm_80", out_dir=tmp_path, name="k", formats=("sass",))
    with pytest.raises(BuildOptionError, match="plain file name"):
        compile_cuda("", arch="sm_80", out_dir=tmp_path, name="../k")
    with pytest.raises(BuildOptionError, match="sm_"):
        compile_cuda("", arch="90a", out_dir=tmp_path, name="k")
    assert list(tmp_path.iterdir()) == []


PTXAS_REPORT = """\
ptxas info    : 9 bytes gmem, 72 bytes cmem[4]
ptxas info    : Function properties for helper
    16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function 'gemm_kernel' for 'sm_90a'
ptxas info    : Function properties for gemm_kernel
    24 bytes stack frame, 20 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 95.392 ms
ptxas info    : Compiling entry function '_Z4copyPfS_' for 'sm_90a'
ptxas info    : Function properties for _Z4copyPfS_
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, 368 bytes cmem[0]
"""


def test_parse_ptxas_report():
    usage = parse_ptxas_report(PTXAS_REPORT)
    assert usage == {
        "gemm_kernel": {
            "registers": 168,
            "shared_bytes": 1024,
            "spill_stores": 20,
            "spill_loads": 12,
            "stack_bytes": 24,
            "barriers": 16,
        },
        "_Z4copyPfS_": {
            "registers": 8,
            "shared_bytes": 0,
            "spill_stores": 0,
            "spill_loads": 0,
            "stack_bytes": 0,
            "barriers": 0,
        },
    }
    assert parse_ptxas_report("") == {}
