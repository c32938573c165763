"""Local arrays of CPU kernels are declared 64-byte aligned (GCC 12.2 lays out a parallel region's
arrays 16-byte aligned but vectorises stores to them as 32-byte aligned)."""

from __future__ import annotations

import numpy as np

import tessera_tvm
from tessera_tvm.target.cpu import aligned_local_arrays
from tessera_tvm.tile import Conv2dSpec, build_tile_program


def test_the_declarations_of_a_parallel_region_get_the_alignment_and_nothing_else_changes():
    source = "TESSERA_PARALLEL_BEGIN(4);\n  float acc[3136];\n  int32_t idx[8];\n  x[3] = y[4];\n  return v[2];\n"
    out = aligned_local_arrays(source)
    assert "float acc[3136] __attribute__((aligned(64)));" in out
    assert "int32_t idx[8] __attribute__((aligned(64)));" in out
    assert "  x[3] = y[4];" in out and "  return v[2];" in out  # statements, not declarations
    assert aligned_local_arrays("  float acc[16];\n") == "  float acc[16];\n"  # no parallel region


def test_a_depthwise_convolution_whose_accumulator_rows_end_in_half_a_vector_runs():
    # 56 floats a row: GCC stored each row's last 8 floats with vmovaps to an address 16 mod 32,
    # which crashed the process (SIGSEGV) before the arrays were declared aligned.
    spec = Conv2dSpec(1, 8, 56, 56, 8, 7, 7, padding=(3, 3, 3, 3), groups=8)
    lowered = tessera_tvm.lower(build_tile_program(spec, None, "c"), "cpu")
    assert "__attribute__((aligned(64)))" in lowered.source
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 8, 56, 56)).astype(np.float32), rng.standard_normal((8, 1, 7, 7)).astype(np.float32)
    y = np.zeros((1, 8, 56, 56), np.float32)
    lowered(x, w, y)
    padded = np.pad(x[0].astype(np.float64), ((0, 0), (3, 3), (3, 3)))
    expected = sum(padded[:, r : r + 56, s : s + 56] * w[:, 0, r, s][:, None, None] for r in range(7) for s in range(7))
    np.testing.assert_allclose(y[0], expected, rtol=1e-4, atol=1e-4)
