"""PyTorch models as users write them, for Tessera's Relax path: a GPT-2 block, a LLaMA-style block,
an MLP classifier, a ResNet basic block, ResNet-18 and MobileNetV2's inverted residual block.

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


def _batch_norm(channels: int) -> nn.BatchNorm2d:
    """A batch norm at inference with statistics drawn as training would leave them."""
    norm = nn.BatchNorm2d(channels)
    with torch.no_grad():
        norm.running_mean.uniform_(-0.5, 0.5)
        norm.running_var.uniform_(0.5, 2.0)
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.2, 0.2)
    return norm


class BasicBlock(nn.Module):
    """ResNet's basic block: conv-bn-relu, conv-bn, plus the input (through a strided 1x1 conv-bn
    when the block changes the shape), relu."""

    def __init__(self, channels: int = 16, out_channels: int | None = None, stride: int = 1) -> None:
        super().__init__()
        out_channels = out_channels or channels
        self.conv1 = nn.Conv2d(channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn1, self.bn2 = _batch_norm(out_channels), _batch_norm(out_channels)
        self.downsample = None
        if stride != 1 or out_channels != channels:
            shortcut = nn.Conv2d(channels, out_channels, 1, stride=stride, bias=False)
            self.downsample = nn.Sequential(shortcut, _batch_norm(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        skip = x if self.downsample is None else self.downsample(x)
        return F.relu(skip + self.bn2(self.conv2(y)))


class ResNet18(nn.Module):
    """ResNet-18: a strided 7x7 stem, max pooling, four stages of two basic blocks, global average
    pooling and a linear classifier (``width`` channels in the first stage; torchvision's is 64)."""

    def __init__(self, width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), _batch_norm(width)
        blocks, channels = [], width
        for stage in range(4):
            out = width << stage
            blocks += [BasicBlock(channels, out, 1 if stage == 0 else 2), BasicBlock(out)]
            channels = out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn(self.stem(x))), 3, stride=2, padding=1)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.blocks(x), 1), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2's inverted residual block: a 1x1 expansion, a depthwise 3x3 (each with a batch norm
    and ReLU6), a 1x1 projection with its norm, plus the input when the shape allows."""

    def __init__(self, channels: int = 16, out_channels: int | None = None, expand: int = 6, stride: int = 1) -> None:
        super().__init__()
        out_channels = out_channels or channels
        hidden = channels * expand
        self.expand = nn.Sequential(nn.Conv2d(channels, hidden, 1, bias=False), _batch_norm(hidden), nn.ReLU6())
        self.depthwise = nn.Sequential(
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), _batch_norm(hidden), nn.ReLU6()
        )
        self.project = nn.Sequential(nn.Conv2d(hidden, out_channels, 1, bias=False), _batch_norm(out_channels))
        self.residual = stride == 1 and out_channels == channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.depthwise(self.expand(x)))
        return x + y if self.residual else y


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
        "ResNet-18 (width 16)": (ResNet18(16, 10), torch.randn(1, 3, 64, 64)),
        "MobileNetV2 inverted residual": (InvertedResidual(16), torch.randn(1, 16, 28, 28)),
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
