"""The bf16 and int8 GEMMs on AMX tiles (tessera/cpu_amx.h): their tile program run on an emulation
of the six tile instructions where the CPU has no AMX (a build with TESSERA_AMX_EMULATE), the real
build compiled for a CPU that has it, and, on such a CPU, the tile unit itself."""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tessera_tvm.target.cpu import DEFAULT_CPU_FLAGS, compile_cpu
from tessera_tvm.tile import GemmSpec, TileSchedule

from . import test_gemm_int8 as int8_cases
from .conftest import assert_close, random_inputs, run_cpu
from .test_gemm import BIAS_GELU, reference

EMULATE = "-DTESSERA_AMX_EMULATE"

SHIM = """
#include <tessera/cpu_gemm.h>
extern "C" int32_t gemm_rows(float *acc, int32_t acc_stride, uint16_t *a, int64_t offset, int64_t row_stride,
                             float *b_panel, int32_t rows, int32_t cols, int32_t depth) {
  return tessera_cpu_gemm_bf16x2_rows(acc, acc_stride, a, offset, row_stride, b_panel, rows, cols, depth);
}
extern "C" int32_t pack_b(float *panel, uint16_t *b, int64_t offset, int64_t k_stride, int64_t col_stride,
                          int32_t cols, int32_t depth) {
  return tessera_cpu_pack_b_bf16x2(panel, b, offset, k_stride, col_stride, cols, depth);
}
extern "C" int32_t amx_state() { return tessera_cpu_amx_state(); }
"""


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))


HAS_AMX = {"amx_tile", "amx_bf16"} <= _cpu_flags()
X86 = platform.machine().lower() in ("x86_64", "amd64")


def _shim(out_dir: Path, name: str, flags=DEFAULT_CPU_FLAGS):
    lib = ctypes.CDLL(str(compile_cpu(SHIM, out_dir=out_dir, name=name, flags=flags)))
    p, i, q = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    lib.gemm_rows.argtypes = [p, i, p, q, q, p, i, i, i]
    lib.pack_b.argtypes = [p, p, q, q, q, i, i]
    return lib


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    lib = _shim(tmp_path_factory.mktemp("amx"), "amx_emulated", (*DEFAULT_CPU_FLAGS, EMULATE))
    if lib.amx_state() == 0:
        pytest.skip("no AVX512-BF16: the AMX path (and its emulation) is not built")
    return lib


def _gemm_rows(lib, M: int, N: int, K: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """acc (1.5 everywhere, 5 columns wider than N) += A x B through tessera_cpu_gemm_bf16x2_rows, A read
    in place from inside a NaN-filled operand (a read past its rows or its depth turns sums into NaN)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((K, N)).astype(ml_dtypes.bfloat16)
    wide = np.full((M + 1, K + 3), np.nan, dtype=ml_dtypes.bfloat16)
    wide[:M, 2 : 2 + K] = a
    panel = np.zeros(-(-N // 64) * 64 * ((K + 1) // 2) + 64 * 64, np.uint32)
    lib.pack_b(panel.ctypes.data, b.view(np.uint16).ctypes.data, 0, N, 1, N, K)
    acc = np.full((M, N + 5), 1.5, np.float32)
    lib.gemm_rows(acc.ctypes.data, N + 5, wide.view(np.uint16).ctypes.data, 2, K + 3, panel.ctypes.data, M, N, K)
    return acc, a.astype(np.float64) @ b.astype(np.float64) + 1.5


# (M, N, K): one 32 x 32 tile grid and one step; a single 16-row group; rows, columns and k past the
# tiles (an odd K); a strip whose second half has 2 live columns; fewer rows than a tile (no AMX).
SHAPES = [(32, 32, 32), (16, 64, 64), (37, 100, 75), (48, 130, 96), (80, 33, 97), (15, 64, 64)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tiles_and_their_edges_match_numpy(shape, emulated):
    assert emulated.amx_state() == 1
    acc, expected = _gemm_rows(emulated, *shape, seed=sum(shape))
    M, N, K = shape
    assert_close(acc[:, :N], expected, "float32", atol_scale=np.sqrt(K))
    assert np.all(acc[:, N:] == 1.5), "a column past the live ones was written"


# (M, N, K) of int8: one 32 x 32 grid of one 64-k step; rows, columns and k past the tiles; a strip
# whose second half has 2 live columns; fewer rows than a tile.
INT8_SHAPES = [(32, 32, 64), (37, 100, 150), (48, 98, 131), (15, 64, 128)]


def _int8_matches_numpy(lib, M: int, N: int, K: int, seed: int) -> None:
    """tests/tile/test_gemm_int8.py's check of tessera_cpu_gemm_s8x4_rows, over the whole int8 range."""
    rng = np.random.default_rng(seed)
    a, b = int8_cases.full_range((M, K), rng), int8_cases.full_range((K, N), rng)
    got = int8_cases.gemm_rows(lib, a, int8_cases.pack(lib, b, transposed=False), N)
    np.testing.assert_array_equal(got, (a.astype(np.int64) @ b.astype(np.int64) + 7).astype(np.int32))


@pytest.fixture(scope="module")
def emulated_int8(tmp_path_factory):
    lib = int8_cases.shim(tmp_path_factory.mktemp("amx_int8"), "amx_int8_emulated", (*DEFAULT_CPU_FLAGS, EMULATE))
    if lib.amx_state() == 0:
        pytest.skip("no AVX512-BF16: the AMX path (and its emulation) is not built")
    return lib


@pytest.mark.parametrize("shape", INT8_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_int8_tiles_and_their_edges_match_numpy(shape, emulated_int8):
    assert emulated_int8.amx_state() == 1
    _int8_matches_numpy(emulated_int8, *shape, seed=sum(shape))


def test_turned_off_it_runs_the_vdpbf16ps_micro_kernel(tmp_path, monkeypatch, emulated):
    monkeypatch.setenv("TESSERA_CPU_AMX", "0")
    lib = _shim(tmp_path, "amx_off", (*DEFAULT_CPU_FLAGS, EMULATE))  # a library that has not probed yet
    assert lib.amx_state() == -3
    acc, expected = _gemm_rows(lib, 37, 100, 75, seed=1)
    assert_close(acc[:, :100], expected, "float32", atol_scale=np.sqrt(75))


def test_a_whole_gemm_tile_program_on_emulated_tiles(tmp_path, emulated):
    """The CPU GEMM's tile program (blocks, K steps, B shared across row blocks, a batch, a bias +
    GELU epilogue) built with the emulation: the block calls reach the tile path with their offsets."""
    cpu = (Path(__file__).parents[2] / "configs" / "cpu.yaml").read_text()
    assert "-march=native" in cpu
    config = tmp_path / "cpu_amx_emulated.yaml"
    config.write_text(cpu.replace("-march=native", f"-march=native, {EMULATE}"))
    spec = GemmSpec(70, 100, 101, dtype_a="bfloat16", batch=(2,), epilogue=BIAS_GELU)
    arrays = random_inputs(spec, seed=3)
    schedule = TileSchedule(block_m=48, block_n=64, block_k=64)
    out = run_cpu(spec, arrays, str(config), tmp_path / "build", schedule=schedule)["C"]
    assert_close(out, reference(spec, arrays), spec.dtype_out, atol_scale=np.sqrt(spec.K))


@pytest.mark.skipif(not X86, reason="AMX is an x86 unit")
def test_the_tile_unit_build_compiles_to_tile_instructions(tmp_path):
    """What -march=native makes of cpu_amx.h on a CPU with AMX (Sapphire Rapids), built here."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) shows the library's instructions")
    flags = [f.replace("-march=native", "-march=sapphirerapids") for f in DEFAULT_CPU_FLAGS]
    for source, name, dot in ((SHIM, "amx_spr", "tdpbf16ps"), (int8_cases.SHIM, "amx_int8_spr", "tdpbssd")):
        library = compile_cpu(source, out_dir=tmp_path, name=name, flags=flags)
        code = subprocess.run([objdump, "-d", str(library)], capture_output=True, text=True, check=True).stdout
        for instruction in ("ldtilecfg", "tileloadd", dot, "tilestored", "tilerelease"):
            assert instruction in code, (name, instruction)


@pytest.mark.skipif(not HAS_AMX, reason="the CPU has no AMX-BF16 tile unit")
def test_on_the_tile_unit(tmp_path, cpu_config):
    spec = GemmSpec(70, 100, 101, dtype_a="bfloat16", batch=(2,), epilogue=BIAS_GELU)
    arrays = random_inputs(spec, seed=3)
    out = run_cpu(spec, arrays, cpu_config, tmp_path / "build", schedule=TileSchedule(48, 64, 64))["C"]
    assert_close(out, reference(spec, arrays), spec.dtype_out, atol_scale=np.sqrt(spec.K))
    lib = _shim(tmp_path, "amx_native")
    assert lib.amx_state() == 1, "Linux refused the tile registers, or the unit failed the self-check"
    for shape in SHAPES:
        acc, expected = _gemm_rows(lib, *shape, seed=sum(shape))
        M, N, K = shape
        assert_close(acc[:, :N], expected, "float32", atol_scale=np.sqrt(K))
        assert np.all(acc[:, N:] == 1.5)
    lib = int8_cases.shim(tmp_path, "amx_int8_native")
    assert lib.amx_state() == 1
    for shape in INT8_SHAPES:
        _int8_matches_numpy(lib, *shape, seed=sum(shape))
