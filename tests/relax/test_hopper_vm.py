"""Relax executables built for Hopper: their TMA kernels launched from the VM.

TileLang's host code encodes each TMA descriptor into a stack array that TVM's C host codegen left
16-byte aligned, and the driver wants 64: every model of the bench's gpu-models section stopped at
its first GEMM on an H200 ("tensorMap address must be 64-byte aligned", 2026-11-30).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tessera_tvm
from tessera_tvm.relax import build

from .models import module_sources

from_exported_program = pytest.importorskip("tvm.relax.frontend.torch").from_exported_program


def _linear():
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256).to(torch.bfloat16).eval()
    return model, (torch.randn(128, 256, dtype=torch.bfloat16),)


@pytest.fixture(scope="module")
def built():
    model, inputs = _linear()
    exported = torch.export.export(model, inputs)
    return model, inputs, build(from_exported_program(exported, keep_params_as_input=False), "hopper")


def test_each_tma_descriptor_the_host_encodes_starts_at_a_64_byte_boundary(built):
    _, _, module = built
    assert module.report.offloaded  # the GEMM is a Tessera kernel with TMA loads
    source = next(s for s in module_sources(module.executable.mod) if "__tvm_tensormap_create_tiled" in s)  # the host C
    descriptors = set(re.findall(r"\bvoid\* (\w+_desc) = ", source))
    assert len(descriptors) >= 2, source[:2000]  # A and B
    for name in descriptors:
        (definition,) = re.findall(rf"\bvoid\* {name} = (.*);", source)
        # the stack array's address rounded up to the next multiple of 64
        assert f"(char*){name}_stack + " in definition and "& (uint64_t)63" in definition, definition
        (stack,) = re.findall(rf"\bvoid\* {name}_stack = (\w+);", source)
        (count,) = re.findall(rf"TVMFFIAny {stack}\[(\d+)\];", source)
        assert int(count) * 16 >= 128 + 64  # the 128-byte descriptor fits after the skip


@pytest.mark.gpu
def test_a_bf16_linear_built_for_hopper_runs_in_the_vm_and_matches_torch(built):
    model, inputs, module = built
    tvm = tessera_tvm._tvm.tvm
    with torch.no_grad():
        expected = model(*inputs).float().numpy()
    got = module.vm(tvm.cuda())["main"](*(tvm.runtime.from_dlpack(t.cuda()) for t in inputs))
    result = torch.from_dlpack(got if hasattr(got, "shape") else got[0]).float().cpu().numpy()  # a tensor or (tensor,)
    np.testing.assert_allclose(result, expected, rtol=2e-2, atol=2e-2)
