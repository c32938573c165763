"""Attention with an ALiBi position bias and a mask, written as BLOOM, MPT and Falcon write it,
imported on both routes of TVM's torch frontend: one Tessera attention kernel whose bias is ALiBi
plus the mask (tessera_tvm/relax/recover_scores.py), matching torch. Small hand-written modules
(an HF model costs seconds more to build)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tessera_tvm.relax import build

from_exported_program = pytest.importorskip("tvm.relax.frontend.torch").from_exported_program

B, H, S, D = 2, 4, 12, 16


def _slopes() -> torch.Tensor:
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])


def _padded_causal(dtype) -> torch.Tensor:
    """HF's mask [B, 1, S, S]: finfo.min above the diagonal and on the keys of the second sequence's
    3 left pads (whose queries see no key at all: a row of finfo.min, uniform in torch)."""
    keep = torch.ones(B, S, dtype=torch.bool)
    keep[1, :3] = False
    visible = torch.tril(torch.ones(S, S, dtype=torch.bool))[None, None] & keep[:, None, None, :]
    return torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype)


class BloomAttention(nn.Module):
    """BLOOM's: q, k, v merged to [B*H, S, D], ``alibi.baddbmm(q, k^T, beta=1, alpha=1/sqrt(D))``
    with ALiBi [B*H, 1, S], viewed as [B, H, S, S] plus the mask, softmax in float32."""

    def forward(self, q, k, v, alibi, mask):
        q, k, v = (t.reshape(B * H, S, D) for t in (q, k, v))
        scores = alibi.baddbmm(batch1=q, batch2=k.transpose(-1, -2), beta=1.0, alpha=1 / math.sqrt(D))
        w = scores.view(B, H, S, S) + mask
        probs = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.bmm(probs.view(B * H, S, S), v).view(B, H, S, D)


class MptAttention(nn.Module):
    """MPT's: ``q @ k^T * scale + alibi`` (ALiBi [H, 1, S], a float32 buffer), ``masked_fill(mask,
    finfo(q.dtype).min)`` (``fill``: another value), softmax of the scores in float32."""

    def __init__(self, fill=None):
        super().__init__()
        self.fill = fill
        self.register_buffer("alibi", (_slopes()[:, None, None] * torch.arange(1 - S, 1)).float())

    def forward(self, q, k, v, masked):
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1 / math.sqrt(D)) + self.alibi
        fill = torch.finfo(q.dtype).min if self.fill is None else self.fill
        scores = scores.masked_fill(masked, fill)
        return torch.matmul(F.softmax(scores.float(), dim=-1).to(v.dtype), v)


def _inputs(dtype, model: str):
    torch.manual_seed(3)
    q, k, v = (torch.randn(B, H, S, D).to(dtype) for _ in range(3))
    mask = _padded_causal(dtype)
    if model == "bloom":
        positions = torch.arange(S).expand(B, S).clone()
        positions[1] = torch.clamp(positions[1] - 3, min=0)
        alibi = (_slopes()[None, :, None] * positions[:, None, :]).reshape(B * H, 1, S).to(dtype)
        return q, k, v, alibi, mask
    return q, k, v, mask != 0


def _run(built, args):
    from tessera_tvm import tvm

    (got,) = built.vm()["main"](*(tvm.runtime.from_dlpack(a.contiguous()) for a in args))
    return torch.from_dlpack(got).float()


@pytest.mark.parametrize("decompose", [True, False], ids=["decomposed", "not decomposed"])
@pytest.mark.parametrize("name", ["bloom", "mpt"])
def test_alibi_attention_is_one_kernel_whose_bias_is_alibi_plus_the_mask(name, decompose):
    model = BloomAttention() if name == "bloom" else MptAttention()
    args = _inputs(torch.float32, name)
    exported = torch.export.export(model.eval(), args)
    built = build(from_exported_program(exported, keep_params_as_input=False, run_ep_decomposition=decompose), "cpu")
    assert built.report.recovered_attention == 1, built.report
    (kernel,) = [row for row in built.report.offloaded if row.family == "attention"]
    assert kernel.spec.bias == (B, H, S, S) and not kernel.spec.causal, built.report
    assert kernel.spec.scale == pytest.approx(1 / math.sqrt(D)), built.report
    ops = {row.op for row in built.report.not_offloaded}
    assert not ops & {"R.matmul", "R.nn.softmax", "R.nn.attention_bias"}, built.report
    with torch.no_grad():
        expected = model(*args)
    # The padded queries see no key: a row of finfo.min, uniform over the keys in torch and here.
    torch.testing.assert_close(_run(built, args), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["bloom", "mpt"])
def test_alibi_attention_in_bfloat16_is_one_kernel_and_matches_torch(name):
    model = (BloomAttention() if name == "bloom" else MptAttention()).to(torch.bfloat16)
    args = _inputs(torch.bfloat16, name)
    exported = torch.export.export(model.eval(), args)
    built = build(from_exported_program(exported, keep_params_as_input=False), "cpu")
    assert built.report.recovered_attention == 1, built.report
    (kernel,) = [row for row in built.report.offloaded if row.family == "attention"]
    assert kernel.spec.dtype_in == "bfloat16" and kernel.spec.bias == (B, H, S, S), built.report
    with torch.no_grad():
        expected = model(*args).float()
        exact = model.float()(*(a.float() if a.is_floating_point() else a for a in args))
    got = _run(built, args)
    # torch rounds the scores and the probabilities to bf16 (spacing 2^-6 at outputs below 4), the
    # kernel only its output: within 2 spacings of torch, and no further from float32 than torch.
    torch.testing.assert_close(got, expected, atol=2 * 2**-6, rtol=0)
    assert float((got - exact).abs().max()) <= float((expected - exact).abs().max())


def test_a_masked_fill_with_a_value_a_score_does_not_swamp_is_not_rebuilt():
    # where(masked, -1e4, s) is not s + where(masked, -1e4, 0): a row of masked keys would keep
    # the scores' differences. Left as it is (and still matches torch).
    model, args = MptAttention(fill=-1e4), _inputs(torch.float32, "mpt")
    built = build(from_exported_program(torch.export.export(model.eval(), args), keep_params_as_input=False), "cpu")
    assert built.report.recovered_attention == 0, built.report
    with torch.no_grad():
        torch.testing.assert_close(_run(built, args), model(*args), atol=1e-5, rtol=1e-5)


class MultiQuery(nn.Module):
    """Falcon's SDPA: K and V of one head, broadcast over the query heads by SDPA; ``attn_mask``
    ALiBi plus the mask (Falcon with ``alibi=True``)."""

    def forward(self, q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def test_sdpa_with_one_kv_head_decomposed_is_one_multi_query_kernel():
    torch.manual_seed(5)
    q, k, v = torch.randn(B, H, S, D), torch.randn(B, 1, S, D), torch.randn(B, 1, S, D)
    bias = _slopes()[None, :, None, None] * torch.arange(S) + _padded_causal(torch.float32)
    args = (q, k, v, bias)
    model = MultiQuery()
    built = build(from_exported_program(torch.export.export(model, args), keep_params_as_input=False), "cpu")
    assert built.report.recovered_attention == 1, built.report
    (kernel,) = [row for row in built.report.offloaded if row.family == "attention"]
    assert (kernel.spec.H, kernel.spec.H_kv) == (H, 1) and kernel.spec.bias == (B, H, S, S), built.report
    with torch.no_grad():
        torch.testing.assert_close(_run(built, args), model(*args), atol=1e-5, rtol=1e-5)


class TwoBloomLayers(nn.Module):
    """Two BLOOM attentions on the same ALiBi and mask (a model's layers)."""

    def __init__(self):
        super().__init__()
        self.attention = BloomAttention()

    def forward(self, q, k, v, alibi, mask):
        return self.attention(self.attention(q, k, v, alibi, mask), k, v, alibi, mask)


def test_the_bias_of_every_layer_is_computed_once():
    # Planning only: ALiBi + mask ([B, H, 1, S] + [B, 1, S, S]) is one add, read by both kernels.
    from tessera_tvm.relax import partition_for_tessera

    args = _inputs(torch.float32, "bloom")
    mod = from_exported_program(torch.export.export(TwoBloomLayers(), args), keep_params_as_input=False)
    _, report = partition_for_tessera(mod, "cpu")
    assert report.recovered_attention == 2, report
    kernels = [row for row in report.offloaded if row.family == "attention"]
    assert len(kernels) == 2 and all(k.spec.bias == (B, H, S, S) for k in kernels), report
    ops = [row.ops for row in report.offloaded] + [row.op for row in report.not_offloaded]
    adds = [op for op in ops if "add" in op]
    assert adds == ["add"], report
