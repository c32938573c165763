"""GEMM tile programs: CPU numerics against numpy (edges, epilogues, batches), GPU artifacts."""

from __future__ import annotations

import numpy as np
import pytest

import tessera_tvm
from tessera_tvm.tile import EpilogueOp, GemmSpec, TileSchedule, build_tile_program
from tests.tile.conftest import erf

from .conftest import as64, assert_close, random_inputs, run_cpu

BIAS_GELU = (EpilogueOp("bias", operand="bias"), EpilogueOp("gelu_erf"))
EVERY_STEP = (
    EpilogueOp("scale", value=0.5),
    EpilogueOp("add_scalar", value=0.25),
    EpilogueOp("max_scalar", value=-0.5),  # a clip to [-0.5, 1.5] (ReLU6's form)
    EpilogueOp("min_scalar", value=1.5),
    EpilogueOp("residual", operand="res"),
    EpilogueOp("gate", operand="gate"),
    EpilogueOp("tanh"),
    EpilogueOp("cast", dtype="float16"),
    EpilogueOp("silu"),
    EpilogueOp("sigmoid"),
    EpilogueOp("relu"),
    EpilogueOp("exp"),
    EpilogueOp("gelu_tanh"),
    EpilogueOp("gelu_quick"),
)


def reference(spec: GemmSpec, arrays: dict) -> np.ndarray:
    a, b = as64(arrays[spec.name_a]), as64(arrays[spec.name_b])
    if spec.transpose_a:
        a = np.swapaxes(a, -1, -2)
    if spec.transpose_b:
        b = np.swapaxes(b, -1, -2)
    x = a @ b
    for op in spec.epilogue:
        if op.kind == "bias":
            x = x + as64(arrays[op.operand])
        elif op.kind == "residual":
            x = x + as64(arrays[op.operand])
        elif op.kind == "gate":
            x = x * as64(arrays[op.operand])
        elif op.kind == "scale":
            x = x * op.value
        elif op.kind == "add_scalar":
            x = x + op.value
        elif op.kind == "max_scalar":
            x = np.maximum(x, op.value)
        elif op.kind == "min_scalar":
            x = np.minimum(x, op.value)
        elif op.kind == "cast":
            x = x.astype(np.float16).astype(np.float64)
        elif op.kind == "relu":
            x = np.maximum(x, 0)
        elif op.kind == "gelu_erf":
            x = 0.5 * x * (1 + erf(x / np.sqrt(2)))
        elif op.kind == "gelu_tanh":
            x = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
        elif op.kind == "silu":
            x = x / (1 + np.exp(-x))
        elif op.kind == "gelu_quick":
            x = x / (1 + np.exp(-1.702 * x))
        elif op.kind == "sigmoid":
            x = 1 / (1 + np.exp(-x))
        elif op.kind in ("tanh", "exp"):
            x = getattr(np, op.kind)(x)
    return x


# (M, N, K): one element; primes and sizes that are not multiples of the CPU block or of the
# micro-kernel's register tile (more edges: test_gemm_microkernel.py); exact multiples.
SHAPES = [(1, 1, 1), (67, 45, 131), (128, 64, 32)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cpu_float32_with_bias_gelu(shape, cpu_config, tmp_path):
    M, N, K = shape
    spec = GemmSpec(M, N, K, dtype_a="float32", epilogue=BIAS_GELU)
    arrays = random_inputs(spec)
    out = run_cpu(spec, arrays, cpu_config, tmp_path)["C"]
    # fp32 sums of K products: the error grows ~ sqrt(K) * eps * |a||b|.
    assert_close(out, reference(spec, arrays), "float32", atol_scale=np.sqrt(K))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cpu_half_inputs_accumulate_in_float32(dtype, cpu_config, tmp_path):
    M, N, K = 37, 29, 263  # K large enough that an fp16/bf16 accumulator would be far off
    spec = GemmSpec(M, N, K, dtype_a=dtype, epilogue=BIAS_GELU)
    arrays = random_inputs(spec, seed=1)
    out = run_cpu(spec, arrays, cpu_config, tmp_path)["C"]
    # Only the final rounding to dtype remains; values are O(sqrt(K)), so the tolerance scales with it.
    assert_close(out, reference(spec, arrays), dtype, atol_scale=np.sqrt(K))


def test_cpu_every_epilogue_step_in_order(cpu_config, tmp_path):
    spec = GemmSpec(19, 23, 7, dtype_a="float32", dtype_out="float32", epilogue=EVERY_STEP)
    arrays = random_inputs(spec, seed=2)
    out = run_cpu(spec, arrays, cpu_config, tmp_path)["C"]
    # The explicit cast to float16 mid-way makes this an fp16-precision result.
    assert_close(out, reference(spec, arrays), "float16")


def test_cpu_batched_transposed_with_broadcast_weight(cpu_config, tmp_path):
    # A: [2, 3, K, M] (transposed), B: [3, N, K] broadcast over the leading batch dim (transposed).
    spec = GemmSpec(
        37,
        29,
        19,
        batch=(2, 3),
        batch_b=(3,),
        transpose_a=True,
        transpose_b=True,
        dtype_a="float16",
        dtype_b="float16",
        dtype_out="float32",
        epilogue=(EpilogueOp("residual", operand="res", dtype="float32"),),
    )
    arrays = random_inputs(spec, seed=3)
    out = run_cpu(spec, arrays, cpu_config, tmp_path)["C"]
    assert out.shape == (2, 3, 37, 29)
    assert_close(out, reference(spec, arrays), "float32", atol_scale=np.sqrt(19))


def test_cpu_batch_of_a_only(cpu_config, tmp_path):
    # B without batch dims: one weight shared by every batch of A (a linear layer on [B, S, K]).
    spec = GemmSpec(33, 17, 40, batch=(3,), batch_b=(), dtype_a="bfloat16", dtype_out="bfloat16")
    arrays = random_inputs(spec, seed=4)
    out = run_cpu(spec, arrays, cpu_config, tmp_path)["C"]
    assert_close(out, reference(spec, arrays), "bfloat16", atol_scale=np.sqrt(40))


def test_cpu_small_schedule_many_edge_tiles(cpu_config, tmp_path):
    spec = GemmSpec(50, 47, 23, dtype_a="float32", epilogue=BIAS_GELU)
    schedule = TileSchedule(block_m=16, block_n=8, block_k=5)
    arrays = random_inputs(spec, seed=5)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=schedule)["C"]
    assert_close(out, reference(spec, arrays), "float32", atol_scale=np.sqrt(23))


# ---------------------------------------------------------------------------------------------
# GPU targets: artifacts
# ---------------------------------------------------------------------------------------------

INSTRUCTIONS = {"hopper": ("wgmma", "tma_load"), "ampere": ("mma_sync", "cp_async"), "rocm": ("mfma",)}

# M and N are not multiples of any block; K keeps rows 16-byte aligned so Hopper can use TMA.
GPU_SPEC = GemmSpec(
    1000,
    999,
    512,
    dtype_a="float16",
    epilogue=(EpilogueOp("bias", operand="bias"), EpilogueOp("gelu_tanh"), EpilogueOp("residual", operand="res")),
)


@pytest.mark.parametrize("target", sorted(INSTRUCTIONS))
def test_gpu_gemm_epilogue_uses_the_targets_mma(target):
    schedule = TileSchedule.from_config(target, GPU_SPEC)
    tessera_tvm.tile.validate_schedule(GPU_SPEC, schedule, target)
    source = tessera_tvm.lower(build_tile_program(GPU_SPEC, schedule, target), target, build=False).source
    for instruction in INSTRUCTIONS[target]:
        assert instruction in source, f"{target}: {instruction} missing"
    assert "gemm_kernel" in source
    assert "< 999)" in source  # N = 999 is odd: the epilogue store is predicated per column


@pytest.mark.parametrize("target", sorted(INSTRUCTIONS))
def test_gpu_batched_transposed_gemm_lowers(target):
    spec = GemmSpec(256, 200, 128, batch=(4,), transpose_b=True, dtype_a="bfloat16", dtype_out="float32")
    source = tessera_tvm.lower(build_tile_program(spec, None, target), target, build=False).source
    assert INSTRUCTIONS[target][0] in source


@pytest.mark.nvcc
def test_hopper_gemm_epilogue_builds_with_nvcc(tmp_path):
    lowered = tessera_tvm.lower(build_tile_program(GPU_SPEC, None, "hopper"), "hopper", out_dir=tmp_path)
    assert lowered.artifacts["cubin"].stat().st_size > 0
    assert "wgmma.mma_async" in lowered.artifacts["ptx"].read_text()


def test_cpu_kernel_keeps_the_specs_parameter_names(cpu_config, tmp_path):
    spec = GemmSpec(
        9, 7, 5, dtype_a="float32", name_a="x", name_b="w", name_out="y", epilogue=(EpilogueOp("bias", operand="b"),)
    )
    arrays = random_inputs(spec, seed=6)
    out = run_cpu(spec, arrays, cpu_config, tmp_path)["y"]
    assert_close(out, reference(spec, arrays), "float32")


def test_gpu_rasterize_swizzles_the_block_order():
    spec = GemmSpec(1024, 1024, 1024, dtype_a="float16")
    schedule = TileSchedule.from_config("ampere", spec).replace(rasterize=8)
    assert (
        "rasterization2DRow"
        in tessera_tvm.lower(build_tile_program(spec, schedule, "ampere"), "ampere", build=False).source
    )


def test_hopper_fp8_gemm_uses_fp8_wgmma():
    # fp8 runs on GPUs only: TVM's C legalisation of fp8 decodes negative values wrongly.
    spec = GemmSpec(512, 512, 512, transpose_b=True, dtype_a="float8_e4m3fn", dtype_out="bfloat16")
    source = tessera_tvm.lower(build_tile_program(spec, None, "hopper"), "hopper", build=False).source
    assert "wgmma" in source and "kFloat8_e4m3" in source
