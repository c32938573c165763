"""The CPU's int8 x int8 -> int32 GEMM on k-quads (tessera/cpu_int8.h): the packing against its
definition, the micro-kernel with and without AVX512-VNNI against numpy over the whole int8 range
(sums that wrap in int32 too), and the tile program (blocks, K steps, B shared by row blocks, an
epilogue that dequantises). The AMX tiles of the same GEMM: tests/tile/test_gemm_amx.py."""

from __future__ import annotations

import ctypes
import platform

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops
from tessera_tvm.target.cpu import DEFAULT_CPU_FLAGS, compile_cpu
from tessera_tvm.tile import EpilogueOp, GemmSpec, TileSchedule, build_tile_program
from tessera_tvm.tile.gemm import cpu_gemm_packs, cpu_gemm_quads

from .conftest import run_cpu

SHIM = """
#include <tessera/cpu.h>
extern "C" int32_t gemm_rows(int32_t *acc, int32_t acc_stride, int8_t *a, int64_t offset, int64_t row_stride,
                             float *b_panel, int32_t rows, int32_t cols, int32_t depth) {
  return tessera_cpu_gemm_s8x4_rows(acc, acc_stride, a, offset, row_stride, b_panel, rows, cols, depth);
}
extern "C" int32_t pack_b(float *panel, int8_t *b, int64_t offset, int64_t k_stride, int64_t col_stride,
                          int32_t cols, int32_t depth) {
  return tessera_cpu_pack_b_s8x4(panel, b, offset, k_stride, col_stride, cols, depth);
}
extern "C" uint32_t b_offset() { return TESSERA_QUADS_B_OFFSET; }
extern "C" int32_t amx_state() { return tessera_cpu_amx_state(); }
extern "C" int32_t has_vnni() {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  return 1;
#else
  return 0;
#endif
}
"""


def shim(out_dir, name: str, flags=DEFAULT_CPU_FLAGS):
    lib = ctypes.CDLL(str(compile_cpu(SHIM, out_dir=out_dir, name=name, flags=flags)))
    p, i, q = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    lib.gemm_rows.argtypes = [p, i, p, q, q, p, i, i, i]
    lib.pack_b.argtypes = [p, p, q, q, q, i, i]
    lib.b_offset.restype = ctypes.c_uint32
    return lib


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    return shim(tmp_path_factory.mktemp("int8"), "int8_native")


def pack(lib, b: np.ndarray, transposed: bool) -> np.ndarray:
    """B (K x N) packed as k-quads, from its row-major or its transposed layout."""
    K, N = b.shape
    panel = np.full(-(-N // 64) * 64 * -(-K // 4) + 64, 0xDEADBEEF, dtype=np.uint32)
    if transposed:
        bt = np.ascontiguousarray(b.T)
        lib.pack_b(panel.ctypes.data, bt.ctypes.data, 0, 1, K, N, K)
    else:
        lib.pack_b(panel.ctypes.data, np.ascontiguousarray(b).ctypes.data, 0, N, 1, N, K)
    return panel


def gemm_rows(lib, a: np.ndarray, panel: np.ndarray, N: int) -> np.ndarray:
    """7 + A x B through tessera_cpu_gemm_s8x4_rows, A read in place from inside a wider operand of
    127s (a read past its rows or its depth would show), the accumulator 5 columns wider than N."""
    M, K = a.shape
    wide = np.full((M + 1, K + 3), 127, dtype=np.int8)
    wide[:M, 2 : 2 + K] = a
    acc = np.full((M, N + 5), 7, np.int32)
    lib.gemm_rows(acc.ctypes.data, N + 5, wide.ctypes.data, 2, K + 3, panel.ctypes.data, M, N, K)
    assert np.all(acc[:, N:] == 7), "a column past the live ones was written"
    return acc[:, :N]


def full_range(shape, rng) -> np.ndarray:
    return rng.integers(-128, 128, size=shape, dtype=np.int8)


@pytest.mark.parametrize("transposed", [False, True], ids=["row_major", "transposed"])
@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (64, 8), (70, 33), (130, 131)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_packing_matches_its_definition(shape, transposed, native):
    N, K = shape
    b = full_range((K, N), np.random.default_rng(N * K))
    panel = pack(native, b, transposed)
    quads, strips = -(-K // 4), -(-N // 64)
    padded = np.zeros((quads * 4, strips * 64), dtype=np.uint8)
    padded[:K, :N] = b.view(np.uint8)
    words = padded.reshape(quads, 4, strips, 64).astype(np.uint32)
    words = words[:, 0] | words[:, 1] << 8 | words[:, 2] << 16 | words[:, 3] << 24  # [quad, strip, column]
    expected = words.transpose(1, 0, 2).reshape(-1) ^ np.uint32(native.b_offset())
    np.testing.assert_array_equal(panel[: expected.size], expected)


# (M, N, K): the register tile's edges (rows past 6, columns past 64, k past a quad), one element,
# and K large enough that 127 x 127 x K wraps int32 (2^31 / 16129 = 133144).
SHAPES = [(1, 1, 1), (7, 65, 9), (13, 130, 67), (6, 64, 140000)]


@pytest.mark.parametrize("build", ["native", "no_avx512"])
def test_micro_kernel_matches_numpy(build, native, tmp_path):
    if build == "no_avx512":
        if platform.machine().lower() not in ("x86_64", "amd64"):
            pytest.skip("-march=x86-64-v3 is an x86 flag")
        flags = [f.replace("-march=native", "-march=x86-64-v3") for f in DEFAULT_CPU_FLAGS]
        lib = shim(tmp_path, "int8_plain", flags)
        assert not lib.has_vnni() and lib.b_offset() == 0  # the plain loops
    else:
        lib = native
    rng = np.random.default_rng(5)
    for M, N, K in SHAPES:
        a, b = full_range((M, K), rng), full_range((K, N), rng)
        if K > 100000:  # every product 127 x 127 (or -128 x -128): the sum wraps in int32
            a, b = np.full((M, K), 127, np.int8), np.full((K, N), 127, np.int8)
            a[0], b[:, 0] = -128, -128
        for transposed in (False, True):
            got = gemm_rows(lib, a, pack(lib, b, transposed), N)
            want = (a.astype(np.int64) @ b.astype(np.int64) + 7).astype(np.int32)  # wraps as int32 sums do
            np.testing.assert_array_equal(got, want, err_msg=f"{M}x{N}x{K} transposed={transposed}")


def test_which_int8_gemms_run_on_quads():
    assert cpu_gemm_quads(GemmSpec(16, 16, 16, dtype_a="int8", dtype_acc="int32", dtype_out="int32"))
    assert cpu_gemm_quads(GemmSpec(16, 16, 16, dtype_a="int8", dtype_acc="int32", dtype_out="int32", transpose_b=True))
    # A transposed: its quads are not words of its rows, so each block is copied row-major first
    # (it ran as serial loops before, 10x slower).
    spec = GemmSpec(16, 16, 16, dtype_a="int8", dtype_acc="int32", dtype_out="int32", transpose_a=True)
    tile = build_tile_program(spec, None, "c").script()
    assert '"tessera_cpu_pack_a_s8x4"' in tile and '"tessera_cpu_gemm_s8x4"' in tile
    # Other integers keep the serial loops.
    spec = GemmSpec(16, 16, 16, dtype_a="int32", dtype_acc="int32", dtype_out="int32")
    assert not cpu_gemm_packs(spec)
    assert "tessera_cpu_gemm" not in build_tile_program(spec, None, "c").script()


def test_int8_k_steps_hold_as_many_packed_words_as_fp32():
    spec = GemmSpec(1024, 1024, 1024, dtype_a="int8", dtype_acc="int32", dtype_out="int32")
    f32 = GemmSpec(1024, 1024, 1024)
    assert TileSchedule.from_config("cpu", spec).block_k == 4 * TileSchedule.from_config("cpu", f32).block_k


@pytest.mark.parametrize("cores", [2, 8])
def test_a_transposed_a_is_copied_once_per_row_block(cores, monkeypatch):
    """The default schedule of a large int8 GEMM with A transposed splits its rows so that the row
    blocks alone keep the cores equally busy (6 of 1024 rows on 2 cores, not the 5 a row-major A
    gets), and each block then copies its rows of A once for all column blocks."""
    from tessera_tvm.tile.gemm import cpu_a_shared_by_column_blocks
    from tessera_tvm.tile.schedule import _cores_evenly_busy, fit_schedule

    monkeypatch.setattr("os.cpu_count", lambda: cores)
    spec = GemmSpec(1024, 1024, 1024, dtype_a="int8", dtype_acc="int32", dtype_out="int32", transpose_a=True)
    s = fit_schedule(spec, TileSchedule.from_config("cpu", spec), "c")
    assert _cores_evenly_busy(-(-spec.M // s.block_m), cores) and cpu_a_shared_by_column_blocks(spec, s)
    row_major = GemmSpec(1024, 1024, 1024, dtype_a="int8", dtype_acc="int32", dtype_out="int32")
    assert not cpu_a_shared_by_column_blocks(
        row_major, fit_schedule(row_major, TileSchedule.from_config("cpu", row_major), "c")
    )


# Dequantised: int32 sums times a scale, in float32.
DEQUANT = (EpilogueOp("cast", dtype="float32"), EpilogueOp("scale", value=0.25))


@pytest.mark.parametrize(
    "spec, schedule, cores",
    [
        # Ragged row, column and K blocks (K past a quad), B transposed, a batch.
        (
            GemmSpec(37, 100, 75, dtype_a="int8", dtype_acc="int32", dtype_out="int32", transpose_b=True, batch=(2,)),
            TileSchedule(block_m=24, block_n=64, block_k=32),
            8,
        ),
        # A transposed (copied into row-major blocks), B too, ragged blocks, K past a quad, a batch.
        (
            GemmSpec(
                29,
                70,
                83,
                dtype_a="int8",
                dtype_acc="int32",
                dtype_out="int32",
                transpose_a=True,
                transpose_b=True,
                batch=(2,),
            ),
            TileSchedule(block_m=12, block_n=64, block_k=40),
            8,
        ),
        # Column blocks that give both cores work: B packed once for all row blocks; dequantised.
        (
            GemmSpec(50, 128, 300, dtype_a="int8", dtype_acc="int32", dtype_out="float32", epilogue=DEQUANT),
            TileSchedule(block_m=12, block_n=64, block_k=128),
            2,
        ),
        # A transposed, row blocks x batches that give both cores work: A copied once for all column
        # blocks (ragged rows, columns and K steps, K past a quad).
        (
            GemmSpec(29, 150, 83, dtype_a="int8", dtype_acc="int32", dtype_out="int32", transpose_a=True, batch=(2,)),
            TileSchedule(block_m=12, block_n=64, block_k=40),
            2,
        ),
    ],
    ids=["ragged_transposed_b", "transposed_a_and_b", "shared_b_dequant", "shared_transposed_a"],
)
def test_tile_program_matches_numpy(spec, schedule, cores, tmp_path, cpu_config, monkeypatch):
    from tessera_tvm.tile.gemm import cpu_a_shared_by_column_blocks, cpu_b_shared_by_row_blocks

    monkeypatch.setattr("os.cpu_count", lambda: cores)
    tile = build_tile_program(spec, schedule, "c").script()
    micro_kernel = '"tessera_cpu_gemm_s8x4"' if spec.transpose_a else '"tessera_cpu_gemm_s8x4_rows"'
    assert micro_kernel in tile and '"tessera_cpu_pack_b_s8x4"' in tile
    shared_a, shared_b = cpu_a_shared_by_column_blocks(spec, schedule), cpu_b_shared_by_row_blocks(spec, schedule)
    assert (shared_a, shared_b) == (cores == 2 and spec.transpose_a, cores == 2 and not spec.transpose_a)
    assert ('"tessera_cpu_workspace"' in tile) == (cores == 2)
    rng = np.random.default_rng(9)
    batch = spec.batch
    a = full_range((*batch, spec.K, spec.M) if spec.transpose_a else (*batch, spec.M, spec.K), rng)
    b = full_range((*batch, spec.N, spec.K) if spec.transpose_b else (*batch, spec.K, spec.N), rng)
    out = run_cpu(spec, {spec.name_a: a, spec.name_b: b}, cpu_config, tmp_path, schedule=schedule)["C"]
    a_mk = np.swapaxes(a, -1, -2) if spec.transpose_a else a
    want = a_mk.astype(np.int64) @ (np.swapaxes(b, -1, -2) if spec.transpose_b else b).astype(np.int64)
    if spec.epilogue:
        np.testing.assert_allclose(out, want.astype(np.float64) * 0.25, rtol=1e-6)
    else:
        np.testing.assert_array_equal(out, want)


def test_a_dequantising_kernel_matches_numpy():
    """``cast(A @ B, f32) * scale`` with int8 A and B: one GEMM whose int32 sums are cast, then scaled
    in float32 (the scale was applied in int32 before, where 0.25 became 0: every result 0)."""

    @ts.kernel
    def dequantised(A: Tensor["M", "K", ts.int8], B: Tensor["K", "N", ts.int8]) -> Tensor["M", "N", ts.f32]:
        return ops.cast(ops.matmul(A, B), ts.f32) * 0.25

    rng = np.random.default_rng(3)
    a, b = full_range((20, 30), rng), full_range((30, 40), rng)
    compiled = ts.compile(dequantised, target="cpu", shapes={"M": 20, "N": 40, "K": 30})
    assert len(compiled.inspect_ir("sched").split("sched.tile")) == 2  # one fused kernel
    np.testing.assert_array_equal(compiled(a, b), (a.astype(np.int64) @ b.astype(np.int64)) * 0.25)


def test_int8_steps_of_an_epilogue_wrap_before_a_cast_to_float():
    """``cast(matmul(A, B, out_dtype=int8) + b, f32)``: the int8 sum wraps before the cast, as the
    reference's does (the epilogue added in int32 and cast the unwrapped sum: off by 128 or 256)."""

    @ts.kernel
    def wrapped(A: Tensor["M", "K", ts.int8], B: Tensor["K", "N", ts.int8], b: Tensor["N", ts.int8]):
        return ops.cast(ops.matmul(A, B, out_dtype=ts.int8) + b, ts.f32) * 0.5

    rng = np.random.default_rng(4)
    a, b, bias = full_range((9, 70), rng), full_range((70, 13), rng), full_range((13,), rng)
    compiled = ts.compile(wrapped, target="cpu", shapes={"M": 9, "N": 13, "K": 70})
    assert len(compiled.inspect_ir("sched").split("sched.tile")) == 2  # one fused kernel
    np.testing.assert_array_equal(compiled(a, b, bias), wrapped.reference(a, b, bias))
