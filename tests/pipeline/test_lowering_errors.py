"""Every failure of tessera_tvm.lower is a TesseraError naming the kernel, the config the user asked
for and the pass or step that failed; no TVM exception type reaches the user (issue #13)."""

from __future__ import annotations

import pytest
import tilelang.language as T

import tessera_tvm
from tessera_tvm import LoweringError
from tests.programs import gemm as programs
from tests.programs.gemm_family import gemm_dynamic


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")


def test_a_simt_kernel_on_tenstorrent_names_the_config_not_tvms_target():
    with pytest.raises(LoweringError) as info:
        tessera_tvm.lower(programs.thread_indexed_copy(), "tenstorrent", build=False)
    message = str(info.value)
    assert message.startswith("pass tl.MaterializeKernelLaunch (LowerAndLegalize, config 'tenstorrent')")
    assert "target 'tenstorrent' (TVM target `c`) has no SIMT threads" in message
    assert "target `c` has" not in message


def test_a_codegen_failure_names_the_codegen_kernel_and_config():
    # TileLang's CUDA codegen cannot print this dynamic GEMM for sm_80 (tilelang.lower fails the same way).
    with pytest.raises(
        LoweringError, match="codegen \\(cuda\\) failed on kernel 'main' \\(config 'ampere'\\):\\n.*Downcast"
    ):
        tessera_tvm.lower(gemm_dynamic(), "ampere", build=False)


def _int4_gemv(N=64, K=128):
    """A GEMV over an int4 weight buffer: TVM's C codegen has no C type for int4."""

    @T.prim_func
    def main(A: T.Tensor((K,), "float16"), B: T.Tensor((N, K), "int4"), C: T.Tensor((N,), "float16")):
        with T.Kernel(T.ceildiv(N, 32)) as bx:
            acc = T.alloc_local((32,), "float32")
            T.clear(acc)
            for i, k in T.grid(32, K):
                acc[i] += T.cast(A[k], "float32") * T.cast(B[bx * 32 + i, k], "float32")
            for i in T.serial(32):
                C[bx * 32 + i] = T.cast(acc[i], "float16")

    return main


def test_a_cpu_codegen_failure_is_a_tessera_error():
    with pytest.raises(LoweringError, match="codegen \\(c\\) failed on kernel 'main' \\(config 'cpu'\\):\\n.*int4"):
        tessera_tvm.lower(_int4_gemv(), "cpu")
