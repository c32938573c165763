"""Every failure of tessera_tvm.lower is a TesseraError naming the kernel, the config the user asked
for and the pass or step that failed; no TVM exception type reaches the user (issue #13)."""

from __future__ import annotations

import pytest

import tessera_tvm
from tessera_tvm import LoweringError
from tests.programs import gemm as programs


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
        tessera_tvm.lower(programs.dynamic_gemm(), "ampere", build=False)
