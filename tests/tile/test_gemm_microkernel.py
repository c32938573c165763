"""The CPU GEMM's packed micro-kernel (tessera/cpu_gemm.h): edges of its register tile, dtypes,
transposed and batched operands, and what the Tile IR and the C source show."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessera_tvm
from tessera_tvm.target.cpu import RUNTIME_INCLUDE_DIR
from tessera_tvm.tile import EpilogueOp, GemmSpec, TileSchedule, build_tile_program
from tessera_tvm.tile.gemm import CPU_MICRO_TILE, CPU_PACK_PAD, cpu_gemm_packs

from .conftest import assert_close, random_inputs, run_cpu
from .test_gemm import BIAS_GELU, reference

MR, NR = CPU_MICRO_TILE  # 14 x 32 on AVX-512

# Blocks that are and are not multiples of the register tile, K steps that do not divide K.
SCHEDULES = {
    "tile_multiples": TileSchedule(block_m=2 * MR, block_n=2 * NR, block_k=16),
    "ragged_blocks": TileSchedule(block_m=MR + 3, block_n=NR + 7, block_k=7),
}
# (M, N, K): one element, one short of / one past a register tile, primes, several blocks.
SHAPES = [(1, 1, 1), (MR - 1, NR + 1, 3), (MR + 1, NR - 1, 17), (97, 101, 103), (64, 160, 48)]


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_float32_edges_of_the_register_tile(shape, schedule, cpu_config, tmp_path):
    M, N, K = shape
    spec = GemmSpec(M, N, K, dtype_a="float32", epilogue=BIAS_GELU)
    arrays = random_inputs(spec, seed=M + N + K)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=SCHEDULES[schedule])["C"]
    # fp32 sums of K products in a different order than numpy: ~ sqrt(K) * eps.
    assert_close(out, reference(spec, arrays), "float32", atol_scale=np.sqrt(K))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("transpose", [(False, False), (True, False), (False, True), (True, True)], ids=str)
def test_dtypes_and_transposed_operands_are_packed(dtype, transpose, cpu_config, tmp_path):
    transpose_a, transpose_b = transpose
    spec = GemmSpec(45, 71, 29, dtype_a=dtype, dtype_out="float32", transpose_a=transpose_a, transpose_b=transpose_b)
    arrays = random_inputs(spec, seed=7)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=SCHEDULES["ragged_blocks"])["C"]
    # fp16/bf16 inputs are converted exactly to fp32; only fp32 summation order differs.
    assert_close(out, reference(spec, arrays), "float32", atol_scale=np.sqrt(29))


def test_mixed_input_dtypes_and_broadcast_batch(cpu_config, tmp_path):
    spec = GemmSpec(
        23,
        40,
        37,
        batch=(2, 3),
        batch_a=(3,),
        batch_b=(2, 1),
        dtype_a="bfloat16",
        dtype_b="float16",
        dtype_out="float16",
        epilogue=(EpilogueOp("residual", operand="res"), EpilogueOp("relu")),
    )
    arrays = random_inputs(spec, seed=8)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=SCHEDULES["ragged_blocks"])["C"]
    assert out.shape == (2, 3, 23, 40)
    assert_close(out, reference(spec, arrays), "float16", atol_scale=np.sqrt(37))


def test_default_schedule_on_a_larger_gemm(cpu_config, tmp_path):
    """The config's blocks (several K steps, blocks spread over the cores), against numpy."""
    spec = GemmSpec(300, 520, 700, dtype_a="float32", dtype_out="float32")
    arrays = random_inputs(spec, seed=9)
    out = run_cpu(spec, arrays, cpu_config, tmp_path)["C"]
    assert_close(out, reference(spec, arrays), "float32", atol_scale=np.sqrt(700))


def test_tile_ir_and_c_source_show_the_micro_kernel():
    spec = GemmSpec(100, 70, 33, dtype_a="float16", dtype_out="float32", transpose_b=True)
    func = build_tile_program(spec, SCHEDULES["tile_multiples"], "c")  # 4 x 2 blocks
    tile = func.script()
    assert 'T.call_extern("int32", "tessera_cpu_pack_a_f16", T.address_of(a_pack[0]), A.data' in tile
    assert 'T.call_extern("int32", "tessera_cpu_pack_b_f16", T.address_of(b_pack[0]), B.data' in tile
    assert 'T.call_extern("int32", "tessera_cpu_gemm_f32", T.address_of(acc[0, 0])' in tile
    source = tessera_tvm.lower(func, "cpu", build=False).source
    assert "#include <tessera/cpu.h>" in source
    kernel = source[source.index("int32_t gemm_kernel(half* A, half* B, float* C) {") :]
    assert kernel.index("TESSERA_PARALLEL_BEGIN") < kernel.index("tessera_cpu_gemm_f32(")
    assert kernel.index("tessera_cpu_gemm_f32(") < kernel.index("TESSERA_PARALLEL_END")
    # B is [N, K]: packed with k stride 1 and column stride K = 33.
    assert re.search(r"tessera_cpu_pack_b_f16\(\(&\(b_pack\[0\]\)\), B, [^;]*, 1, 33, ", kernel)


def test_bf16_gemm_packs_k_pairs_for_the_bf16_dot_products():
    # bf16 x bf16 runs on bf16 k-pairs (vdpbf16ps with AVX512-BF16, fp32 packing without it);
    # bf16 x f16 mixes dtypes and keeps the fp32 panels.
    pairs = build_tile_program(GemmSpec(64, 64, 31, dtype_a="bfloat16"), SCHEDULES["ragged_blocks"], "c").script()
    assert '"tessera_cpu_pack_a_bf16x2"' in pairs and '"tessera_cpu_pack_b_bf16x2"' in pairs
    assert '"tessera_cpu_gemm_bf16x2"' in pairs and "tessera_cpu_gemm_f32" not in pairs
    mixed = build_tile_program(
        GemmSpec(64, 64, 31, dtype_a="bfloat16", dtype_b="float16"), SCHEDULES["ragged_blocks"], "c"
    ).script()
    assert '"tessera_cpu_pack_a_bf16"' in mixed and '"tessera_cpu_gemm_f32"' in mixed and "bf16x2" not in mixed


def test_integer_gemm_keeps_serial_loops():
    spec = GemmSpec(16, 16, 16, dtype_a="int8", dtype_acc="int32", dtype_out="int32")
    assert not cpu_gemm_packs(spec)
    assert "tessera_cpu_gemm" not in build_tile_program(spec, None, "c").script()


def test_header_and_tile_program_agree_on_the_padding_and_tile():
    header = (RUNTIME_INCLUDE_DIR / "tessera" / "cpu_gemm.h").read_text()
    assert f"#define TESSERA_GEMM_PAD {CPU_PACK_PAD}\n" in header
    avx512 = header[header.index("#if defined(__AVX512F__)") : header.index("#elif")]
    lanes = int(re.search(r"#define TESSERA_GEMM_VEC (\d+)", avx512).group(1))
    rows = int(re.search(r"#define TESSERA_GEMM_MR (\d+)", avx512).group(1))
    vectors = int(re.search(r"#define TESSERA_GEMM_NV (\d+)", avx512).group(1))
    assert (rows, lanes * vectors) == CPU_MICRO_TILE
