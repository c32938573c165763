"""tessera_tvm.lower: sources with the expected instructions, artifacts, dumps and the pass log."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tessera_tvm
from tests.programs import gemm as programs


@pytest.fixture(scope="module")
def gemm_fp16():
    # 1024^3 fp16 GEMM, 128x128x32 tiles, 3 stages: the reference kernel.
    return programs.gemm(1024, 1024, 1024, 128, 128, 32, stages=3)


@pytest.fixture(scope="module")
def hopper_build(gemm_fp16, tmp_path_factory):
    out = tmp_path_factory.mktemp("hopper")
    return tessera_tvm.lower(gemm_fp16, "hopper", out_dir=out / "art", dump_dir=out / "dump"), out


def test_hopper_source_uses_wgmma_and_tma(hopper_build):
    lowered, _ = hopper_build
    assert "wgmma" in lowered.source
    assert "tma_load" in lowered.source
    assert "warpgroup_reg_alloc" in lowered.source  # setmaxnreg for the warp-specialised roles


def test_ampere_source_uses_mma_and_cp_async(gemm_fp16):
    src = tessera_tvm.lower(gemm_fp16, "ampere", build=False).source
    assert "mma_sync" in src and "cp_async_gs" in src
    assert "wgmma" not in src and "tma_load" not in src


def test_rocm_source_uses_mfma(gemm_fp16):
    src = tessera_tvm.lower(gemm_fp16, "rocm").source
    assert "mfma_f32" in src and "hip_runtime.h" in src


def test_dump_dir_has_every_pass_numbered_and_a_timing_table(hopper_build):
    lowered, out = hopper_build
    dump = out / "dump"
    files = sorted(p.name for p in dump.glob("[0-9][0-9][0-9]_*.py"))
    assert files[0] == "000_input.py"
    ran = [r for r in lowered.pass_log if r.status == "ran"]
    assert len(files) == len(ran) + 1
    layout = [r for r in lowered.pass_log if r.name == "tl.LayoutInference"][0]
    assert (dump / f"{layout.index:03d}_tl.LayoutInference.py").is_file()
    assert "layout" in (dump / f"{layout.index:03d}_tl.LayoutInference.py").read_text().lower()
    timing = (dump / "timing.txt").read_text()
    assert "tl.LayoutInference" in timing and "total" in timing


def test_pass_log_follows_the_config(hopper_build):
    lowered, _ = hopper_build
    names = [r.name for r in lowered.pass_log]
    assert names == tessera_tvm.pass_names("hopper")
    assert {r.phase for r in lowered.pass_log} == {"lower_and_legalize", "optimize_for_target", "codegen_prep"}
    assert all(r.seconds >= 0 for r in lowered.pass_log)
    fuse = [r for r in lowered.pass_log if r.name == "tl.FuseMBarrierArriveExpectTx"][0]
    assert fuse.status == "ran"  # the GEMM's copies became TMA, so ir.has_tma held


def test_ir_condition_skips_when_false():
    # An element-wise kernel has no TMA copies: the conditional pass is logged as skipped.
    lowered = tessera_tvm.lower(programs.elementwise_add(256, 256), "hopper", build=False)
    fuse = [r for r in lowered.pass_log if r.name == "tl.FuseMBarrierArriveExpectTx"][0]
    assert fuse.status == "skipped (ir.has_tma is false)"


def test_artifacts_and_host_ir(hopper_build):
    lowered, out = hopper_build
    art = lowered.artifacts
    assert art["source"].read_text() == lowered.source and art["source"].suffix == ".cu"
    assert "T.call_packed" in lowered.host_ir or "main_kernel" in lowered.host_ir
    meta = json.loads(art["metadata"].read_text())
    assert meta[0]["name"] == "main_kernel"
    assert "tl.LayoutInference" in art["passes"].read_text()


@pytest.mark.nvcc
def test_hopper_cubin_builds_for_sm_90a(hopper_build):
    lowered, _ = hopper_build
    assert lowered.artifacts["cubin"].stat().st_size > 0
    ptx = lowered.artifacts["ptx"].read_text()
    assert ".target sm_90a" in ptx and "setmaxnreg" in ptx
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert lowered.metadata[0]["resources"]["regs_per_thread"] > 0


@pytest.mark.nvcc
def test_ampere_cubin_builds_for_sm_80(gemm_fp16, tmp_path):
    lowered = tessera_tvm.lower(gemm_fp16, "ampere", out_dir=tmp_path)
    ptx = lowered.artifacts["ptx"].read_text()
    assert ".target sm_80" in ptx and "mma.sync" in ptx and "cp.async" in ptx
    assert lowered.artifacts["cubin"].stat().st_size > 0


def test_missing_nvcc_writes_source_and_says_so(gemm_fp16, tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_NVCC", str(tmp_path / "no-such-nvcc"))
    lowered = tessera_tvm.lower(gemm_fp16, "ampere", out_dir=tmp_path / "out")
    assert lowered.artifacts["source"].is_file()
    assert "cubin" not in lowered.artifacts
    assert any("nvcc not on PATH" in note for note in lowered.notes)


def test_rocm_writes_hip_source_only(gemm_fp16, tmp_path):
    lowered = tessera_tvm.lower(gemm_fp16, "rocm", out_dir=tmp_path)
    assert lowered.artifacts["source"].name.endswith(".hip.cpp")
    assert any("generated sources are the artifacts" in note for note in lowered.notes)


@pytest.mark.parametrize("shape", [(256, 192, 128), (100, 70, 45)])
def test_cpu_gemm_matches_numpy(shape, tmp_path):
    M, N, K = shape
    lowered = tessera_tvm.lower(programs.cpu_gemm(M, N, K), "cpu", out_dir=tmp_path)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = np.zeros((M, N), np.float32)
    lowered(a, b, c)
    # float32 sums of K products in a different order than BLAS: error grows ~ sqrt(K) * eps * |a||b|.
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4 * np.sqrt(K))
    assert lowered.artifacts["library"].suffix == ".so"


def test_cpu_kernel_checks_its_arguments(tmp_path):
    lowered = tessera_tvm.lower(programs.cpu_gemm(64, 64, 64), "cpu", out_dir=tmp_path)
    a = np.zeros((64, 64), np.float32)
    with pytest.raises(tessera_tvm.TesseraError, match="B"):
        lowered(a, np.zeros((32, 64), np.float32), np.zeros((64, 64), np.float32))
    with pytest.raises(tessera_tvm.TesseraError, match="float32"):
        lowered(a, a.astype(np.float64), a.copy())


def test_gpu_kernels_do_not_run_in_process(gemm_fp16):
    lowered = tessera_tvm.lower(gemm_fp16, "rocm")
    with pytest.raises(tessera_tvm.TesseraError, match="only CPU configs and built CUDA kernels run in-process"):
        lowered(np.zeros(1))


def test_lower_rejects_non_programs():
    with pytest.raises(tessera_tvm.TesseraError, match="expects a TileLang PrimFunc"):
        tessera_tvm.lower("not a program", "cpu")


def test_verify_resources_rejects_too_much_shared_memory(gemm_fp16, tmp_path):
    import yaml

    data = yaml.safe_load(open(tessera_tvm.load_config("hopper").source))
    data["name"] = "hopper_small_smem"
    data["resources"]["shared_memory_per_block"] = 32768  # the 3-stage 128x128x32 GEMM needs ~48 KiB
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(tessera_tvm.ResourceError) as err:
        tessera_tvm.lower(gemm_fp16, path, out_dir=tmp_path / "out")
    msg = str(err.value)
    assert "kernel 'main_kernel' needs 49200 bytes of shared memory" in msg
    assert "target 'hopper_small_smem' allows at most 32768" in msg
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_cpu_call_takes_the_programs_parameter_order(tmp_path):
    # The C kernel's parameters come out of the host/device split sorted differently (A, B, C, bias):
    # callers still pass arrays in the tile program's order, or by buffer name.
    lowered = tessera_tvm.lower(programs.cpu_gemm_bias(64, 48, 32), "cpu", out_dir=tmp_path)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 32), dtype=np.float32)
    b = rng.standard_normal((32, 48), dtype=np.float32)
    bias = rng.standard_normal((48,), dtype=np.float32)
    c = np.zeros((64, 48), np.float32)
    lowered(a, b, bias, c)
    np.testing.assert_allclose(c, a @ b + bias, rtol=1e-4, atol=1e-4)
    c2 = np.zeros_like(c)
    lowered(C=c2, bias=bias, A=a, B=b)
    np.testing.assert_array_equal(c, c2)
    with pytest.raises(tessera_tvm.TesseraError, match="missing array"):
        lowered(a, b)


@pytest.mark.parametrize("config", ["hopper", "rocm", "cpu"])
def test_lowering_leaves_the_callers_program_unchanged(config):
    # Some TileLang passes rename Vars in place: each phase works on a copy of its input module.
    if config == "cpu":
        program = programs.cpu_gemm(256, 256, 256)
    else:
        program = programs.gemm(256, 256, 256, 128, 128, 32, stages=2)
    before = tessera_tvm.tvm.ir.save_json(program)
    tessera_tvm.lower(program, config, build=False)
    assert tessera_tvm.tvm.ir.save_json(program) == before
