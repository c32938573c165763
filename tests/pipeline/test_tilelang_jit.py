"""``@tilelang.jit`` kernels go to ``tessera_tvm.lower`` as they are, their pass_configs honoured (#13.4)."""

from __future__ import annotations

import pytest

import tessera_tvm
from tessera_tvm import TesseraError
from tessera_tvm._tvm import tilelang, tvm
from tests.programs.gemm import gemm as _gemm

HOPPER = {"kind": "cuda", "arch": "sm_90a"}
NO_WS = {"tl.disable_warp_specialized": True}


matmul = tilelang.jit(_gemm, pass_configs=NO_WS)


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")


def _tilelang_source(program, pass_configs=None) -> str:
    with tvm.transform.PassContext(config=pass_configs or {}), tvm.target.Target(HOPPER) as target:
        return tilelang.lower(program, target=target).kernel_source


def test_a_jit_function_lowers_with_its_pass_configs():
    ours = tessera_tvm.lower(matmul, "hopper", build=False, jit_args=(512, 512, 512))
    assert ours.source == _tilelang_source(_gemm(512, 512, 512), NO_WS)
    assert ours.source != _tilelang_source(_gemm(512, 512, 512))  # the pass config changed the kernel
    assert "warpgroup_reg_alloc" not in ours.source


def test_the_pass_configs_join_the_callers_pass_context():
    with tvm.transform.PassContext(config={"tl.disable_tma_lower": True}, disabled_pass=["tl.LoopUnswitching"]):
        ours = tessera_tvm.lower(matmul, "hopper", build=False, jit_args=(256, 256, 256))
        assert tvm.transform.PassContext.current().config.get("tl.disable_warp_specialized") is None  # restored
    config = {"tl.disable_tma_lower": True, **NO_WS}
    with tvm.transform.PassContext(config=config, disabled_pass=["tl.LoopUnswitching"]):
        assert ours.source == tessera_tvm.lower(_gemm(256, 256, 256), "hopper", build=False).source


def test_the_kernels_pass_configs_win_and_the_callers_instruments_still_see_its_passes():
    # Deliberately unlike tilelang.compile, which opens a fresh PassContext: the caller's context applies.
    seen: list[str] = []

    @tvm.instrument.pass_instrument
    class Names:
        def run_before_pass(self, mod, info):
            seen.append(info.name)

    outer = {"tl.disable_warp_specialized": False}
    with tvm.transform.PassContext(config=outer, instruments=[Names()]):
        ours = tessera_tvm.lower(matmul, "hopper", build=False, jit_args=(256, 256, 256))
    assert "warpgroup_reg_alloc" not in ours.source  # the kernel's True beat the caller's False
    assert ours.source == _tilelang_source(_gemm(256, 256, 256), NO_WS)
    assert "tl.LayoutInference" in seen and "tessera.VerifyResources" in seen


def test_a_jit_function_without_its_arguments_says_how_to_give_them():
    with pytest.raises(TesseraError, match="@tilelang.jit kernel 'gemm'.*missing a required argument: 'M'.*jit_args"):
        tessera_tvm.lower(matmul, "hopper", build=False)


def test_something_else_is_refused_with_what_is_accepted():
    with pytest.raises(TesseraError, match="PrimFunc.*IRModule.*@tilelang.jit kernel, found str"):
        tessera_tvm.lower("main", "hopper")


@pytest.mark.nvcc
def test_a_compiled_jit_kernel_lowers_as_tilelang_compiled_it():
    compiled = tilelang.jit(_gemm, target=tvm.target.Target(HOPPER), pass_configs=NO_WS)(256, 256, 256)
    ours = tessera_tvm.lower(compiled, "hopper", build=False)
    assert ours.source == compiled.get_kernel_source()
