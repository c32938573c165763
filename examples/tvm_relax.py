"""Tessera inside TVM: offload a relax.frontend.nn transformer block to Tessera kernels, tvm.compile it.

python examples/tvm_relax.py                   # CPU: partition, tvm.compile, run in the Relax VM, check numpy
python examples/tvm_relax.py --target hopper   # the same module in fp16: CUDA sources (+ cubins with nvcc)
python examples/tvm_relax.py --target rocm     # HIP sources of the Tessera kernels (no HIP codegen in TVM here)

The steps are TVM's own: a Relax module, `partition_for_tessera` (like `partition_for_cutlass`),
`tvm.compile(mod, target, tir_pipeline="tessera.<config>")`, `relax.VirtualMachine`.

In an environment with upstream apache-tvm instead of tilelang (./tessera.sh apache-tvm makes one),
the same script offloads through Tessera's toolchain process and builds the rest with upstream's
LLVM: `tvm.compile(mod, "llvm")` (CPU config only).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import numpy as np

import tessera_tvm  # first: makes TileLang's TVM the process's `tvm` (or, with apache-tvm, the upstream API)

# isort: split
import tvm

relax = tvm.relax
nn = relax.frontend.nn
op = nn.op


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a GELU MLP, both residual."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 128) -> None:
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.heads, self.head_dim = heads, dim // heads

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        b, s, d = x.shape
        qkv = op.reshape(self.qkv(self.ln1(x)), [b, s, 3, self.heads, self.head_dim])
        q, k, v = (op.reshape(t, [b, s, self.heads, self.head_dim]) for t in op.split(qkv, 3, axis=2))
        x = x + self.proj(op.reshape(op.scaled_dot_product_attention(q, k, v, is_causal=True), [b, s, d]))
        return x + self.fc2(op.gelu(self.fc1(self.ln2(x))))


def reference(x, p: dict[str, np.ndarray], heads: int = 4):
    """The block in float64 numpy (``p``: parameters by name; nn.Linear computes x @ W^T + b)."""

    def norm(t, w, b):
        mean, var = t.mean(-1, keepdims=True), t.var(-1, keepdims=True)
        return (t - mean) / np.sqrt(var + 1e-5) * w + b

    erf = np.vectorize(math.erf)
    x = x.astype(np.float64)
    b, s, d = x.shape
    qkv = (norm(x, p["ln1.weight"], p["ln1.bias"]) @ p["qkv.weight"].T + p["qkv.bias"]).reshape(b, s, 3, heads, -1)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // heads)
    scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    attn = np.einsum("bhqk,bkhd->bqhd", probs / probs.sum(-1, keepdims=True), v).reshape(b, s, d)
    x = x + attn @ p["proj.weight"].T + p["proj.bias"]
    h = norm(x, p["ln2.weight"], p["ln2.bias"]) @ p["fc1.weight"].T + p["fc1.bias"]
    return x + (0.5 * h * (1 + erf(h / math.sqrt(2)))) @ p["fc2.weight"].T + p["fc2.bias"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cpu", help="a Tessera config: cpu, hopper, ampere, rocm or a YAML path")
    target = parser.parse_args().target
    if tessera_tvm.UPSTREAM:
        return main_upstream(target)
    dtype = "float32" if tessera_tvm.load_config(target).tvm_kind == "c" else "float16"

    block = Block()
    if dtype != "float32":
        block.to(dtype)
    mod, params = block.export_tvm({"forward": {"x": nn.spec.Tensor([2, 40, 64], dtype)}})

    mod, report = tessera_tvm.partition_for_tessera(mod, target)
    print(report, end="\n\n")

    if report.target.kind.name == "hip":  # TVM here cannot compile what it keeps for HIP: show Tessera's part
        for name, source in tessera_tvm.relax.device_sources(mod, target).items():
            print(f"{name}: {len(source.splitlines())} lines of HIP, MFMA: {'mfma' in source}")
        return

    with report.target:  # TVM's nvcc callback reads the GPU arch from the current target
        ex = tvm.compile(mod, report.target, relax_pipeline=report.relax_pipeline, tir_pipeline=report.tir_pipeline)
    for name, source in tessera_tvm.relax.kernel_sources(ex, report.kernels).items():
        print(f"{name}: {len(source.splitlines())} lines of device source")
    if report.target.kind.name != "c":
        return  # GPU: the executable holds the cubins; run it with relax.VirtualMachine(lib, tvm.cuda())

    library = Path(tempfile.mkdtemp(prefix="tessera_relax_")) / "block.so"
    tessera_tvm.relax.export_library(ex, library, target)  # one object per source, kept in the cache
    check(library, params)


def inputs(params, seed: int = 0) -> list[np.ndarray]:
    """x [2, 40, 64] and the block's parameters: small weights, LayerNorm gains around 1."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((2, 40, 64)).astype(np.float32)]
    for name, param in params:
        value = rng.standard_normal([int(d) for d in param.shape]) * 0.2
        arrays.append((value + 1.0 if name in ("ln1.weight", "ln2.weight") else value).astype(np.float32))
    return arrays


def check(library: Path, params) -> float:
    """Load the exported ``library`` in the Relax VM, run ``forward``, print and return the largest
    difference from the numpy reference."""
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())
    arrays = inputs(params)
    out = vm["forward"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    ref = reference(arrays[0], {name: a for (name, _), a in zip(params, arrays[1:], strict=True)})
    error = float(np.abs(out - ref).max())
    print(f"\nmax |VM - numpy| = {error:.2e}")
    return error


def main_upstream(target: str) -> None:
    """Upstream apache-tvm: Tessera offloads through its toolchain process, LLVM builds the rest."""
    mod, params = Block().export_tvm({"forward": {"x": nn.spec.Tensor([2, 40, 64], "float32")}})
    mod, report = tessera_tvm.partition_for_tessera(mod, target)
    print(report, end="\n\n")
    ex = tvm.compile(mod, "llvm")
    library = Path(tempfile.mkdtemp(prefix="tessera_relax_")) / "block.so"
    tessera_tvm.export_library(ex, library, target)  # kernels linked in, one object per source, cached
    check(library, params)


if __name__ == "__main__":
    main()
