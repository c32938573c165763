"""GPU targets: the generated sources hold the instructions each architecture is for, and nvcc builds.

Hopper: wgmma + TMA loads (warp-specialised); Ampere: mma.sync + cp.async; ROCm: MFMA (source
only: no hipcc here). Softmax and layer norm reduce across threads (tl::AllReduce) on every GPU.
"""

from __future__ import annotations

import re

import pytest

import tessera as ts
from tessera import Tensor, ops


@ts.kernel
def linear(
    A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16], b: Tensor["N", ts.f16]
) -> Tensor["M", "N", ts.f16]:
    return ops.gelu(ops.matmul(A, W) + b)


@ts.kernel
def causal_attention(
    Q: Tensor["B", "H", "S", "D", ts.bf16],
    K: Tensor["B", "G", "S", "D", ts.bf16],
    V: Tensor["B", "G", "S", "D", ts.bf16],
) -> Tensor["B", "H", "S", "D", ts.bf16]:
    return ops.flash_attention(Q, K, V, causal=True)


@ts.kernel
def attention(
    Q: Tensor["B", "H", "S", "D", ts.f16], K: Tensor["B", "H", "S", "D", ts.f16], V: Tensor["B", "H", "S", "D", ts.f16]
) -> Tensor["B", "H", "S", "D", ts.f16]:
    return ops.flash_attention(Q, K, V)


@ts.kernel
def softmax(x: Tensor["M", "N", ts.f16]) -> Tensor["M", "N", ts.f16]:
    return ops.softmax(x)


@ts.kernel
def layer_norm(x: Tensor["M", "N", ts.f16], w: Tensor["N", ts.f16], b: Tensor["N", ts.f16]) -> Tensor["M", "N", ts.f16]:
    return ops.layer_norm(x, w, b)


SHAPES = {
    "linear": {"M": 1000, "N": 520, "K": 264},
    "causal_attention": {"B": 2, "H": 8, "G": 2, "S": 500, "D": 128},
    "attention": {"B": 1, "H": 4, "S": 300, "D": 64},
    "softmax": {"M": 300, "N": 1000},
    "layer_norm": {"M": 300, "N": 1000},
}
KERNELS = [linear, causal_attention, attention, softmax, layer_norm]
MMA = {"hopper": ["wgmma", "tma_load"], "ampere": ["mma_sync", "cp_async"], "rocm": ["mfma"]}
NOT = {"hopper": ["mma_sync", "mfma"], "ampere": ["wgmma", "tma_load", "mfma"], "rocm": ["wgmma", "mma_sync"]}


@pytest.mark.parametrize("target", ["hopper", "ampere", "rocm"])
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_expected_instructions(target, kernel):
    compiled = ts.compile(kernel, target=target, shapes=SHAPES[kernel.name], build=False)
    source = compiled.source
    assert "__global__" in source
    if kernel in (linear, causal_attention, attention):
        for word in MMA[target]:
            assert word in source, f"{kernel.name} on {target}: {word} missing"
    else:
        assert "tl::AllReduce" in source
    for word in NOT[target]:
        assert word not in source, f"{kernel.name} on {target}: unexpected {word}"
    (meta,) = compiled.metadata
    (sched,) = compiled.schedules
    assert meta["launch"]["grid"] == list(sched.grid)
    assert meta["launch"]["block"][0] == sched.launch_threads
    assert meta["fused_kernel"] == sched.kernel


def test_epilogue_is_in_the_gemm_source():
    source = ts.compile(linear, target="hopper", shapes=SHAPES["linear"], build=False).source
    assert "erf" in source  # gelu_erf applied on the accumulator, not in a second kernel
    assert len(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+, \d+\) )?(\w+)\(", source))) == 1


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "target, ptx_words", [("hopper", ["wgmma.mma_async", "cp.async.bulk.tensor"]), ("ampere", ["mma.sync", "cp.async"])]
)
@pytest.mark.parametrize("kernel", [linear, causal_attention], ids=lambda k: k.name)
def test_nvcc_builds_cubin_and_ptx(target, ptx_words, kernel):
    # No dump: the kernel's lowering from test_expected_instructions is in the run's cache, so only nvcc runs.
    compiled = ts.compile(kernel, target=target, shapes=SHAPES[kernel.name])
    (files,) = compiled.artifacts.values()
    assert files["cubin"].is_file() and files["cubin"].stat().st_size > 0
    ptx = files["ptx"].read_text()
    for word in ptx_words:
        assert word in ptx, f"{kernel.name} on {target}: {word} not in the PTX"
    assert compiled.metadata[0]["resources"].get("regs_per_thread", 0) > 0
