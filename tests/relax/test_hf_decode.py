"""One decode step of a Hugging Face causal LM with a KV cache, as generation runs it: a tiny LLaMA
(random weights, nothing downloaded) prefills a prompt in torch, then examples/hf_model.py's
StaticCacheStep (the cache as fixed-size tensors, transformers' StaticCache inside) is exported,
imported on the default route and built once, and fed its own cache back step after step beside
torch's loop on its DynamicCache. The query is one token against 16 cache positions, the keys after
the current position masked."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

if importlib.util.find_spec("transformers") is None:
    pytest.skip("needs transformers (the test extra has it)", allow_module_level=True)
pytest.importorskip("tvm.relax.frontend.torch")

from .models import example as load_example  # noqa: E402

pytestmark = pytest.mark.slow


def test_llama_decode_steps_on_a_static_cache_match_torchs_generation_loop():
    example = load_example("hf_model")
    model = example.make_model("llama")  # hidden 64, 2 layers, 4 heads, 2 KV heads
    prompt = torch.randint(0, 256, (2, 5))
    built, steps = example.decode_and_compare(model, prompt, 2, max_len=16)
    for n, (logits, expected, cache, torchs) in enumerate(steps):
        assert logits.shape == (2, 1, 256)
        np.testing.assert_allclose(logits, expected, atol=2e-5, rtol=1e-4, err_msg=f"step {n}")
        length = prompt.shape[1] + n + 1  # the prompt, and this step's token written at its position
        for got, want in zip(cache, torchs, strict=True):
            assert got.shape == (2, 2, 16, 16) and want.shape[2] == length
            np.testing.assert_allclose(got[:, :, :length], want, atol=1e-5, rtol=1e-5, err_msg=f"step {n}")
            assert not got[:, :, length:].any()  # the positions not yet written
    families = [row.family for row in built.report.offloaded]
    assert families.count("attention") == 2, built.report  # one query against the cache, each layer
    assert families.count("gemm") >= 8, built.report
