"""Kernels over symbolic dims: metadata holds their extents as expressions, resolved at call time,
and tessera.VerifyResources checks what it can and says what it could not (issue #13)."""

from __future__ import annotations

import numpy as np
import pytest

import tessera_tvm
from tessera_tvm import ResourceError, TesseraError
from tessera_tvm._tvm import tilelang, tvm
from tessera_tvm.transform.analysis import extent, resolve_extent
from tests.programs import gemm as programs
from tests.programs.gemm_family import cpu_gemm_dynamic, gemm_dynamic

TARGETS = {"hopper": {"kind": "cuda", "arch": "sm_90a"}, "rocm": {"kind": "hip", "mcpu": "gfx942"}}


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")


def test_extent_is_an_int_when_constant_else_its_expression():
    n = tvm.tirx.Var("N", "int32")
    assert extent(tvm.tirx.IntImm("int32", 7)) == 7
    assert extent(tvm.tirx.floordiv(n + 127, 128) * 0 + 3) == 3  # simplified first
    assert extent(tvm.tirx.floordiv(n + 127, 128)) == "(N + 127) // 128"


@pytest.mark.parametrize(
    ("text", "dims", "value"),
    [
        ("(N + 127) // 128", {"N": 300}, 3),
        ("M * 4 - N % 3", {"M": 5, "N": 7}, 19),
        ("T.max(N, 4)", {"N": 2}, 4),
        (9, {}, 9),
    ],
)
def test_resolve_extent(text, dims, value):
    assert resolve_extent(text, dims) == value


def test_resolve_extent_says_what_it_lacks():
    with pytest.raises(TesseraError, match="needs the symbolic dim 'K'"):
        resolve_extent("K * 2", {"N": 1})
    with pytest.raises(TesseraError, match="cannot evaluate"):
        resolve_extent("N ** 2", {"N": 3})


@pytest.mark.parametrize("config", sorted(TARGETS))
def test_a_dynamic_gemm_lowers_as_tilelang_and_keeps_its_grid_symbolic(config):
    with tvm.target.Target(TARGETS[config]) as target:
        theirs = tilelang.lower(gemm_dynamic(), target=target).kernel_source
    lowered = tessera_tvm.lower(gemm_dynamic(), config, build=False)
    assert lowered.source == theirs
    (kernel,) = lowered.metadata
    assert kernel["launch"]["grid"] == ["(N + 127) // 128", "(M + 127) // 128", 1]
    assert isinstance(kernel["resources"]["smem_per_cta"], int)  # the tiles are constant
    assert "unchecked" not in kernel and lowered.notes == []
    a, b, c = np.zeros((300, 64), "f2"), np.zeros((64, 129), "f2"), np.zeros((300, 129), "f2")
    assert lowered.dims(a, b, c) == {"M": 300, "K": 64, "N": 129}
    (resolved,) = lowered.resolved_metadata(a, b, c)
    assert resolved["launch"]["grid"] == [2, 3, 1]
    with pytest.raises(TesseraError, match="dim K is 64 in A.shape\\[1\\] but 65 in B.shape\\[0\\]"):
        lowered.dims(a, np.zeros((65, 129), "f2"), c)


def test_symbolic_shared_memory_is_said_unchecked_and_checked_at_the_call():
    lowered = tessera_tvm.lower(programs.dynamic_row_scale(), "hopper", build=False)
    (kernel,) = lowered.metadata
    assert kernel["resources"]["smem_per_cta"] == "N * 4"
    assert kernel["unchecked"] == ["shared_memory_per_block = N * 4 (limit 232448)"]
    assert any("not checked at compile time" in note for note in lowered.notes)
    x = np.zeros((2, 70000), "f4")
    assert lowered.resolved_metadata(x, x)[0]["resources"]["smem_per_cta"] == 280000
    with pytest.raises(ResourceError, match="280000 bytes of shared memory.*N \\* 4 with M=2, N=70000"):
        lowered(x, x)


def test_a_dynamic_gemm_runs_on_the_cpu_at_two_shapes():
    lowered = tessera_tvm.lower(cpu_gemm_dynamic(), "cpu")
    rng = np.random.default_rng(0)
    for m, n, k in [(100, 70, 50), (64, 33, 17)]:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c = np.zeros((m, n), np.float32)
        lowered(a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)  # fp32 sums in another order
