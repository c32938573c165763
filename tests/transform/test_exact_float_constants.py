"""tessera.ExactFloatConstants: float constants that TVM's C code generator prints exactly."""

from __future__ import annotations

import math

import numpy as np

import tessera_tvm
from tessera_tvm._tvm import T, tvm
from tessera_tvm.transform.exact_float_constants import exact_float_constants


def divide_by(constant: float, dtype: str = "float32"):
    @T.prim_func
    def main(A: T.Tensor((64,), dtype), B: T.Tensor((64,), dtype)):
        with T.Kernel(1, threads=1) as _:
            for i in T.serial(64):
                B[i] = A[i] / T.cast(constant, dtype)

    return main


def _constants(func) -> list:
    found = []
    tvm.tirx.stmt_functor.post_order_visit(
        func.body, lambda n: found.append(n) if isinstance(n, tvm.tirx.FloatImm) else None
    )
    return found


def test_a_constant_printed_with_seven_digits_becomes_a_sum_of_exact_ones():
    value = np.float32(math.log(16.0))  # 2.77258873: printed as 2.772589e+00f
    parts = [np.float32(n.value) for n in _constants(exact_float_constants(divide_by(math.log(16.0))))]
    assert len(parts) == 2 and all(np.float32(f"{p:e}") == p for p in parts)  # each printed exactly
    assert np.float32(parts[0] + parts[1]) == value
    unchanged = divide_by(0.5)
    assert exact_float_constants(unchanged).same_as(unchanged)  # 5.000000e-01 is exact already


def test_the_cpu_kernel_divides_by_the_constant_torch_divides_by():
    # Was: log(16) printed as 2.772589e+00f, one unit in the last place low: 2.0 * log(16) / log(16)
    # gave 1.9999999, which T5's buckets truncate to 1.
    lowered = tessera_tvm.lower(divide_by(math.log(16.0)), "cpu")
    a = (np.arange(64, dtype=np.float32) + 1) * np.float32(math.log(16.0))
    b = np.zeros(64, np.float32)
    lowered(a, b)
    np.testing.assert_array_equal(b, a / np.float32(math.log(16.0)))
    assert "tessera.ExactFloatConstants" in [r.name for r in lowered.pass_log]
