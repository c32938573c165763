"""The default configs produce exactly the device source ``tilelang.lower`` produces.

Tessera's pipelines are TileLang's pass order expressed as config data; any drift (a pass missing,
reordered or given different arguments) shows up here as a source diff.
"""

from __future__ import annotations

import difflib

import pytest

import tessera_tvm
from tessera_tvm._tvm import tilelang, tvm
from tests.programs import gemm as programs

TARGETS = {
    "hopper": {"kind": "cuda", "arch": "sm_90a"},
    "ampere": {"kind": "cuda", "arch": "sm_80"},
    "rocm": {"kind": "hip", "mcpu": "gfx942"},
}

GPU_PROGRAMS = {
    "gemm_fp16_1024": lambda: programs.gemm(1024, 1024, 1024, 128, 128, 32, stages=3),
    "gemm_bias_relu_transposed": lambda: programs.gemm_bias_relu(512, 384, 256),
    "softmax_rows": lambda: programs.softmax_rows(256, 1024),
    "elementwise_add_ragged": lambda: programs.elementwise_add(300, 200),
}

CPU_PROGRAMS = {
    "cpu_gemm": lambda: programs.cpu_gemm(256, 192, 128),
    "elementwise_add_ragged": lambda: programs.elementwise_add(300, 200),
}


def _assert_same(ours: str, theirs: str, what: str) -> None:
    if ours != theirs:
        diff = "".join(
            list(
                difflib.unified_diff(
                    theirs.splitlines(True), ours.splitlines(True), "tilelang.lower", "tessera_tvm.lower"
                )
            )[:60]
        )
        pytest.fail(f"{what}: source differs from tilelang.lower\n{diff}")


@pytest.mark.parametrize("config", sorted(TARGETS))
@pytest.mark.parametrize("program", sorted(GPU_PROGRAMS))
def test_gpu_source_identical(config, program):
    func = GPU_PROGRAMS[program]()
    # TileLang's own lowering of some kernels needs a target context (DESIGN.md section 3).
    with tvm.target.Target(TARGETS[config]) as target:
        theirs = tilelang.lower(func, target=target).kernel_source
    ours = tessera_tvm.lower(func, config, build=False).source
    _assert_same(ours, theirs, f"{program} on {config}")


# Deliberately differs from TileLang on the CPU: the cpu config ends CodegenPrep with two Tessera
# passes that run the kernel grid as an OpenMP region and include tessera/cpu.h (configs/cpu.yaml).
# Without them (and tessera.MarkParallelGrid's loop annotations print nothing) the source is TileLang's.
CPU_ADDITIONS = ["tessera.LowerParallelGrid", "tessera.ImportCpuRuntime"]


@pytest.mark.parametrize("program", sorted(CPU_PROGRAMS))
def test_cpu_source_identical_without_the_parallel_region(program):
    func = CPU_PROGRAMS[program]()
    with tvm.target.Target("c") as target:
        theirs = tilelang.lower(func, target=target).kernel_source
    with tvm.transform.PassContext(disabled_pass=CPU_ADDITIONS):
        ours = tessera_tvm.lower(func, "cpu", build=False).source
    _assert_same(ours, theirs, f"{program} on cpu")


@pytest.mark.parametrize("program", sorted(CPU_PROGRAMS))
def test_cpu_source_differs_by_the_parallel_region(program):
    func = CPU_PROGRAMS[program]()
    with tvm.target.Target("c") as target:
        theirs = tilelang.lower(func, target=target).kernel_source
    ours = tessera_tvm.lower(func, "cpu", build=False).source
    assert ours != theirs
    assert "#include <tessera/cpu.h>" in ours and "#include <tessera/cpu.h>" not in theirs
    assert ours.count("TESSERA_PARALLEL_BEGIN(") == 1 and ours.count("TESSERA_PARALLEL_END()") == 1


def test_a_config_that_differs_gives_different_source(tmp_path):
    """The check above can fail: dropping warp specialisation changes the Hopper kernel."""
    import yaml

    data = yaml.safe_load(open(tessera_tvm.load_config("hopper").source))
    data["name"] = "hopper_no_ws"
    data["features"]["warp_specialization"] = False
    path = tmp_path / "hopper_no_ws.yaml"
    path.write_text(yaml.safe_dump(data))
    func = GPU_PROGRAMS["gemm_fp16_1024"]()
    ws = tessera_tvm.lower(func, "hopper", build=False).source
    no_ws = tessera_tvm.lower(func, path, build=False).source
    assert ws != no_ws
    assert "warpgroup_reg_alloc" in ws and "warpgroup_reg_alloc" not in no_ws
