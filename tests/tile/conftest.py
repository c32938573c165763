"""Helpers for the Tile IR tests: build a spec for the CPU, run it on numpy arrays, compare."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import tessera_tvm
from tessera_tvm.target.cpu import numpy_dtype
from tessera_tvm.tile import KernelSpec, build_tile_program

# Tolerances against a float64 reference computed from the same (already rounded) inputs. The
# kernels accumulate in fp32, so what is left is the rounding of the result to the output dtype
# (fp16: 2^-11, bf16: 2^-8 relative) and of explicit intermediate casts, plus fp32 summation-order
# error ~ sqrt(K) * 2^-24 that callers scale with ``atol_scale``.
TOLERANCE = {
    "float32": 1e-5,  # summation order only
    "float16": 1e-2,  # half-ulp 4.9e-4 on O(1) values, with margin for exp/erf of rounded inputs
    "bfloat16": 2e-2,  # half-ulp 3.9e-3 on O(1) values, same margin
}

# erf without scipy (not a dependency): the same vectorised math.erf the ops' reference uses.
erf = np.vectorize(math.erf, otypes=[np.float64])


@pytest.fixture(scope="session")
def cpu_config() -> str:
    """The CPU config the numerics tests lower with (bf16 works through tirx.BF16StorageLegalize)."""
    return "cpu"


def random_inputs(spec: KernelSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal inputs in each parameter's dtype (rounded once, so the reference sees them too)."""
    rng = np.random.default_rng(seed)
    return {p.name: rng.standard_normal(p.shape).astype(numpy_dtype(p.dtype)) for p in spec.inputs()}


def run_cpu(spec: KernelSpec, inputs: dict[str, np.ndarray], config: str, out_dir: Path, schedule=None):
    """Lower ``spec`` for the CPU, run it on ``inputs``; returns {output name: array}."""
    lowered = tessera_tvm.lower(build_tile_program(spec, schedule, "c"), config, out_dir=out_dir)
    outputs = {p.name: np.zeros(p.shape, numpy_dtype(p.dtype)) for p in spec.outputs()}
    call_in_spec_order(lowered, spec, {**inputs, **outputs})
    return outputs


def call_in_spec_order(lowered, spec: KernelSpec, arrays: dict[str, np.ndarray]) -> None:
    """Call a lowered CPU kernel with the arrays of ``spec.params()``, in that (the PrimFunc's) order."""
    lowered(*[arrays[p.name] for p in spec.params()])


def as64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def assert_close(actual: np.ndarray, expected: np.ndarray, dtype: str, atol_scale: float = 1.0) -> None:
    """Compare with the per-dtype tolerance (relative and absolute, ``atol_scale`` for sums of many terms)."""
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(as64(actual), expected, rtol=tol, atol=tol * atol_scale)
