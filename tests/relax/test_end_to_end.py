"""A relax.frontend.nn transformer block, offloaded to Tessera, compiled by tvm.compile, run in the VM.

CPU: numerics against a float64 numpy reference, and the VM calls Tessera's kernels (not TVM's).
Hopper / Ampere: the same module (fp16) compiles, nvcc builds every kernel, and each Tessera kernel
is in a device source with its architecture's instructions. ROCm: TVM in this build has no HIP code
generator for the operators it keeps, which tvm.compile reports before any codegen; the Tessera
kernels' HIP sources come from the same pipeline through device_sources.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessera_tvm
from tessera_tvm import tvm
from tessera_tvm.relax import PipelineError, build, compile_module, device_sources, partition_for_tessera

from .models import block_inputs, block_module, block_reference

#: What the offload of the block must give: 4 linears (3 with fused epilogues), attention, 2 norms.
EXPECTED_OPS = sorted(
    [
        "layer_norm",
        "matmul + add",
        "attention",
        "matmul + add + add",
        "layer_norm",
        "matmul + add + gelu",
        "matmul + add + add",
    ]
)
#: Instructions each GPU target's kernels must use (the Tile IR tests check them per kernel kind).
GEMM_INSTRUCTIONS = {"hopper": ["wgmma"], "ampere": ["mma_sync", "cp_async"], "rocm": ["mfma"]}


def test_cpu_block_matches_numpy(cpu_block):
    built, params = cpu_block
    arrays = block_inputs(params)
    out = built.run("forward", *arrays)
    ref = block_reference(*arrays)
    # float32 kernels against float64: summation order and libm erf/exp, over K <= 80 terms of O(1)
    # values, stay below 1e-4; a wrong mask, transpose or epilogue is off by O(0.1).
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_cpu_block_uses_tessera_kernels(cpu_block):
    built, _ = cpu_block
    assert sorted(o.ops for o in built.report.offloaded) == EXPECTED_OPS
    left = {n.op for n in built.report.not_offloaded}
    assert left <= {"R.reshape", "R.split", "R.permute_dims"}, built.report
    # The VM calls Tessera's kernels, and TVM built no matmul, norm or attention of its own.
    called = set(re.findall(r"call\s+(\w+)", built.executable.as_text()))
    assert set(built.report.kernels) <= called
    assert not {name for name in called if re.search(r"matmul|layer_norm|attention|gelu", name)} - set(
        built.report.kernels
    )
    sources = built.kernel_sources()
    assert sorted(sources) == built.report.kernels
    for name, source in sources.items():
        assert f"{name}_kernel(" in source


def _check_cuda_sources(sources: dict, kernels: list, target: str) -> None:
    assert sorted(sources) == kernels
    for name, source in sources.items():
        assert re.search(rf"__global__ void (?:__launch_bounds__\(\d+(?:, \d+)?\) )?{name}_kernel\(", source)
        if name.startswith("tessera_matmul"):
            for word in GEMM_INSTRUCTIONS[target]:
                assert word in source, f"{name} on {target}: {word} missing"


@pytest.mark.nvcc
def test_gpu_block_compiles_with_tessera_kernels():
    mod, _ = block_module("float16")
    built = build(mod, "hopper")
    assert sorted(o.ops for o in built.report.offloaded) == EXPECTED_OPS
    sources = built.kernel_sources()
    _check_cuda_sources(sources, built.report.kernels, "hopper")
    # nvcc built the Tessera kernels: the CUDA modules carry a binary, so the library exports.
    kinds = [m.kind for m in _modules(built.executable.mod)]
    assert kinds.count("cuda") == len(sources) + 1  # one per Tessera kernel + TVM's own kernels


def test_ampere_block_sources_take_the_ampere_instructions():
    # The same block for Ampere, sources only: the executable's build is the Hopper test's code path,
    # and nvcc builds Ampere kernels in tests/frontend/test_gpu_artifacts.py (~7 s less here).
    mod, _ = block_module("float16")
    partitioned, report = partition_for_tessera(mod, "ampere")
    assert sorted(o.ops for o in report.offloaded) == EXPECTED_OPS
    _check_cuda_sources(device_sources(partitioned, "ampere"), report.kernels, "ampere")


def test_rocm_reports_what_tvm_cannot_build_and_sources_come_from_the_same_path():
    mod, _ = block_module("float16")
    partitioned, report = partition_for_tessera(mod, "rocm")
    assert sorted(o.ops for o in report.offloaded) == EXPECTED_OPS
    with pytest.raises(PipelineError, match=r"no code generator for target kind 'hip'.*device_sources"):
        compile_module(partitioned, "rocm")
    sources = device_sources(partitioned, "rocm")
    assert sorted(sources) == report.kernels
    for name, source in sources.items():
        assert f"{name}_kernel" in source
        if name.startswith("tessera_matmul"):
            assert "mfma" in source


def test_hopper_sources_without_nvcc_match_tessera_lower():
    """device_sources is tessera_tvm.lower's source: the pipeline adds no second lowering path."""
    from tessera_tvm.relax.pipeline import tile_program

    mod, _ = block_module("float16")
    partitioned, report = partition_for_tessera(mod, "hopper")
    sources = device_sources(partitioned, "hopper")
    name = next(k for k in report.kernels if k.startswith("tessera_matmul_add_gelu"))
    lowered = tessera_tvm.lower(tile_program(partitioned[name]), "hopper", build=False)
    assert sources[name] == lowered.source
    assert "wgmma" in sources[name]


def _modules(module):
    yield module
    for imported in module.imports:
        yield from _modules(imported)


def test_compiled_module_runs_from_an_exported_library(cpu_block, tmp_path):
    """The plain TVM route: export_library (no extra options needed), load_module, VirtualMachine."""
    built, params = cpu_block
    path = tmp_path / "block.so"
    built.executable.export_library(str(path))  # TileLang's header is included by absolute path
    vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
    arrays = block_inputs(params, seed=1)
    out = vm["forward"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    np.testing.assert_allclose(out, block_reference(*arrays), rtol=1e-4, atol=1e-4)
