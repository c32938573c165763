"""PyTorch models as users write them, for Tessera's Relax path: a GPT-2 block, a LLaMA-style block,
an MLP classifier and a ResNet basic block.

    python examples/torch_models.py      # import each with TVM's torch frontend at its defaults,
                                         # offload to Tessera on the CPU, compare with torch

The tests (tests/relax/test_torch_models.py) and the benchmark's models section (bench/bench.py)
use these classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import tessera_tvm  # noqa: F401  (TileLang's TVM, before anything imports tvm)


class Gpt2Block(nn.Module):
    """Pre-norm GPT-2 block: causal SDPA over 3 heads, a GELU MLP, two residual adds."""

    def __init__(self, dim: int = 48, heads: int = 3, hidden: int = 96, causal: bool = True) -> None:
        super().__init__()
        self.causal = causal
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class RMSNorm(nn.Module):
    """RMSNorm as LLaMA code writes it by hand."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.w = nn.Parameter(torch.rand(d) + 0.5)
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w


def rope(x, cos, sin):
    """Rotary position embedding, the rotate-half form."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    """RMSNorm, RoPE, grouped-query causal attention (4 query heads, 2 KV heads), a SwiGLU MLP."""

    def __init__(self, d=64, h=4, kv=2, hidden=128, s=16):
        super().__init__()
        self.h, self.kv, self.hd = h, kv, d // h
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.wq, self.wk, self.wv = (
            nn.Linear(d, d, bias=False),
            nn.Linear(d, kv * self.hd, bias=False),
            nn.Linear(d, kv * self.hd, bias=False),
        )
        self.wo = nn.Linear(d, d, bias=False)
        self.w1, self.w3, self.w2 = (
            nn.Linear(d, hidden, bias=False),
            nn.Linear(d, hidden, bias=False),
            nn.Linear(hidden, d, bias=False),
        )
        t = torch.arange(s)[:, None] / (10000 ** (torch.arange(0, self.hd, 2) / self.hd))[None]
        emb = torch.cat((t, t), -1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, x):
        b, s, d = x.shape
        y = self.n1(x)
        q = self.wq(y).view(b, s, self.h, self.hd).transpose(1, 2)
        k = self.wk(y).view(b, s, self.kv, self.hd).transpose(1, 2)
        v = self.wv(y).view(b, s, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, self.cos, self.sin), rope(k, self.cos, self.sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, d))
        y = self.n2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class Mlp(nn.Module):
    """An MLP classifier: three linears with GELU, then a log-softmax over the classes."""

    def __init__(self, dims: tuple[int, ...] = (64, 128, 128, 10)) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = F.gelu(layer(x))
        return F.log_softmax(self.layers[-1](x), dim=-1)


class BasicBlock(nn.Module):
    """ResNet's basic block: conv-bn-relu, conv-bn, plus the input, relu (batch norms at inference,
    with statistics drawn as training would leave them)."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        with torch.no_grad():
            for bn in (self.bn1, self.bn2):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


def import_model(model: nn.Module, *args: torch.Tensor, dynamic_axis: int | None = None, **options):
    """``model`` exported with torch.export and imported with TVM's own frontend, as a TVM user does
    (its defaults unless ``options``; the weights become constants). ``dynamic_axis``: that axis of
    the first input is exported as a dynamic dim (2 to 1024; 1 is the sequence of a [B, S, D] input)."""
    from tvm.relax.frontend.torch import from_exported_program

    shapes = None
    if dynamic_axis is not None:
        dim = torch.export.Dim("dynamic", min=2, max=1024)
        shapes = ({dynamic_axis: dim},) + (None,) * (len(args) - 1)
    exported = torch.export.export(model.eval(), args, dynamic_shapes=shapes)
    return from_exported_program(exported, keep_params_as_input=False, **options)


def main() -> None:
    import numpy as np

    from tessera_tvm.relax import build

    torch.manual_seed(0)
    cases = {
        "GPT-2 block": (Gpt2Block(), torch.randn(2, 24, 48)),
        "LLaMA block": (LlamaBlock(), torch.randn(2, 16, 64)),
        "MLP": (Mlp(), torch.randn(32, 64)),
        "ResNet basic block": (BasicBlock(), torch.randn(2, 16, 10, 10)),
    }
    for name, (model, x) in cases.items():
        built = build(import_model(model, x), "cpu")
        (got,) = built.run("main", x.numpy())
        with torch.no_grad():
            error = float(np.abs(got - model.eval()(x).numpy()).max())
        print(f"== {name}: max |tessera - torch| = {error:.1e}")
        print(built.report)


if __name__ == "__main__":
    main()
