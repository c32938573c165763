"""The models the Relax integration tests use: a small transformer block and its numpy reference."""

from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path

import numpy as np

import tessera_tvm  # noqa: F401  (TileLang's TVM first)
from tessera_tvm import tvm

nn = tvm.relax.frontend.nn
op = nn.op

# Small on purpose (CPU kernels are scalar C loops), and not multiples of the CPU tiles (64x64x32 GEMM,
# 32x64 attention), so the masked edges run: tokens 2 x 24, model dim 48, 3 heads of 16, MLP 80.
# (Head dim 16: the GPU attention kernels step D in MMA tiles of 16.)
BATCH, SEQ, DIM, HEADS, HIDDEN = 2, 24, 48, 3, 80


class TransformerBlock(nn.Module):
    """Pre-norm block: x + proj(causal_attention(ln1(x))), then + fc2(gelu(fc1(ln2(.))))."""

    def __init__(self, dim: int = DIM, heads: int = HEADS, hidden: int = HIDDEN) -> None:
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.heads, self.head_dim = heads, dim // heads

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        b, s, d = x.shape
        qkv = op.reshape(self.qkv(self.ln1(x)), [b, s, 3, self.heads, self.head_dim])
        q, k, v = (op.reshape(t, [b, s, self.heads, self.head_dim]) for t in op.split(qkv, 3, axis=2))
        attn = op.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(op.reshape(attn, [b, s, d]))
        return x + self.fc2(op.gelu(self.fc1(self.ln2(x))))


def block_module(dtype: str = "float32"):
    """(IRModule with `forward(x, *params)`, [(param name, shape)])."""
    block = TransformerBlock()
    if dtype != "float32":
        block.to(dtype)
    mod, params = block.export_tvm({"forward": {"x": nn.spec.Tensor([BATCH, SEQ, DIM], dtype)}})
    return mod, [(name, tuple(int(d) for d in p.shape)) for name, p in params]


def block_inputs(params, seed: int = 0) -> list[np.ndarray]:
    """x and every parameter: N(0, 1) activations, N(0, 0.2) weights, LayerNorm gains near 1."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((BATCH, SEQ, DIM)).astype(np.float32)]
    for name, shape in params:
        value = rng.standard_normal(shape) * 0.2
        arrays.append((value + 1.0 if name.startswith("ln") and name.endswith("weight") else value).astype(np.float32))
    return arrays


_erf = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def causal_attention(q, k, v):
    """[B, S, H, D] in and out; query i sees keys j <= i; scale 1/sqrt(D)."""
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    s = q.shape[1]
    scores = np.where(np.tril(np.ones((s, s), dtype=bool)), scores, -np.inf)
    return np.einsum("bhqk,bkhd->bqhd", softmax(scores), v)


def block_reference(x, ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b):
    """The block in float64 numpy (nn.Linear computes x @ W^T + b)."""
    x = x.astype(np.float64)
    b, s, d = x.shape
    qkv = (layer_norm(x, ln1_w, ln1_b) @ qkv_w.T + qkv_b).reshape(b, s, 3, HEADS, d // HEADS)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    x = x + causal_attention(q, k, v).reshape(b, s, d) @ proj_w.T + proj_b
    return x + gelu(layer_norm(x, ln2_w, ln2_b) @ fc1_w.T + fc1_b) @ fc2_w.T + fc2_b


@functools.cache
def example(name: str):
    """``examples/<name>.py`` as a module, loaded once (the tests run what the README's examples run)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[2] / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torch_models():
    """examples/torch_models.py (the GPT-2 block, the LLaMA block and the MLP in PyTorch)."""
    return example("torch_models")


def module_sources(module) -> list[str]:
    """The source of ``module`` and of every module it imports, where one has source (the VM
    executable and a library's object code have none)."""
    out = []
    for imported in module.imports:
        out += module_sources(imported)
    try:
        out.append(module.inspect_source())
    except Exception:  # noqa: BLE001 - a module without source
        pass
    return out
