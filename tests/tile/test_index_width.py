"""Index width: a buffer that can hold 2^31 elements or more gets 64-bit offsets (tile/base.py
``index_dtype``), in the offsets the CPU GEMM passes to its packing routines as in TileLang's
buffer accesses on every target, and a grid over a dim of 2^31 or more lowers (issue #37, item 2).

Nothing here allocates such a buffer for real: the run uses ``np.zeros``, which the OS maps lazily
to the shared zero page, with only a few rows written.
"""

# ruff: noqa: F821, F722  (Tensor["M", "K", ts.f32]: dim names are strings, not forward references)

import re

import numpy as np
import pytest

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops
from tessera_tvm import tvm
from tessera_tvm.tile import GemmSpec, build_tile_program

from .conftest import run_cpu

INT32_ELEMENTS = 2**31

#: A [2^21, 1025]: 2^31 + 2^21 elements, the last 2^21 of them past int32's reach.
BIG_M, BIG_K = 2**21, 1025


def test_index_dtype_is_int64_from_2_to_the_31_elements_and_for_symbolic_dims():
    from tessera_tvm.tile.base import index_dtype

    assert index_dtype((2**16, 2**15 - 1)) == "int32"
    assert index_dtype((2**16, 2**15)) == "int64"
    assert index_dtype((BIG_M, BIG_K)) == "int64" and BIG_M * BIG_K > INT32_ELEMENTS
    assert index_dtype((tvm.tirx.IntImm("int64", 2**31),)) == "int64"
    assert index_dtype((tvm.tirx.Var("batch", "int32"), 4)) == "int64"  # a dynamic dim may be large


def _pack_a_offset(source: str) -> str:
    return re.search(r"tessera_cpu_pack_a_f32\(\(&\(a_pack\[0\]\)\), A, ([^;]*)\);", source).group(1)


def test_cpu_gemm_packs_a_large_a_through_64_bit_offsets():
    """Before: ``tessera_cpu_pack_a_f32(..., A, ((by * 229600) + (k * 128)), ...)`` in int32."""
    lowered = tessera_tvm.lower(build_tile_program(GemmSpec(BIG_M, 1, BIG_K, dtype_a="float32"), None, "c"), "cpu")
    # The whole offset in int64 (by * block_m * K overflows int32), not an int32 product widened late.
    offset = _pack_a_offset(lowered.source)
    assert offset.startswith("((((int64_t)by) * (int64_t)229600) + (((int64_t)k) * (int64_t)128))"), offset
    assert "int32_t tessera_cpu_pack_a_f32(float*, float*, int64_t, int64_t, int64_t, int32_t, int32_t);" in (
        lowered.source
    )


def test_cpu_gemm_reads_the_rows_of_a_large_a_past_2_to_the_31_elements(tmp_path):
    """Before: the packing offset wrapped to a negative int32 and read memory below A (a segfault,
    or wrong rows). The GEMM reads all of A (zero pages: ~1 s); only the rows written are nonzero."""
    spec = GemmSpec(BIG_M, 1, BIG_K, dtype_a="float32")
    a = np.zeros((BIG_M, BIG_K), np.float32)
    last_int32_row = (INT32_ELEMENTS - 1) // BIG_K
    rows = [0, last_int32_row, last_int32_row + 1, BIG_M - 225, BIG_M - 1]
    rng = np.random.default_rng(0)
    a[rows] = rng.standard_normal((len(rows), BIG_K)).astype(np.float32)
    b = rng.standard_normal((BIG_K, 1)).astype(np.float32)
    out = run_cpu(spec, {"A": a, "B": b}, "cpu", tmp_path)["C"]
    expected = a[rows].astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out[rows], expected, rtol=1e-4, atol=1e-4 * np.sqrt(BIG_K))
    out[rows] = 0
    assert not out.any(), f"rows of zeros in A gave nonzero output at {np.flatnonzero(out)[:8]}"


@ts.kernel
def linear_relu(a: Tensor["M", "K", ts.f32], b: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.relu(a @ b)


def test_a_dim_of_2_to_the_31_compiles_for_the_cpu():
    """Before: TVM's ``Check failed: value.dtype() == var.dtype() (int64 vs. int32)`` in
    tessera.LowerParallelGrid (the grid over M had an int64 extent)."""
    compiled = ts.compile(linear_relu, target="cpu", shapes={"M": 2**31, "K": 16, "N": 64}, build=False)
    source = compiled.source
    assert "int64_t by = ((int64_t)(block % 9586981));" in source  # ceil(2^31 / 224) blocks fit int32
    assert "tessera_cpu_pack_a_f32((&(a_pack[0])), a, (by * (int64_t)3584)" in source


@pytest.mark.parametrize("target", ["ampere", "rocm"])
def test_gpu_sources_read_a_large_a_through_64_bit_offsets(target):
    """TileLang's tl.ConfigIndexBitwidth widens the buffer accesses (CUDA, HIP): a guard that it stays."""
    compiled = ts.compile(linear_relu, target=target, shapes={"M": BIG_M, "K": BIG_K, "N": 64}, build=False)
    reads_of_a = [line for line in compiled.source.splitlines() if re.search(r"\ba\[|\(a \+", line)]
    assert reads_of_a and all("(((int64_t)((int)blockIdx.y)) * (int64_t)" in line for line in reads_of_a), reads_of_a
