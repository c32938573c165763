# ruff: noqa: F821, F722  (Tensor["M", "K", ts.f32]: dim names are strings, not forward references)
"""Backward kernels through Relax's Gradient pass, checked against central finite differences.

Each kernel's VJP adjoint is partitioned for Tessera, compiled for the CPU and run in the VM; its
gradients must match finite differences of a float64 numpy forward. Tolerance: the adjoint runs in
float32 (relative error ~1e-6 per op, sums of <= 40 terms), the differences in float64 with step
1e-6 (truncation ~1e-12, cancellation ~1e-10): 1e-3 absolute+relative leaves room for the float32
side only; a wrong rule is off by O(1).
"""

# No `from __future__ import annotations`: the kernels annotate with ts types evaluated at definition.

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops
from tessera_tvm.errors import TesseraError
from tessera_tvm.relax import build, grad

from .models import gelu, layer_norm, softmax

M, K, N = 6, 5, 7


@ts.kernel
def linear_gelu(
    A: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]
) -> Tensor["M", "N", ts.f32]:
    return ops.gelu(ops.matmul(A, W) + b)


@ts.kernel
def linear_gelu_tanh(A: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.gelu(ops.matmul(A, W), approximate="tanh")


@ts.kernel
def row_softmax(x: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.softmax(x)


@ts.kernel
def norm(x: Tensor["M", "N", ts.f32], w: Tensor["N", ts.f32], b: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.layer_norm(x, w, b)


@ts.kernel
def rms(x: Tensor["M", "N", ts.f32], w: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.rms_norm(x, w)


@ts.kernel
def attention(
    Q: Tensor[1, 2, 8, 16, ts.f32], K: Tensor[1, 2, 8, 16, ts.f32], V: Tensor[1, 2, 8, 16, ts.f32]
) -> Tensor[1, 2, 8, 16, ts.f32]:
    return ops.flash_attention(Q, K, V)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


CASES = {
    "linear_gelu": (linear_gelu, {"M": M, "K": K, "N": N}, [(M, K), (K, N), (N,)], lambda a, w, b: gelu(a @ w + b)),
    "linear_gelu_tanh": (linear_gelu_tanh, {"M": M, "K": K, "N": N}, [(M, K), (K, N)], lambda a, w: _gelu_tanh(a @ w)),
    "softmax": (row_softmax, {"M": M, "N": N}, [(M, N)], softmax),
    "layer_norm": (norm, {"M": M, "N": N}, [(M, N), (N,), (N,)], layer_norm),
    "rms_norm": (
        rms,
        {"M": M, "N": N},
        [(M, N), (N,)],
        lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w,
    ),
}


def _finite_differences(forward, inputs, dout, eps=1e-6):
    grads = []
    for i, x in enumerate(inputs):
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus, minus = [a.copy() for a in inputs], [a.copy() for a in inputs]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            g[idx] = ((forward(*plus) * dout).sum() - (forward(*minus) * dout).sum()) / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize("case", list(CASES))
def test_backward_matches_finite_differences(case):
    kernel, shapes, input_shapes, forward = CASES[case]
    backward = grad(kernel, shapes=shapes)
    built = build(backward.module, "cpu")
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in input_shapes]
    dout = rng.standard_normal((M, N)).astype(np.float32)
    loss, grads = built.run(backward.function, *inputs, dout)
    as64 = [a.astype(np.float64) for a in inputs]
    np.testing.assert_allclose(loss, (forward(*as64) * dout).sum(), rtol=1e-4, atol=1e-4)
    expected = _finite_differences(forward, as64, dout.astype(np.float64))
    assert backward.wrt == tuple(n for n, _ in kernel.params)
    for name, got, want in zip(backward.wrt, grads, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg=f"{case}: d{name}")
    if case.startswith("linear"):  # the backward's matmuls (dA = dY W^T, dW = A^T dY) are Tessera kernels
        adjoint = [o for o in built.report.offloaded if o.function == backward.function]
        assert sum(o.ops.startswith("matmul") for o in adjoint) >= 2


def test_no_gradient_rule_is_said():
    with pytest.raises(TesseraError, match=r"R\.nn\.attention .*no rule"):
        grad(attention)


def test_wrt_selects_inputs():
    backward = grad(linear_gelu, shapes={"M": M, "K": K, "N": N}, wrt=["W"])
    assert backward.wrt == ("W",)
    with pytest.raises(TesseraError, match="no input"):
        grad(linear_gelu, shapes={"M": M, "K": K, "N": N}, wrt=["X"])
