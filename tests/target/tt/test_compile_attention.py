"""Flash attention for Tenstorrent: one kernel whose running max and sum live in circular buffers
from one key block to the next, run in the tt-metal emulator against ``tessera.reference``."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops
from tessera_tvm.target.tt.transform.common import UnsupportedTTOperationError
from tessera_tvm.tile import AttentionSpec, build_tile_program
from tests.conftest import emu_cache

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _kernel(causal: bool, align: str = "top_left", scale: float | None = None):
    @ts.kernel
    def attention(
        Q: Tensor["B", "H", "Sq", "D", ts.bf16],
        K: Tensor["B", "Hk", "Skv", "D", ts.bf16],
        V: Tensor["B", "Hk", "Skv", "D", ts.bf16],
    ) -> Tensor["B", "H", "Sq", "D", ts.bf16]:
        return ops.flash_attention(Q, K, V, causal=causal, scale=scale, causal_align=align)

    return attention


CASES = [
    # (B, H, H_kv, S_q, S_kv, D, causal, align)
    (1, 2, 2, 64, 96, 64, False, "top_left"),  # more keys than queries, no mask
    (2, 4, 2, 96, 96, 64, True, "top_left"),  # grouped-query, causal: the diagonal block is masked
    (1, 2, 1, 64, 64, 128, True, "top_left"),  # head dim 128: four output tiles carried per block
    (1, 1, 1, 32, 96, 32, True, "bottom_right"),  # flash-attn's alignment: the last query sees every key
]


@needs_gxx
@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"b{c[0]}h{c[1]}kv{c[2]}q{c[3]}k{c[4]}d{c[5]}{'c' if c[6] else ''}"
)
def test_flash_attention_runs_in_the_emulator(case, tmp_path):
    B, H, H_kv, S_q, S_kv, D, causal, align = case
    kernel = _kernel(causal, align)
    shapes = {"B": B, "H": H, "Hk": H_kv, "Sq": S_q, "Skv": S_kv, "D": D}
    compiled = ts.compile(kernel, target="tenstorrent", shapes=shapes)
    assert [dk.binding.spec.family for dk in compiled.device_kernels] == ["attention"]  # one fused kernel
    rng = np.random.default_rng(sum(case[:6]))
    q = (2 * rng.standard_normal((B, H, S_q, D))).astype(ts.bf16.numpy)
    k = rng.standard_normal((B, H_kv, S_kv, D)).astype(ts.bf16.numpy)
    v = rng.standard_normal((B, H_kv, S_kv, D)).astype(ts.bf16.numpy)
    out = compiled.emulate(q, k, v, cache_dir=emu_cache())
    ref = kernel.reference(q, k, v).astype(np.float64)
    err = np.abs(out.astype(np.float64) - ref)
    # P is rounded to bf16 before P V, and each rescaled partial sum is packed to bf16
    tol = 2.0**-6 * np.abs(ref).max() + 2.0**-7 * np.abs(ref)
    assert np.all(err <= tol), f"max |diff| {err.max():.3g} of max |ref| {np.abs(ref).max():.3g}"


def test_the_compute_kernel_carries_max_and_sum_between_key_blocks():
    """The generated kernels: the key loop (a symbolic extent when causal), the max of the running and
    the block's row max on the SFPU, reduce_uninit after each reduction, a generated mask tile."""
    kernel = _kernel(True)
    compiled = ts.compile(kernel, target="tenstorrent", shapes={"B": 1, "H": 2, "Hk": 1, "Sq": 96, "Skv": 96, "D": 64})
    files = compiled.artifacts["flash_attention"]
    compute, reader = files["compute"].read_text(), files["reader"].read_text()
    assert "binary_max_tile(0, 1);" in compute
    assert compute.count("reduce_uninit();") == 2
    assert "pack_tile(0, cb_m_carry);" in compute and "pack_tile(0, cb_l_sum_carry);" in compute
    assert "cb_pop_front(cb_m_carry, 1);" in compute
    assert "? 0xff80u : 0x0000u" in reader  # -inf where the key is after the query, 0 elsewhere
    assert "for (uint32_t kb = 0; kb < tile_id % 3 + 1; ++kb)" in reader  # causal: up to the diagonal block


@pytest.mark.parametrize(
    "spec, op",
    [
        (AttentionSpec(1, 1, 1, 40, 40, 64, dtype_in="bfloat16"), "attention with ragged sequence lengths"),
        (AttentionSpec(1, 1, 1, 64, 64, 96, dtype_in="bfloat16"), "attention with head dim 96"),
        (AttentionSpec(1, 1, 1, 64, 64, 64, dtype_in="int8"), "attention with dtype_in=int8"),
        (
            AttentionSpec(1, 1, 1, 64, 64, 64, dtype_in="bfloat16", bias=(1, 1, 1, 64)),
            r"attention with a bias \(an attention mask\)",
        ),
    ],
    ids=["ragged", "head_dim_96", "int8", "bias"],
)
def test_attention_the_target_cannot_lower_is_refused_naming_it(spec, op):
    with pytest.raises(UnsupportedTTOperationError, match=rf"^{op}.*the Tenstorrent target does not support"):
        build_tile_program(spec, None, "tenstorrent")
