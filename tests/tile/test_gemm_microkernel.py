"""The CPU GEMM's packed micro-kernel (tessera/cpu_gemm.h): edges of its register tile, dtypes,
transposed and batched operands, and what the Tile IR and the C source show."""

from __future__ import annotations

import ctypes
import dataclasses
import platform
import re

import ml_dtypes
import numpy as np
import pytest

import tessera_tvm
from tessera_tvm.target.cpu import DEFAULT_CPU_FLAGS, RUNTIME_INCLUDE_DIR, compile_cpu
from tessera_tvm.tile import EpilogueOp, GemmSpec, SpecError, TileSchedule, build_tile_program
from tessera_tvm.tile.gemm import CPU_MICRO_TILE, CPU_PACK_PAD, CPU_PAIRS_MICRO_TILE, cpu_gemm_packs, cpu_packed_b
from tessera_tvm.tile.panels import PackedPanels, pack_strips

from .conftest import assert_close, random_inputs, run_cpu
from .test_gemm import BIAS_GELU, reference

MR, NR = CPU_MICRO_TILE  # 14 x 32 on AVX-512
PMR, PNR = CPU_PAIRS_MICRO_TILE  # bf16 k-pairs: 6 x 64

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


def test_tile_ir_and_c_source_show_the_micro_kernel(monkeypatch):
    # 4 x 2 blocks; on 3 cores the 2 column blocks alone would not keep them busy: a block per
    # (row, column) block, each packing its own A and B panels.
    monkeypatch.setattr("os.cpu_count", lambda: 3)
    spec = GemmSpec(100, 70, 33, dtype_a="float16", dtype_out="float32", transpose_b=True)
    func = build_tile_program(spec, SCHEDULES["tile_multiples"], "c")
    tile = func.script()
    assert 'T.call_extern("int32", "tessera_cpu_pack_a_f16", T.address_of(a_pack[0]), A.data' in tile
    assert 'T.call_extern("int32", "tessera_cpu_pack_b_f16", T.address_of(b_pack[0]), B.data' in tile
    assert 'T.call_extern("int32", "tessera_cpu_gemm_f32", T.address_of(acc[0, 0])' in tile
    source = tessera_tvm.lower(func, "cpu", build=False).source
    assert "#include <tessera/cpu.h>" in source
    kernel = source[source.index("int32_t gemm_kernel(half* A, half* B, float* C) {") :]
    assert kernel.index("TESSERA_PARALLEL_BEGIN") < kernel.index("tessera_cpu_gemm_f32(")
    assert kernel.index("tessera_cpu_gemm_f32(") < kernel.index("TESSERA_PARALLEL_END")
    # B is [N, K]: packed with k stride 1 and column stride K = 33 (strides and offsets are int64_t).
    assert re.search(r"tessera_cpu_pack_b_f16\(\(&\(b_pack\[0\]\)\), B, [^;]*, \(int64_t\)1, \(int64_t\)33, ", kernel)


def test_bf16_gemm_packs_k_pairs_for_the_bf16_dot_products():
    # bf16 x bf16 runs on bf16 k-pairs (vdpbf16ps with AVX512-BF16, fp32 packing without it): B packed
    # as pairs, a row-major A read in place, a transposed A packed as pairs; bf16 x f16 mixes dtypes
    # and keeps the fp32 panels.
    pairs = build_tile_program(GemmSpec(64, 64, 31, dtype_a="bfloat16"), SCHEDULES["ragged_blocks"], "c").script()
    assert '"tessera_cpu_pack_b_bf16x2"' in pairs and '"tessera_cpu_gemm_bf16x2_rows"' in pairs
    assert "tessera_cpu_pack_a" not in pairs and "tessera_cpu_gemm_f32" not in pairs
    transposed = build_tile_program(
        GemmSpec(64, 64, 31, dtype_a="bfloat16", transpose_a=True), SCHEDULES["ragged_blocks"], "c"
    ).script()
    assert '"tessera_cpu_pack_a_bf16x2"' in transposed and '"tessera_cpu_gemm_bf16x2"' in transposed
    mixed = build_tile_program(
        GemmSpec(64, 64, 31, dtype_a="bfloat16", dtype_b="float16"), SCHEDULES["ragged_blocks"], "c"
    ).script()
    assert '"tessera_cpu_pack_a_bf16"' in mixed and '"tessera_cpu_gemm_f32"' in mixed and "bf16x2" not in mixed


def test_integer_gemm_keeps_serial_loops_but_int8():
    spec = GemmSpec(16, 16, 16, dtype_a="int32", dtype_acc="int32", dtype_out="int32")
    assert not cpu_gemm_packs(spec)
    assert "tessera_cpu_gemm" not in build_tile_program(spec, None, "c").script()
    spec = GemmSpec(16, 16, 16, dtype_a="int8", dtype_acc="int32", dtype_out="int32")  # tests/tile/test_gemm_int8.py
    assert cpu_gemm_packs(spec) and "tessera_cpu_gemm_s8x4_rows" in build_tile_program(spec, None, "c").script()


def test_header_and_tile_program_agree_on_the_padding_and_tile():
    header = (RUNTIME_INCLUDE_DIR / "tessera" / "cpu_gemm.h").read_text()
    assert f"#define TESSERA_GEMM_PAD {CPU_PACK_PAD}\n" in header
    avx512 = header[header.index("#if defined(__AVX512F__)") : header.index("#elif")]
    lanes = int(re.search(r"#define TESSERA_GEMM_VEC (\d+)", avx512).group(1))
    rows = int(re.search(r"#define TESSERA_GEMM_MR (\d+)", avx512).group(1))
    vectors = int(re.search(r"#define TESSERA_GEMM_NV (\d+)", avx512).group(1))
    assert (rows, lanes * vectors) == CPU_MICRO_TILE
    pairs = header[header.index("bf16 pairs") :]
    rows = int(re.search(r"#define TESSERA_PAIRS_MR (\d+)", pairs).group(1))
    vectors = int(re.search(r"#define TESSERA_PAIRS_NV (\d+)", pairs).group(1))
    assert (rows, 16 * vectors) == CPU_PAIRS_MICRO_TILE


# ---------------------------------------------------------------------------------------------
# bf16 x bf16: k-pair packing (vector paths for stride-1 rows and k) and vdpbf16ps
# ---------------------------------------------------------------------------------------------

# Blocks over several 16-pair chunks of the transposing packer and 16/32-lane groups of the row
# packer, each with a ragged edge: odd block_k (the last pair of every K step padded with zero),
# blocks that are not multiples of the register tile.
PAIR_SCHEDULES = {
    "odd_block_k": TileSchedule(block_m=3 * PMR, block_n=2 * PNR, block_k=67),
    "ragged_blocks": TileSchedule(block_m=2 * PMR + 5, block_n=PNR + 9, block_k=33),
}
PAIR_SHAPES = [(2 * PMR + 3, 3 * PNR + 7, 141), (16, 16, 32), (PMR + 1, 17, 1)]


@pytest.mark.parametrize("schedule", sorted(PAIR_SCHEDULES))
@pytest.mark.parametrize("transpose", [(False, False), (True, False), (False, True), (True, True)], ids=str)
@pytest.mark.parametrize("shape", PAIR_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bf16_pairs_edges_and_transposes(shape, transpose, schedule, cpu_config, tmp_path):
    M, N, K = shape
    transpose_a, transpose_b = transpose
    spec = GemmSpec(M, N, K, dtype_a="bfloat16", dtype_out="float32", transpose_a=transpose_a, transpose_b=transpose_b)
    arrays = random_inputs(spec, seed=M * N + K)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=PAIR_SCHEDULES[schedule])["C"]
    # bf16 products are exact in fp32; vdpbf16ps sums them in fp32 (a different order than numpy).
    assert_close(out, reference(spec, arrays), "float32", atol_scale=np.sqrt(K))


# Ragged blocks; panels of 320 x 128 pairs (over 32767 floats: an index into one buffer over all of
# them failed in tl.StorageRewrite).
SHARED_B_SCHEDULES = {
    "ragged_blocks": PAIR_SCHEDULES["ragged_blocks"],
    "large_panels": TileSchedule(block_m=2 * PMR, block_n=256, block_k=256),
}


# Each case a compile of its own (~12 s of g++): the two schedules, one with each layout of B.
@pytest.mark.parametrize(
    "schedule, transpose_b", [("ragged_blocks", False), ("large_panels", True)], ids=["ragged-b", "large-b_transposed"]
)
def test_bf16_b_packed_once_for_all_row_blocks(transpose_b, schedule, cpu_config, tmp_path, monkeypatch):
    """With A read in place and column blocks enough for the cores, a block packs B's panels for every
    K step once into the thread's workspace and runs all its column's row blocks over them: ragged
    row and column blocks, an odd K, a batch, a bias + GELU epilogue."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)  # column blocks x 2 batches: a multiple of the cores
    spec = GemmSpec(
        4 * PMR + 7, 2 * PNR + 22, 301, dtype_a="bfloat16", transpose_b=transpose_b, batch=(2,), epilogue=BIAS_GELU
    )
    tile = build_tile_program(spec, SHARED_B_SCHEDULES[schedule], "c").script()
    assert '"tessera_cpu_workspace"' in tile and '"tessera_cpu_gemm_bf16x2_rows"' in tile
    arrays = random_inputs(spec, seed=7)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=SHARED_B_SCHEDULES[schedule])["C"]
    assert_close(out, reference(spec, arrays), spec.dtype_out, atol_scale=np.sqrt(spec.K))


@pytest.mark.parametrize("dtype, transpose_b", [("float32", False), ("float16", True)])
def test_fp32_panels_b_packed_once_for_all_row_blocks(dtype, transpose_b, cpu_config, tmp_path, monkeypatch):
    """A GEMM on fp32 panels with column blocks enough for the cores packs B's panels for every K step
    once into the thread's workspace and runs all its column's row blocks over them, packing A per
    row block: ragged row, column and K blocks, a batch, a bias + GELU epilogue. With a third core
    the same GEMM packs B per block again, and both give the reference's result."""
    from tessera_tvm.tile.gemm import cpu_b_shared_by_row_blocks

    spec = GemmSpec(3 * MR + 5, 2 * NR + 9, 45, dtype_a=dtype, transpose_b=transpose_b, batch=(2,), epilogue=BIAS_GELU)
    schedule = SCHEDULES["ragged_blocks"]  # 3 row blocks x 2 column blocks x 2 batches, K in 7 steps
    arrays = random_inputs(spec, seed=11)
    expected = reference(spec, arrays)
    for cores, shared in ((2, True), (5, False)):  # 4 blocks of columns: a multiple of 2 cores, short of 5
        monkeypatch.setattr("os.cpu_count", lambda cores=cores: cores)
        assert cpu_b_shared_by_row_blocks(spec, schedule) is shared
        tile = build_tile_program(spec, schedule, "c").script()
        assert ('"tessera_cpu_workspace"' in tile) is shared and '"tessera_cpu_gemm_f32"' in tile
        out = run_cpu(spec, arrays, cpu_config, tmp_path / str(cores), schedule=schedule)["C"]
        assert_close(out, expected, spec.dtype_out, atol_scale=np.sqrt(spec.K))


def test_bf16_transposed_a_packed_once_for_all_column_blocks(cpu_config, tmp_path, monkeypatch):
    """A transposed A is copied into k-pairs; with row blocks enough for the cores, a block copies its
    rows' panels for every K step once into the thread's workspace and runs all its row's column
    blocks over them: ragged row, column and K blocks, an odd K, a batch."""
    from tessera_tvm.tile.gemm import cpu_a_shared_by_column_blocks

    monkeypatch.setattr("os.cpu_count", lambda: 2)  # 5 row blocks x 2 batches: a multiple of the cores
    schedule = PAIR_SCHEDULES["ragged_blocks"]
    spec = GemmSpec(
        4 * schedule.block_m + 3, 2 * schedule.block_n + 22, 101, dtype_a="bfloat16", transpose_a=True, batch=(2,)
    )
    assert cpu_a_shared_by_column_blocks(spec, schedule)
    tile = build_tile_program(spec, schedule, "c").script()
    assert '"tessera_cpu_workspace"' in tile and '"tessera_cpu_pack_a_bf16x2"' in tile
    arrays = random_inputs(spec, seed=11)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=schedule)["C"]
    assert_close(out, reference(spec, arrays), spec.dtype_out, atol_scale=np.sqrt(spec.K))


# The bf16 entry points of tessera/cpu_gemm.h behind plain C functions, for ctypes.
PAIRS_SHIM = """
#include <tessera/cpu_gemm.h>
extern "C" int32_t has_bf16_pairs() {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  return 1;
#else
  return 0;
#endif
}
extern "C" int32_t pack(int32_t operand, float *panel, uint16_t *src, int32_t offset, int32_t stride, int32_t k_stride,
                        int32_t count, int32_t depth) {
  return operand == 0 ? tessera_cpu_pack_a_bf16x2(panel, src, offset, stride, k_stride, count, depth)
                      : tessera_cpu_pack_b_bf16x2(panel, src, offset, k_stride, stride, count, depth);
}
extern "C" int32_t gemm(float *acc, int32_t acc_stride, float *a_panel, float *b_panel, int32_t rows, int32_t cols,
                        int32_t depth) {
  return tessera_cpu_gemm_bf16x2(acc, acc_stride, a_panel, b_panel, rows, cols, depth);
}
extern "C" int32_t gemm_rows(float *acc, int32_t acc_stride, uint16_t *a, int32_t offset, int32_t row_stride,
                             float *b_panel, int32_t rows, int32_t cols, int32_t depth) {
  return tessera_cpu_gemm_bf16x2_rows(acc, acc_stride, a, offset, row_stride, b_panel, rows, cols, depth);
}
"""


def _pairs_shim(out_dir, flags=DEFAULT_CPU_FLAGS):
    lib = ctypes.CDLL(str(compile_cpu(PAIRS_SHIM, out_dir=out_dir, name="pairs", flags=flags)))
    p, i = ctypes.c_void_p, ctypes.c_int32
    lib.pack.argtypes = [i, p, p, i, i, i, i, i]
    lib.gemm.argtypes = [p, i, p, p, i, i, i]
    lib.gemm_rows.argtypes = [p, i, p, i, i, p, i, i, i]
    return lib


@pytest.fixture(scope="module")
def pairs_shim(tmp_path_factory):
    return _pairs_shim(tmp_path_factory.mktemp("pairs"))


def _pack(lib, operand: str, bits: np.ndarray, offset: int, stride: int, k_stride: int, count: int, depth: int):
    width = PMR if operand == "a" else PNR
    panel = np.full(-(-count // width) * width * depth + 64, 0xDEADBEEF, dtype=np.uint32)
    lib.pack(0 if operand == "a" else 1, panel.ctypes.data, bits.ctypes.data, offset, stride, k_stride, count, depth)
    return panel


def _expected_pairs(width: int, element, count: int, depth: int) -> np.ndarray:
    """pack[strip][p][i] = element(i, 2p) | element(i, 2p + 1) << 16, zero past count and depth."""
    pairs = (depth + 1) // 2
    grid = np.zeros((-(-count // width) * width, 2 * pairs), dtype=np.uint32)
    for i in range(count):
        for k in range(depth):
            grid[i, k] = element(i, k)
    words = grid[:, 0::2] | (grid[:, 1::2] << 16)  # [element, pair]
    return words.reshape(-1, width, pairs).transpose(0, 2, 1).reshape(-1)


# (count, depth) inside a larger operand, so a read past either edge would show: one short of and
# past a 16-lane group and a 16-pair chunk, odd depths.
PACK_CASES = [(1, 1), (PMR, 32), (PMR + 3, 33), (PNR - 1, 31), (PNR + 5, 67), (45, 2)]


@pytest.mark.parametrize("layout", ["k_contiguous", "elements_contiguous", "strided"])
@pytest.mark.parametrize("operand", ["a", "b"])
@pytest.mark.parametrize("case", PACK_CASES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_bf16_pair_packing_matches_its_definition(case, operand, layout, pairs_shim):
    if not pairs_shim.has_bf16_pairs():
        pytest.skip("no AVX512-BF16: the bf16x2 entries pack fp32 panels")
    count, depth = case
    rng = np.random.default_rng(count * 100 + depth)
    # Any 16-bit pattern (NaNs and denormals included) is moved, never converted.
    outer, inner = count + 3, depth + 5
    bits = rng.integers(0, 1 << 16, size=outer * inner * 2 + 7, dtype=np.uint16)
    offset = 5
    stride, k_stride = {
        "k_contiguous": (inner, 1),  # A row-major, B transposed: a pair is one 32-bit word
        "elements_contiguous": (1, outer),  # A transposed, B row-major: pairs from two k rows
        "strided": (2 * inner, 2),  # neither: the element-wise path
    }[layout]
    panel = _pack(pairs_shim, operand, bits, offset, stride, k_stride, count, depth)
    expected = _expected_pairs(
        PMR if operand == "a" else PNR, lambda i, k: bits[offset + i * stride + k * k_stride], count, depth
    )
    np.testing.assert_array_equal(panel[: expected.size], expected)


@pytest.mark.parametrize("native", [True, False], ids=["native", "no_avx512bf16"])
def test_bf16_pair_entries_with_and_without_bf16_dot_products(native, pairs_shim, tmp_path):
    """pack + gemm through the bf16x2 entries, built as the kernels are and without AVX512-BF16
    (the fp32 fallback), against numpy."""
    if not native and platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("-mno-avx512bf16 is an x86 flag")
    lib = pairs_shim if native else _pairs_shim(tmp_path, (*DEFAULT_CPU_FLAGS, "-mno-avx512bf16"))
    M, N, K = 2 * PMR + 5, PNR + 3, 37  # edge rows and columns of the register tile, an odd depth
    rng = np.random.default_rng(11)
    a = rng.standard_normal((M, K)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((K, N)).astype(ml_dtypes.bfloat16)
    a_panel = np.zeros((M + CPU_PACK_PAD) * K, dtype=np.float32)
    b_panel = np.zeros((N + CPU_PACK_PAD) * K, dtype=np.float32)
    a_bits, b_bits = a.view(np.uint16), b.view(np.uint16)
    lib.pack(0, a_panel.ctypes.data, a_bits.ctypes.data, 0, K, 1, M, K)  # row stride K, k stride 1
    lib.pack(1, b_panel.ctypes.data, b_bits.ctypes.data, 0, 1, N, N, K)  # column stride 1, k stride N
    # Exact products, fp32 sums in another order than numpy's.
    expected = a.astype(np.float64) @ b.astype(np.float64)
    acc = np.zeros((M, N), dtype=np.float32)
    lib.gemm(acc.ctypes.data, N, a_panel.ctypes.data, b_panel.ctypes.data, M, N, K)
    assert_close(acc, expected, "float32", atol_scale=np.sqrt(K))
    # A read in place from inside a wider operand whose other elements are NaN: a read past the odd
    # depth (the last pair's high half) or past the last row would turn the sums into NaN.
    wide = np.full((M + 1, K + 3), np.nan, dtype=ml_dtypes.bfloat16)
    wide[:M, 2 : 2 + K] = a
    acc = np.full((M, N), 1.5, dtype=np.float32)
    lib.gemm_rows(acc.ctypes.data, N, wide.view(np.uint16).ctypes.data, 2, K + 3, b_panel.ctypes.data, M, N, K)
    assert_close(acc, expected + 1.5, "float32", atol_scale=np.sqrt(K))


# The fp32 pack entries behind a plain C function, for ctypes.
F32_PACK_SHIM = """
#include <tessera/cpu_gemm.h>
extern "C" int32_t pack(int32_t operand, float *panel, float *src, int32_t offset, int32_t stride, int32_t k_stride,
                        int32_t count, int32_t depth) {
  return operand == 0 ? tessera_cpu_pack_a_f32(panel, src, offset, stride, k_stride, count, depth)
                      : tessera_cpu_pack_b_f32(panel, src, offset, k_stride, stride, count, depth);
}
extern "C" int32_t gemm(int32_t set, float *acc, int32_t ldc, float *a, float *b, int32_t rows, int32_t cols,
                        int32_t depth) {
  return set ? tessera_cpu_gemm_set_f32(acc, ldc, a, b, rows, cols, depth)
             : tessera_cpu_gemm_f32(acc, ldc, a, b, rows, cols, depth);
}
"""


@pytest.fixture(scope="module")
def f32_pack_shim(tmp_path_factory):
    lib = ctypes.CDLL(str(compile_cpu(F32_PACK_SHIM, out_dir=tmp_path_factory.mktemp("f32pack"), name="f32pack")))
    p, i = ctypes.c_void_p, ctypes.c_int32
    lib.pack.argtypes = [i, p, p, i, i, i, i, i]
    lib.gemm.argtypes = [i, p, i, p, p, i, i, i]
    return lib


@pytest.mark.parametrize(
    "shape", [(MR, NR, 16), (2 * MR + 3, NR + 5, 33), (5, 7, 3)], ids=lambda s: "x".join(map(str, s))
)
def test_the_overwriting_gemm_writes_the_product_and_nothing_else(shape, f32_pack_shim):
    """tessera_cpu_gemm_set_f32 (attention's S^T = K Q^T): acc[:rows, :cols] = A B whatever acc held
    (NaN included), whole and edge register tiles alike; tessera_cpu_gemm_f32 adds to acc; the
    elements of acc past rows and cols (its row stride is wider) are left alone by both."""
    rows, cols, depth = shape
    rng = np.random.default_rng(rows * cols)
    a = rng.standard_normal((rows, depth)).astype(np.float32)
    b = rng.standard_normal((depth, cols)).astype(np.float32)
    a_panel = np.zeros((rows + CPU_PACK_PAD) * depth, dtype=np.float32)
    b_panel = np.zeros((cols + CPU_PACK_PAD) * depth, dtype=np.float32)
    f32_pack_shim.pack(0, a_panel.ctypes.data, a.ctypes.data, 0, depth, 1, rows, depth)
    f32_pack_shim.pack(1, b_panel.ctypes.data, b.ctypes.data, 0, 1, cols, cols, depth)
    product = a.astype(np.float64) @ b.astype(np.float64)
    for overwrite, start in ((True, np.nan), (False, 1.5)):
        acc = np.full((rows + 2, cols + 9), start, dtype=np.float32)
        f32_pack_shim.gemm(
            overwrite, acc.ctypes.data, cols + 9, a_panel.ctypes.data, b_panel.ctypes.data, rows, cols, depth
        )
        expected = product if overwrite else product + 1.5
        assert_close(acc[:rows, :cols], expected, "float32", atol_scale=np.sqrt(depth))
        outside = np.concatenate([acc[rows:].ravel(), acc[:rows, cols:].ravel()])
        assert (np.isnan(outside) if overwrite else outside == 1.5).all()


def test_every_count_of_edge_rows_runs_its_own_register_tile_right(f32_pack_shim):
    """The bottom edge of a block runs a register tile of 4 or 8 rows where its live rows fit, rather
    than the whole MR: every row count from 1 to two tiles and one more, with a whole and a ragged
    last column strip, adds exactly A B to the live rows and leaves the rest of acc alone."""
    rng = np.random.default_rng(3)
    depth = 19
    for rows in range(1, 2 * MR + 2):
        for cols in (NR, NR + 11):
            a = rng.standard_normal((rows, depth)).astype(np.float32)
            b = rng.standard_normal((depth, cols)).astype(np.float32)
            a_panel = np.full((rows + CPU_PACK_PAD) * depth, np.nan, dtype=np.float32)  # no read past a strip
            b_panel = np.zeros((cols + CPU_PACK_PAD) * depth, dtype=np.float32)
            f32_pack_shim.pack(0, a_panel.ctypes.data, a.ctypes.data, 0, depth, 1, rows, depth)
            f32_pack_shim.pack(1, b_panel.ctypes.data, b.ctypes.data, 0, 1, cols, cols, depth)
            acc = np.full((rows + 3, cols + 5), 0.5, dtype=np.float32)
            f32_pack_shim.gemm(
                0, acc.ctypes.data, cols + 5, a_panel.ctypes.data, b_panel.ctypes.data, rows, cols, depth
            )
            expected = a.astype(np.float64) @ b.astype(np.float64) + 0.5
            assert_close(acc[:rows, :cols], expected, "float32", atol_scale=np.sqrt(depth))
            assert (acc[rows:] == 0.5).all() and (acc[:rows, cols:] == 0.5).all(), (rows, cols)


@pytest.mark.parametrize("layout", ["k_contiguous", "elements_contiguous", "strided"])
@pytest.mark.parametrize("operand", ["a", "b"])
@pytest.mark.parametrize("case", [*PACK_CASES, (NR, 16), (2 * NR, 17), (MR, 15)], ids=lambda c: f"{c[0]}x{c[1]}")
def test_f32_packing_matches_its_definition(case, operand, layout, f32_pack_shim):
    """pack[strip][k][i] = element (i, k), zero past the operand's count; k-contiguous strips (A
    row-major, a linear's weight) go through a 16 x 16 register transpose, its k tail element-wise.
    Any 32-bit pattern is moved unchanged, and nothing past the panel is written."""
    count, depth = case
    rng = np.random.default_rng(count * 100 + depth)
    outer, inner = count + 3, depth + 5
    bits = rng.integers(0, 1 << 32, size=outer * inner * 2 + 7, dtype=np.uint32)
    offset = 5
    stride, k_stride = {"k_contiguous": (inner, 1), "elements_contiguous": (1, outer), "strided": (2 * inner, 2)}[
        layout
    ]
    width = MR if operand == "a" else NR
    strips = -(-count // width)
    panel = np.full(strips * width * depth + 64, 0xDEADBEEF, dtype=np.uint32)
    f32_pack_shim.pack(
        0 if operand == "a" else 1, panel.ctypes.data, bits.ctypes.data, offset, stride, k_stride, count, depth
    )
    grid = np.zeros((count, depth), dtype=np.uint32)  # [element, k]
    for i in range(count):
        grid[i] = bits[offset + i * stride + np.arange(depth) * k_stride]
    expected = pack_strips(grid, width)  # the layout's one definition (tile/panels.py)
    assert expected.size == strips * width * depth
    np.testing.assert_array_equal(panel[: expected.size], expected)
    assert (panel[expected.size :] == 0xDEADBEEF).all()


# ---------------------------------------------------------------------------------------------
# B packed ahead (a constant weight): tile/panels.py's layout, the panels the C packing writes
# ---------------------------------------------------------------------------------------------

# B's packing entries and the micro-kernel on a panel packed ahead, behind plain C functions.
PANEL_SHIM = """
#include <tessera/cpu_gemm.h>
extern "C" int32_t pack_b(int32_t f16, float *panel, void *b, int64_t offset, int64_t k_stride, int64_t col_stride,
                          int32_t cols, int32_t depth) {
  return f16 ? tessera_cpu_pack_b_f16(panel, (half *)b, offset, k_stride, col_stride, cols, depth)
             : tessera_cpu_pack_b_f32(panel, (float *)b, offset, k_stride, col_stride, cols, depth);
}
extern "C" int32_t gemm_panel(float *acc, int32_t ldc, float *a_pack, float *b, int64_t offset, int32_t strip,
                              int32_t rows, int32_t cols, int32_t depth) {
  return tessera_cpu_gemm_panel_f32(acc, ldc, a_pack, b, offset, strip, rows, cols, depth);
}
"""


@pytest.fixture(scope="module")
def panel_shim(tmp_path_factory):
    lib = ctypes.CDLL(str(compile_cpu(PANEL_SHIM, out_dir=tmp_path_factory.mktemp("panels"), name="panels")))
    p, i, q = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    lib.pack_b.argtypes = [i, p, p, q, q, q, i, i]
    lib.gemm_panel.argtypes = [p, i, p, p, q, i, i, i, i]
    return lib


# (N, K, block_n, block_k): edge column blocks and K steps, a last strip of 1 and of NR - 1 columns,
# a block narrower than a strip, N and K smaller than a block.
PANEL_CASES = [(2 * NR + 1, 37, NR + 7, 16), (3 * NR - 1, 48, 2 * NR, 48), (NR - 3, 5, 16, 4), (7, 3, 64, 32)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("transposed", [False, True], ids=["kn", "nk"])
@pytest.mark.parametrize("case", PANEL_CASES, ids=lambda c: "x".join(map(str, c)))
def test_packed_panels_are_the_bytes_the_c_packing_writes(case, transposed, dtype, panel_shim):
    """PackedPanels.pack (numpy, at build time) holds, at each panel's offset, exactly the bytes
    tessera_cpu_pack_b_<dtype> writes for that (column block, K step) when the tile program packs
    it at run time: the same strides and counts the program passes, padded last strip included."""
    N, K, block_n, block_k = case
    panels = PackedPanels(block_n, block_k, NR)
    rng = np.random.default_rng(N * K + transposed)
    b = rng.standard_normal((N, K) if transposed else (K, N)).astype(dtype)
    packed = panels.pack(b, transposed=transposed)
    assert packed.dtype == np.float32 and packed.shape == (panels.elements(N, K),)
    k_stride, col_stride = (1, K) if transposed else (N, 1)
    covered = 0
    for bx in range(-(-N // block_n)):
        cols = min(block_n, N - bx * block_n)
        for kb in range(-(-K // block_k)):
            depth = min(block_k, K - kb * block_k)
            size = -(-cols // NR) * NR * depth
            panel = np.full(size + 64, np.nan, dtype=np.float32)
            origin = (bx * block_n, kb * block_k) if transposed else (kb * block_k, bx * block_n)
            offset = origin[0] * b.shape[1] + origin[1]
            panel_shim.pack_b(
                dtype == "float16", panel.ctypes.data, b.ctypes.data, offset, k_stride, col_stride, cols, depth
            )
            start = panels.offset(N, K, bx, kb)
            np.testing.assert_array_equal(packed[start : start + size].view(np.uint32), panel[:size].view(np.uint32))
            covered += size
    assert covered == packed.size  # the panels tile the packed operand, nothing in between


def test_a_panel_packed_for_another_strip_width_is_repacked(panel_shim):
    """A module built for a CPU whose NR differs passes its strip width: the micro-kernel repacks."""
    rows, cols, depth = MR + 2, NR + 5, 19
    rng = np.random.default_rng(3)
    a = rng.standard_normal((rows, depth)).astype(np.float32)
    b = rng.standard_normal((depth, cols)).astype(np.float32)
    a_panel = pack_strips(a, MR)
    for strip in (NR, NR // 2, 8):
        b_panel = PackedPanels(cols, depth, strip).pack(b, transposed=False)
        acc = np.zeros((rows, cols), dtype=np.float32)
        panel_shim.gemm_panel(
            acc.ctypes.data, cols, a_panel.ctypes.data, b_panel.ctypes.data, 0, strip, rows, cols, depth
        )
        assert_close(acc, a.astype(np.float64) @ b, "float32", atol_scale=np.sqrt(depth))


def _packed(spec: GemmSpec, schedule: TileSchedule, arrays: dict) -> tuple[GemmSpec, dict]:
    """``spec`` reading B packed ahead for ``schedule`` (what Relax offload does with a constant), and
    ``arrays`` with B packed."""
    panels = cpu_packed_b(spec, schedule)
    packed = dataclasses.replace(spec, packed_b=panels, dtype_b="float32", transpose_b=False)
    return packed, {**arrays, "B": panels.pack(arrays["B"], transposed=spec.transpose_b)}


@pytest.mark.parametrize(
    "spec",
    [
        # a linear's [N, K] weight shared by a batch (batch_b=()), bias + GELU, ragged blocks
        GemmSpec(
            MR + 3, 2 * NR + 9, 41, batch=(2,), batch_b=(), transpose_b=True, dtype_a="float32", epilogue=BIAS_GELU
        ),
        # [K, N] weights per batch element, fp16 (widened when packed), A transposed
        GemmSpec(29, NR + 1, 23, batch=(2,), transpose_a=True, dtype_a="float16", dtype_out="float32"),
    ],
    ids=["shared_nk_bias_gelu", "batched_kn_f16"],
)
def test_a_gemm_on_b_packed_ahead_matches_numpy(spec, cpu_config, tmp_path):
    schedule = SCHEDULES["ragged_blocks"]
    arrays = random_inputs(spec, seed=spec.M)
    packed_spec, packed_arrays = _packed(spec, schedule, arrays)
    script = build_tile_program(packed_spec, schedule, "c").script()
    # B's panel is passed, not packed: the K loop packs A only
    assert '"tessera_cpu_gemm_panel_f32"' in script and '"tessera_cpu_pack_a_' in script
    assert "tessera_cpu_pack_b_" not in script and '"tessera_cpu_gemm_f32"' not in script
    out = run_cpu(packed_spec, packed_arrays, cpu_config, tmp_path, schedule=schedule)["C"]
    assert_close(out, reference(spec, arrays), "float32", atol_scale=np.sqrt(spec.K))


def test_b_packed_ahead_is_a_spec_field_and_refused_where_it_cannot_be_read():
    spec = GemmSpec(64, 96, 40, dtype_a="float32", transpose_b=True)
    schedule = SCHEDULES["tile_multiples"]
    packed, _ = _packed(spec, schedule, {"B": np.zeros(spec.shape_b, np.float32)})
    assert packed.inputs()[1] == ("B", (PackedPanels(2 * NR, 16, NR).elements(96, 40),), "float32")
    assert packed.fingerprint() != dataclasses.replace(spec, transpose_b=False).fingerprint()
    with pytest.raises(SpecError, match="schedule's blocks"):
        build_tile_program(packed, SCHEDULES["ragged_blocks"], "c")
    with pytest.raises(SpecError, match="thread-block GEMM reads B as it is"):
        build_tile_program(packed, TileSchedule(block_m=64, block_n=64, block_k=32), "cuda")
    # bf16 x bf16 reads k-pairs (AVX512-BF16 only): it packs its B at run time
    assert cpu_packed_b(GemmSpec(64, 96, 40, dtype_a="bfloat16"), schedule) is None
