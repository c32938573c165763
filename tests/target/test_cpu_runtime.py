"""Tessera's CPU runtime header (src/target/include/tessera): tessera_expf (and its form for the
exponents of a softmax, tessera_expf_nonpositive) against numpy, and the
claim that makes it worth having: the loops of a CPU softmax vectorise with it."""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest

import tessera_tvm
from tessera_tvm import load_config
from tessera_tvm.target.cpu import RUNTIME_INCLUDE_DIR, compile_cpu
from tessera_tvm.target.toolchain import require_tool, tilelang_include_dirs
from tessera_tvm.tile import SoftmaxSpec, build_tile_program

EXP_ALL = """
#include <tessera/cpu_math.h>
extern "C" int32_t exp_all(const float* x, float* y, int32_t n) {
  for (int32_t i = 0; i < n; ++i) y[i] = tessera_expf(x[i]);
  return 0;
}
extern "C" int32_t exp_nonpositive_all(const float* x, float* y, int32_t n) {
  for (int32_t i = 0; i < n; ++i) y[i] = tessera_expf_nonpositive(x[i]);
  return 0;
}
"""


@pytest.fixture(scope="module")
def exp_library(tmp_path_factory):
    return ctypes.CDLL(str(compile_cpu(EXP_ALL, out_dir=tmp_path_factory.mktemp("expf"), name="expf")))


def _elementwise(fn):
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]

    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty_like(x)
        fn(x.ctypes.data, y.ctypes.data, x.size)
        return y

    return run


@pytest.fixture(scope="module")
def exp_all(exp_library):
    return _elementwise(exp_library.exp_all)


@pytest.fixture(scope="module")
def exp_nonpositive_all(exp_library):
    return _elementwise(exp_library.exp_nonpositive_all)


def test_expf_is_within_two_ulp_of_exp(exp_all):
    x = np.concatenate([np.linspace(-87.0, 88.5, 400_001, dtype=np.float32), np.float32([0.0, -0.0, 1e-30, -1e-30])])
    got = exp_all(x).astype(np.float64)
    exact = np.exp(x.astype(np.float64))
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - exact) / ulp) <= 2.0


def test_expf_special_values(exp_all):
    x = np.float32([-np.inf, np.inf, np.nan, -104.0, 89.0, -100.0])
    got = exp_all(x)
    assert got[0] == 0.0 and got[1] == np.inf and np.isnan(got[2])
    assert got[3] == 0.0 and got[4] == np.inf  # past the float range
    assert got[5] == pytest.approx(np.exp(-100.0), rel=1e-3)  # a subnormal, rounded


def test_expf_of_a_nonpositive_argument_is_within_one_ulp_where_exp_is_a_normal_float(exp_nonpositive_all):
    x = np.concatenate([np.linspace(-87.33, 0.0, 400_001, dtype=np.float32), np.float32([-0.0, -1e-30, -1e-7])])
    got = exp_nonpositive_all(x).astype(np.float64)
    exact = np.exp(x.astype(np.float64))
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - exact) / ulp) <= 1.0


def test_expf_of_a_nonpositive_argument_special_values(exp_nonpositive_all):
    # -inf: a masked score; below ln(2^-126) the result would not be a normal float: 0
    x = np.float32([-np.inf, np.nan, -87.34, -88.0, -1e30, 0.0, -0.0])
    got = exp_nonpositive_all(x)
    assert (got[[0, 2, 3, 4]] == 0.0).all() and np.isnan(got[1]) and (got[5:] == 1.0).all()


def test_softmax_loops_vectorise(tmp_path):
    """g++ reports the loops of an fp32 softmax row (max, exp and sum, scale) as vectorised."""
    source = tessera_tvm.lower(build_tile_program(SoftmaxSpec((64, 4096), -1), None, "c"), "cpu", build=False).source
    (tmp_path / "softmax.cpp").write_text(source)
    command = [require_tool("g++"), "-std=c++17", *load_config("cpu").codegen_dict["flags"], "-fopt-info-vec-optimized"]
    command += [f"-I{RUNTIME_INCLUDE_DIR}", f"-I{tilelang_include_dirs()[0]}", "-c", "softmax.cpp", "-o", "softmax.o"]
    report = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=True).stderr
    vectorised = {int(line.split(":")[1]) for line in report.splitlines() if "loop vectorized" in line}
    lines = source.splitlines()
    # The loops over the row's data: the lane loops inside each chunk loop (max, exp + sum), the scale.
    data_loops = [n + 1 for n, text in enumerate(lines, 1) if text.strip().startswith("for (int32_t chunk")]
    data_loops += [n for n, text in enumerate(lines, 1) if text.strip().startswith("for (int32_t r = 0; r < 4096;")]
    assert len(data_loops) == 3, source
    missing = [lines[n - 1].strip() for n in data_loops if n not in vectorised]
    assert not missing, f"not vectorised: {missing}\n{report}"
