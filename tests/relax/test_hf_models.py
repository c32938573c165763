"""Hugging Face transformers models, built from small configs with random weights (nothing is
downloaded), exported with torch.export and imported with TVM's frontend as a user would, on the
route the README offers beside the default (``run_ep_decomposition=False``) and on the default.

Without decomposition none of these imported before tessera_tvm/frontend_fixes.py: transformers'
mask code calls ``torch.diff`` and builds its bool mask from ``new_ones(dtype=torch.bool)`` (which
came out int64), LLaMA moves its rotary frequencies with ``.to(device, dtype)``, and BERT passes a
bool ``attn_mask`` to SDPA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tessera_tvm.relax import build

transformers = pytest.importorskip("transformers")
from_exported_program = pytest.importorskip("tvm.relax.frontend.torch").from_exported_program

pytestmark = pytest.mark.slow

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256)


def _llama():
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(num_key_value_heads=2, max_position_embeddings=64, use_cache=False, **SMALL)
    )


def _bert():
    return transformers.BertModel(transformers.BertConfig(max_position_embeddings=64, **SMALL))


def _gpt2():
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64, use_cache=False)
    return transformers.GPT2LMHeadModel(config)


class FirstOutput(nn.Module):
    """The model's first output (logits or the last hidden state) as a plain tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids, mask=None):
        return self.model(input_ids=ids, attention_mask=mask)[0]


@pytest.mark.parametrize(
    "make, decompose, padded",
    [(_llama, False, "left"), (_bert, False, "right"), (_gpt2, True, None)],
    ids=["llama (GQA, rotary), not decomposed", "bert, not decomposed", "gpt2, decomposed"],
)
def test_a_transformers_model_imports_builds_and_matches_torch(make, decompose, padded):
    # Two sequences, the second padded (left for the decoder, right for BERT) through the
    # attention_mask input. (GPT-2 is exported with one sequence and no mask: torch 2.13's own
    # decomposition of its batched graph fails, "Cannot view a tensor ... as a tensor with shape".)
    torch.manual_seed(0)
    model = FirstOutput(make()).eval()
    if padded is None:
        inputs = (torch.randint(0, 256, (1, 12)),)
    else:
        mask = torch.ones(2, 12, dtype=torch.int64)
        if padded == "left":
            mask[1, :3] = 0
        else:
            mask[1, 8:] = 0
        inputs = (torch.randint(0, 256, (2, 12)), mask)
    with torch.no_grad():
        expected = model(*inputs).numpy()
    exported = torch.export.export(model, inputs)
    built = build(from_exported_program(exported, keep_params_as_input=False, run_ep_decomposition=decompose), "cpu")
    (got,) = built.run("main", *(t.numpy() for t in inputs))
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-4)
    families = [row.family for row in built.report.offloaded]
    assert families.count("gemm") >= 8, built.report  # every projection of both layers
    if not decompose:  # SDPA imported whole: one attention kernel per layer
        assert families.count("attention") == 2, built.report
