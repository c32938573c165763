"""A Hugging Face transformers model end to end on the CPU: built from a config (random weights,
nothing downloaded), exported with torch.export, imported with TVM's own torch frontend, offloaded
to Tessera kernels, built, run and compared with torch.

    python examples/hf_model.py                  # a small LLaMA (GQA, rotary), both import routes
    python examples/hf_model.py bert gpt2 qwen2 vit  # others (make_model lists them)
    python examples/hf_model.py --decode llama   # decode steps on a KV cache (StaticCacheStep)
    TESSERA_NUM_THREADS=2 python examples/hf_model.py

Needs ``transformers`` (in the test extras: ``pip install -e .[test]``). Threads: Tessera's CPU
kernels use ``TESSERA_NUM_THREADS`` (else ``OMP_NUM_THREADS``, else one per core); torch's
``torch.set_num_threads``. A first build compiles each new kernel (g++, cached in the kernel
cache); a second build of the same model reuses them.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from torch import nn


def make_model(
    name: str,
    *,
    hidden: int = 64,
    ffn: int | None = None,
    layers: int = 2,
    heads: int = 4,
    vocab: int = 256,
    positions: int = 64,
    image_size: int = 32,
    patch_size: int = 8,
):
    """A ``name`` (llama, qwen2, mixtral, bert, roberta, gpt2, vit, deit, the ALiBi models bloom, mpt and
    falcon_alibi, falcon, or one of :data:`CAUSAL_LMS`) of
    the given sizes with random weights, in eval mode, its first output a plain tensor (ViT and DeiT take images of
    ``image_size`` cut into ``patch_size`` patches: ``vit_inputs``). The decoders with grouped-query
    attention (LLaMA, Qwen2, Mixtral, Mistral, Gemma, Qwen3, StableLM) get half as many KV heads;
    the feed-forward width is ``ffn`` (default twice ``hidden``; GPT-2's is its own 4x). Decoders get
    ``use_cache=False``: the KV cache is for generation, and torch.export wants plain tensors out."""
    import transformers as hf

    torch.manual_seed(0)
    common = dict(
        hidden_size=hidden,
        intermediate_size=ffn or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        vocab_size=vocab,
        max_position_embeddings=positions,
    )
    decoder = dict(num_key_value_heads=heads // 2, use_cache=False)
    if name == "llama":
        model = hf.LlamaForCausalLM(hf.LlamaConfig(**common, **decoder))
    elif name == "qwen2":
        model = hf.Qwen2ForCausalLM(hf.Qwen2Config(**common, **decoder))
    elif name == "mixtral":  # 8 experts, 2 per token, transformers' default (grouped) experts
        config = hf.MixtralConfig(**common, **decoder, num_local_experts=8, num_experts_per_tok=2)
        model = hf.MixtralForCausalLM(config)
    elif name in CAUSAL_LMS:  # configs with LLaMA's keys
        model_class = getattr(hf, CAUSAL_LMS[name])
        model = model_class(model_class.config_class(**common, **decoder, head_dim=hidden // heads))
    elif name in ("bert", "roberta"):  # RoBERTa: BERT with its own position ids
        model_class = hf.BertModel if name == "bert" else hf.RobertaModel
        model = model_class(model_class.config_class(**common))
    elif name in ("vit", "deit"):  # images: the patch embedding is a strided convolution
        model_class = hf.ViTModel if name == "vit" else hf.DeiTModel  # DeiT adds a distillation token
        config = model_class.config_class(**common, image_size=image_size, patch_size=patch_size)
        return FirstOutput(model_class(config, add_pooling_layer=False), "pixel_values").eval()
    elif name == "bloom":  # ALiBi through baddbmm on heads merged to [B*H, S, D]
        config = hf.BloomConfig(hidden_size=hidden, n_layer=layers, n_head=heads, vocab_size=vocab, use_cache=False)
        model = hf.BloomForCausalLM(config)
    elif name == "mpt":  # ALiBi added to the scores, the mask by masked_fill
        config = hf.MptConfig(
            d_model=hidden, n_layers=layers, n_heads=heads, vocab_size=vocab, max_seq_len=positions, use_cache=False
        )
        model = hf.MptForCausalLM(config)
    elif name in ("falcon", "falcon_alibi"):  # multi-query attention (one kv head); ALiBi instead of rotary
        config = hf.FalconConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            vocab_size=vocab,
            alibi=name == "falcon_alibi",
            use_cache=False,
        )
        model = hf.FalconForCausalLM(config)
    elif name == "gpt2":
        config = hf.GPT2Config(
            n_embd=hidden, n_layer=layers, n_head=heads, vocab_size=vocab, n_positions=positions, use_cache=False
        )
        model = hf.GPT2LMHeadModel(config)
    else:
        raise SystemExit(
            f"unknown model {name!r}: one of llama, qwen2, mixtral, bert, roberta, gpt2, vit, deit, bloom, mpt, "
            f"falcon, falcon_alibi, {', '.join(CAUSAL_LMS)}"
        )
    return FirstOutput(model).eval()


#: More causal LMs, whose configs take LLaMA's keys (each matched torch on both import routes,
#: 2026-11-30; docs/relax.md lists every architecture tried)
CAUSAL_LMS = {
    "mistral": "MistralForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",  # attention logit softcapping: its attention stays decomposed
    "qwen3": "Qwen3ForCausalLM",  # an RMSNorm on each head's queries and keys
    "stablelm": "StableLmForCausalLM",  # partial rotary, layer norms
    "phi": "PhiForCausalLM",  # attention and MLP side by side
    "gpt_neox": "GPTNeoXForCausalLM",  # Pythia
}


class FirstOutput(nn.Module):
    """The model's first output (logits, or BERT's and ViT's last hidden state) as a plain tensor."""

    def __init__(self, model: nn.Module, takes: str = "input_ids") -> None:
        super().__init__()
        self.model, self.takes = model, takes

    def forward(self, x, mask=None):
        if self.takes == "pixel_values":
            return self.model(pixel_values=x)[0]
        return self.model(input_ids=x, attention_mask=mask)[0]


class StaticCacheStep(nn.Module):
    """One decode step of a causal LM with its KV cache as plain tensors of a fixed size, the form
    torch.export and a build take: ``forward(ids, position, *cache)`` with ``ids`` [B, T] the new
    tokens, ``position`` [1] (int64) the number of tokens already in the cache, and ``cache`` each
    layer's keys and values [B, kv_heads, max_len, head_dim] (positions from ``position`` on
    unused); returns the logits and the updated cache tensors (the inputs are not written). One
    build serves every step up to ``max_len``: the shapes do not grow. Inside it is transformers'
    ``StaticCache`` (writes with ``index_copy`` at the position, masks the keys after it)."""

    def __init__(self, model: nn.Module, max_len: int) -> None:
        super().__init__()
        self.model, self.max_len = model, max_len

    def forward(self, ids, position, *cache):
        import transformers as hf

        static = hf.StaticCache(config=self.model.config, max_cache_len=self.max_len)
        keys = cache[0]
        static.early_initialization(keys.shape[0], keys.shape[1], keys.shape[3], keys.dtype, keys.device)
        for layer, k, v in zip(static.layers, cache[0::2], cache[1::2], strict=True):
            # transformers 5's StaticLayer: its tensors, and where the next write goes
            layer.keys, layer.values = k.clone(), v.clone()
            layer.cumulative_length = position.reshape(()).clone()
        positions = position.reshape(1, 1) + torch.arange(ids.shape[1]).reshape(1, -1)
        logits = self.model(input_ids=ids, cache=static, position_ids=positions, use_cache=True).logits
        return (logits, *(t for layer in static.layers for t in (layer.keys, layer.values)))


def static_cache(cache, max_len: int) -> list[torch.Tensor]:
    """A transformers ``DynamicCache`` (a prefill's) as :class:`StaticCacheStep`'s cache tensors:
    each layer's keys and values padded with zeros to ``max_len`` positions."""
    padded = []
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            padded.append(torch.nn.functional.pad(t, (0, 0, 0, max_len - t.shape[2])))
    return padded


def decode_step(model: nn.Module, prompt: torch.Tensor, max_len: int):
    """``model`` (a ``make_model`` causal LM) prefills ``prompt`` [B, P] in torch; returns the
    :class:`StaticCacheStep` of its language model, the step's inputs (the greedy next token, the
    position P, the prefill's cache padded to ``max_len``) and the prefill's ``DynamicCache``."""
    lm = model.model if isinstance(model, FirstOutput) else model
    with torch.no_grad():
        prefill = lm(input_ids=prompt, use_cache=True)
    token = prefill.logits[:, -1:].argmax(-1)
    inputs = (token, torch.tensor([prompt.shape[1]]), *static_cache(prefill.cache, max_len))
    return StaticCacheStep(lm, max_len).eval(), inputs, prefill.cache


def decode_and_compare(model: nn.Module, prompt: torch.Tensor, steps: int, *, max_len: int = 16, decompose=True):
    """``model`` (a ``make_model`` causal LM) prefills ``prompt`` [B, P] in torch, then decodes
    ``steps`` greedy tokens twice: in torch with its ``DynamicCache``, and with one build of
    :class:`StaticCacheStep` fed its own cache back. Returns (the build, and per step: Tessera's
    logits, torch's, Tessera's cache tensors, torch's keys and values so far)."""
    from tessera_tvm.relax import build  # first: it makes TileLang's TVM the process's `tvm`

    # isort: split
    from tvm.relax.frontend.torch import from_exported_program

    step, inputs, dynamic = decode_step(model, prompt, max_len)
    lm, (token, _, *cache) = step.model, inputs
    exported = torch.export.export(step, inputs)
    built = build(from_exported_program(exported, keep_params_as_input=False, run_ep_decomposition=decompose), "cpu")
    arrays, results = [t.numpy() for t in cache], []
    for n in range(steps):
        with torch.no_grad():
            expected = lm(input_ids=token, cache=dynamic, use_cache=True).logits
        logits, *arrays = built.run("main", token.numpy(), np.array([prompt.shape[1] + n]), *arrays)
        torchs = [t.numpy() for layer in dynamic.layers for t in (layer.keys, layer.values)]
        results.append((logits, expected.numpy(), arrays, torchs))
        token = expected[:, -1:].argmax(-1)  # torch's token: both go on from the same one
    return built, results


def vit_inputs(model: nn.Module, batch: int = 2) -> tuple[torch.Tensor]:
    """Random images of the size ``model`` (a ``make_model("vit")``) was configured for."""
    config = model.model.config
    return (torch.randn(batch, config.num_channels, config.image_size, config.image_size),)


def build_and_compare(model: nn.Module, inputs: tuple[torch.Tensor, ...], *, decompose: bool = True):
    """``model`` exported, imported (``run_ep_decomposition=decompose``), built for the CPU and run;
    returns (the build, its output and torch's as float32, seconds from import to first result)."""
    from tessera_tvm.relax import build  # first: it makes TileLang's TVM the process's `tvm`

    # isort: split
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        expected = model(*inputs).float().numpy()  # a bf16 model's output compared in float32
    exported = torch.export.export(model, inputs)
    start = time.perf_counter()
    built = build(from_exported_program(exported, keep_params_as_input=False, run_ep_decomposition=decompose), "cpu")
    (got,) = built.run("main", *(t.numpy() for t in inputs))
    return built, got.astype(np.float32), expected, time.perf_counter() - start


def main(names: list[str]) -> None:
    if names[:1] == ["--decode"]:
        for name in names[1:] or ["llama"]:
            built, results = decode_and_compare(make_model(name), torch.randint(0, 256, (2, 5)), 4)
            for n, (got, expected, *_) in enumerate(results):
                print(f"== {name}, decode step {n}: max |tessera - torch| = {np.abs(got - expected).max():.1e}")
        print(built.report)
        return
    for name in names or ["llama"]:
        model = make_model(name)
        ids = torch.randint(0, 256, (2, 12))
        mask = torch.ones(2, 12, dtype=torch.int64)
        mask[1, :3] = 0  # the second sequence padded
        inputs = (ids, mask) if name != "gpt2" else (ids[:1],)  # torch 2.13 cannot decompose batched GPT-2
        if name in ("vit", "deit"):
            inputs = vit_inputs(model)
        for decompose in (True, False):
            built, got, expected, seconds = build_and_compare(model, inputs, decompose=decompose)
            route = "decomposed" if decompose else "not decomposed"
            print(
                f"== {name}, {route}: max |tessera - torch| = {np.abs(got - expected).max():.1e}, built and run in {seconds:.1f} s"
            )
        print(built.report)


if __name__ == "__main__":
    main(sys.argv[1:])
