"""Shared helpers of the frontend tests: random inputs and the per-dtype tolerances."""

from __future__ import annotations

import numpy as np

import tessera as ts

#: (rtol, atol) per result dtype, against tessera.reference (which rounds after every op while a
#: fused kernel keeps float32 until its store):
#: - f32: 1e-4: summation order and C libm vs numpy exp/erf/tanh differ in the last bits.
#: - f16: 1e-2: 11-bit mantissa (eps 9.8e-4); the reference rounds once per op, the kernel once, so
#:   results may differ by a few ulps of the largest intermediate.
#: - bf16: 6e-2: 8-bit mantissa (eps 7.8e-3); same reasoning, a few ulps.
TOLERANCE = {ts.f32: (1e-4, 1e-4), ts.f16: (1e-2, 1e-2), ts.bf16: (6e-2, 6e-2), ts.int32: (0, 0)}


def random_array(rng: np.random.Generator, shape, dtype: ts.DType, scale: float = 1.0) -> np.ndarray:
    """Standard-normal values (times ``scale``) of ``dtype``; small integers for int8."""
    if not dtype.is_float:
        return rng.integers(-100, 100, size=shape).astype(dtype.numpy)
    return (rng.standard_normal(shape) * scale).astype(dtype.numpy)


def assert_close(out: np.ndarray, ref: np.ndarray, dtype: ts.DType, what: str = "") -> None:
    """``out`` matches ``ref`` within the tolerance of ``dtype`` (shapes and dtypes equal)."""
    assert out.dtype == ref.dtype, f"{what}: dtype {out.dtype} vs reference {ref.dtype}"
    assert out.shape == ref.shape, f"{what}: shape {out.shape} vs reference {ref.shape}"
    rtol, atol = TOLERANCE[dtype]
    o, r = out.astype(np.float64), ref.astype(np.float64)
    bad = np.abs(o - r) > atol + rtol * np.abs(r)
    assert not bad.any(), (
        f"{what}: {bad.sum()} of {bad.size} elements off (rtol={rtol}, atol={atol}); "
        f"max |diff| {np.abs(o - r).max():.3g} at {np.unravel_index(np.abs(o - r).argmax(), o.shape)}"
    )


def hang_block_m_16(jobs: list, hang) -> list:
    """A search's compile jobs with the block_m=16 candidate carrying ``hang`` (unpickled by the worker,
    so while its compile limit runs). The others are compiled here first: the workers find them in the
    kernel cache, and a short limit catches only the hang."""
    from tessera import tuning

    for _, job in jobs:
        if job["schedule"].block_m != 16:
            assert tuning.workers.compile_candidate(job)["ok"]
    return [(tag, {**job, "hang": hang} if job["schedule"].block_m == 16 else job) for tag, job in jobs]
