"""CPU numerics of every op and of fused combinations against tessera.reference.

Shapes are drawn at random (fixed seeds) and are not multiples of the CPU blocks (GEMM 224x256x128 shrunk to the problem,
attention 96x112, reductions 8x256, element-wise 16x256), so every kernel's masked edges run.
Tolerances per dtype are in helpers.TOLERANCE with their reasons. Depends on the tile library
(tessera_tvm.tile) for the kernels and on g++ for the CPU build.
"""

# No `from __future__ import annotations`: kernels below annotate with closure variables (dtype).

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops

from .helpers import assert_close, random_array

FLOATS = [ts.f32, ts.f16, ts.bf16]


def run(kernel, *arrays):
    """Compile for the CPU, run, compare with the body run on the reference ops; return the result."""
    out = ts.compile(kernel, target="cpu")(*arrays)
    ref = kernel.reference(*arrays)
    outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    for o, r in zip(outs, refs, strict=True):
        assert_close(o, np.asarray(r), ts.dtype(o.dtype), kernel.name)
    return out


def dims(seed: int, *ranges):
    """One random size per (low, high) range; never a multiple of 16."""
    rng = np.random.default_rng(seed)
    out = []
    for low, high in ranges:
        n = int(rng.integers(low, high))
        out.append(n + 1 if n % 16 == 0 else n)
    return out


# --------------------------------------------------------------------------- element-wise, f32


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_binary_ops_broadcast(name):
    m, n = dims(1, (20, 90), (200, 300))
    op = getattr(ops, name)

    @ts.kernel
    def binary(
        x: Tensor["M", "N", ts.f32], row: Tensor["N", ts.f32], col: Tensor["M", 1, ts.f32]
    ) -> Tensor["M", "N", ts.f32]:
        return op(op(x, row), col)

    rng = np.random.default_rng(2)
    x, row, col = random_array(rng, (m, n), ts.f32), random_array(rng, n, ts.f32), random_array(rng, (m, 1), ts.f32)
    if name == "div":
        row, col = np.abs(row) + 0.5, np.abs(col) + 0.5
    run(binary, x, row, col)


def test_python_operators_and_numbers_on_either_side():
    @ts.kernel
    def arith(x: Tensor["M", "N", ts.f32], y: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
        return (2.0 - x) * y / 4.0 + 1 - -x + 3.0 / (y * y + 1.0)

    rng = np.random.default_rng(3)
    m, n = dims(3, (5, 40), (30, 300))
    run(arith, random_array(rng, (m, n), ts.f32), random_array(rng, (m, n), ts.f32))


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("neg", {}),
        ("relu", {}),
        ("gelu", {}),
        ("gelu", {"approximate": "tanh"}),
        ("silu", {}),
        ("sigmoid", {}),
        ("exp", {}),
        ("tanh", {}),
        ("scale", {"s": -0.75}),
        ("clip", {"lo": 0, "hi": 6}),  # ReLU6
        ("clip", {"lo": -0.5}),
        ("clip", {"hi": 1.25}),
    ],
)
def test_unary_ops(name, kwargs):
    op = getattr(ops, name)

    @ts.kernel
    def unary(x: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
        return op(x, **kwargs)

    m, n = dims(4, (3, 50), (100, 600))
    run(unary, random_array(np.random.default_rng(4), (m, n), ts.f32, scale=2.0))


@pytest.mark.parametrize("src, dst", [(ts.f32, ts.f16), (ts.f16, ts.bf16), (ts.bf16, ts.f32), (ts.f32, ts.int32)])
def test_cast(src, dst):
    @ts.kernel
    def cast(x: Tensor["M", src]) -> Tensor["M", dst]:
        return ops.cast(x, dst)

    (m,) = dims(5, (100, 1000))
    run(cast, random_array(np.random.default_rng(5), (m,), src, scale=50.0))


# -------------------------------------------------------------------------------------- matmul


def test_matmul_2d_non_multiples():
    @ts.kernel
    def mm(a: Tensor["M", "K", ts.f32], b: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
        return ops.matmul(a, b)

    m, n, k = dims(6, (65, 150), (65, 150), (33, 100))
    rng = np.random.default_rng(6)
    run(mm, random_array(rng, (m, k), ts.f32), random_array(rng, (k, n), ts.f32))


def test_matmul_batched_with_shared_weight():
    @ts.kernel
    def bmm(
        x: Tensor["B", "M", "K", ts.f32], w: Tensor["K", "N", ts.f32], y: Tensor["B", "K", "N", ts.f32]
    ) -> Tensor["B", "M", "N", ts.f32]:
        return ops.matmul(x, w) + ops.matmul(x, y)

    b, m, n, k = dims(7, (2, 4), (10, 70), (10, 70), (5, 40))
    rng = np.random.default_rng(7)
    run(
        bmm,
        random_array(rng, (b, m, k), ts.f32),
        random_array(rng, (k, n), ts.f32),
        random_array(rng, (b, k, n), ts.f32),
    )


def test_matmul_transposed_operands():
    @ts.kernel
    def mm_t(a: Tensor["K", "M", ts.f32], b: Tensor["N", "K", ts.f32]) -> Tensor["M", "N", ts.f32]:
        return ops.matmul(a, b, transpose_a=True, transpose_b=True)

    m, n, k = dims(8, (30, 80), (30, 80), (20, 50))
    rng = np.random.default_rng(8)
    run(mm_t, random_array(rng, (k, m), ts.f32), random_array(rng, (n, k), ts.f32))


def test_matmul_out_dtype():
    @ts.kernel
    def mm_wide(a: Tensor["M", "K", ts.f16], b: Tensor["K", "N", ts.f16]) -> Tensor["M", "N", ts.f32]:
        return ops.matmul(a, b, out_dtype=ts.f32)

    m, n, k = dims(9, (30, 80), (30, 80), (20, 50))
    rng = np.random.default_rng(9)
    run(mm_wide, random_array(rng, (m, k), ts.f16), random_array(rng, (k, n), ts.f16))


def test_matmul_int8_accumulates_in_int32():
    @ts.kernel
    def mm_i8(a: Tensor["M", "K", ts.int8], b: Tensor["K", "N", ts.int8]) -> Tensor["M", "N", ts.int32]:
        return ops.matmul(a, b)

    m, n, k = dims(10, (30, 80), (30, 80), (50, 150))
    rng = np.random.default_rng(10)
    run(mm_i8, random_array(rng, (m, k), ts.int8), random_array(rng, (k, n), ts.int8))


def full_range(rng: np.random.Generator, shape, dtype: ts.DType) -> np.ndarray:
    """Integers over the whole range of ``dtype`` (random_array's are small: nothing wraps)."""
    info = np.iinfo(dtype.numpy)
    return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype.numpy)


def test_int32_elementwise_is_exact_and_wraps():
    """int32 arithmetic in int32, wrapping as numpy's (it ran in float32: the low bits of values past
    2^24 were lost and every overflow saturated to INT_MIN)."""

    @ts.kernel
    def int32_chain(x: Tensor["M", "N", ts.int32], y: Tensor["M", "N", ts.int32]):
        return x * y + x - 7

    rng = np.random.default_rng(30)
    out = run(int32_chain, full_range(rng, (9, 37), ts.int32), full_range(rng, (9, 37), ts.int32))
    assert (out != np.iinfo(np.int32).min).all()


def test_int8_ops_wrap_before_a_cast():
    """An int8 op's result is int8 (wrapped) before a cast widens it, as in the reference (a fused
    kernel kept a * b + a unwrapped in float32: 9638 where int8 arithmetic gives -90)."""

    @ts.kernel
    def widened(a: Tensor["M", "N", ts.int8], b: Tensor["M", "N", ts.int8]):
        return ops.cast(a * b + a, ts.int32), ops.cast(a - b, ts.f32)

    rng = np.random.default_rng(31)
    run(widened, full_range(rng, (9, 37), ts.int8), full_range(rng, (9, 37), ts.int8))


@pytest.mark.parametrize("axis", [-1, 0])
def test_int32_max_is_exact(axis):
    """An int32 max in int32 (in float32 it rounded the low bits away and saturated INT_MAX)."""

    @ts.kernel
    def int32_max(x: Tensor["M", "N", ts.int32]):
        return ops.max(x, axis=axis)

    x = full_range(np.random.default_rng(32), (9, 37), ts.int32)
    x[3, 5] = np.iinfo(np.int32).max
    run(int32_max, x)


def test_matmul_fp8_accumulates_in_f32():
    @ts.kernel
    def mm_fp8(a: Tensor["M", "K", ts.fp8_e4m3], b: Tensor["K", "N", ts.fp8_e4m3]) -> Tensor["M", "N", ts.f32]:
        return ops.matmul(a, b)

    m, n, k = dims(11, (30, 80), (30, 80), (20, 50))
    rng = np.random.default_rng(11)
    run(mm_fp8, random_array(rng, (m, k), ts.fp8_e4m3), random_array(rng, (k, n), ts.fp8_e4m3))


# ------------------------------------------------------------------------- softmax, norms, sums


@pytest.mark.parametrize("shape, axis", [((37, 300), -1), ((37, 300), 0), ((5, 33, 20), 1)])
def test_softmax_any_axis(shape, axis):
    rank = len(shape)

    @ts.kernel
    def sm(x: Tensor[("A", "B", "C")[:rank] + (ts.f32,)]) -> Tensor[("A", "B", "C")[:rank] + (ts.f32,)]:
        return ops.softmax(x, axis=axis)

    run(sm, random_array(np.random.default_rng(12), shape, ts.f32, scale=20.0))


@pytest.mark.parametrize("weight, bias", [(False, False), (True, True), (True, False)])
def test_layer_norm(weight, bias):
    @ts.kernel
    def ln(x: Tensor["M", "N", ts.f32], w: Tensor["N", ts.f32], b: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
        return ops.layer_norm(x, w if weight else None, b if bias else None, eps=1e-3)

    m, n = dims(13, (20, 60), (260, 700))
    rng = np.random.default_rng(13)
    run(ln, random_array(rng, (m, n), ts.f32) + 3, random_array(rng, n, ts.f32), random_array(rng, n, ts.f32))


@pytest.mark.parametrize("weight", [False, True])
def test_rms_norm(weight):
    @ts.kernel
    def rms(x: Tensor["M", "N", ts.f32], w: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
        return ops.rms_norm(x, w if weight else None)

    m, n = dims(14, (20, 60), (100, 300))
    rng = np.random.default_rng(14)
    run(rms, random_array(rng, (m, n), ts.f32), random_array(rng, n, ts.f32))


@pytest.mark.parametrize(
    "name, axis, keepdims",
    [
        ("sum", -1, False),
        ("max", 0, True),
        ("mean", (1, 2), False),
        ("sum", None, False),
        ("max", (0, 1), True),
    ],
)
def test_reductions(name, axis, keepdims):
    op = getattr(ops, name)
    a, b, c = dims(15, (3, 9), (10, 40), (20, 300))
    out_dims = {
        (-1, False): ("A", "B"),
        (0, True): (1, "B", "C"),
        ((1, 2), False): ("A",),
        (None, False): (),
        ((0, 1), True): (1, 1, "C"),
    }[(axis, keepdims)]

    @ts.kernel
    def reduce(x: Tensor["A", "B", "C", ts.f32]) -> Tensor[out_dims + (ts.f32,)]:
        return op(x, axis=axis, keepdims=keepdims)

    run(reduce, random_array(np.random.default_rng(15), (a, b, c), ts.f32))


# ----------------------------------------------------------------------------------- attention


@pytest.mark.parametrize(
    "h, h_kv, s_q, s_kv, causal, align, scale",
    [
        (4, 4, 37, 37, False, "top_left", None),  # multi-head, not causal
        (8, 2, 45, 45, True, "top_left", None),  # grouped-query, causal
        (4, 1, 20, 70, True, "bottom_right", 0.3),  # multi-query, decoding-style causal alignment
        (2, 2, 70, 20, True, "top_left", None),  # more queries than keys
    ],
)
def test_flash_attention(h, h_kv, s_q, s_kv, causal, align, scale):
    @ts.kernel
    def attn(
        Q: Tensor["B", "H", "S", "D", ts.f32],
        K: Tensor["B", "G", "T", "D", ts.f32],
        V: Tensor["B", "G", "T", "D", ts.f32],
    ) -> Tensor["B", "H", "S", "D", ts.f32]:
        return ops.flash_attention(Q, K, V, causal=causal, scale=scale, causal_align=align)

    rng = np.random.default_rng(16)
    b, d = 2, 40
    run(
        attn,
        random_array(rng, (b, h, s_q, d), ts.f32),
        random_array(rng, (b, h_kv, s_kv, d), ts.f32),
        random_array(rng, (b, h_kv, s_kv, d), ts.f32),
    )


@pytest.mark.parametrize(
    "bias_dims, h_kv, causal, dt",
    [
        (("B", 1, 1, "T"), 2, False, ts.f32),  # a padding mask, grouped-query
        ((1, "H", "S", "T"), 4, True, ts.f32),  # ALiBi-like, with the causal mask on top
        (("B", "H", "S", "T"), 1, False, ts.f32),  # a full bias, multi-query
        ((1, 1, "S", "T"), 4, False, ts.bf16),  # one mask for every batch and head, bf16
    ],
    ids=["padding", "alibi_causal", "full", "shared_bf16"],
)
def test_flash_attention_with_a_bias_matches_torch_sdpa(bias_dims, h_kv, causal, dt):
    """An additive float bias (torch SDPA's ``attn_mask``), -inf on masked keys; checked against the
    reference ops and against torch itself."""
    torch = pytest.importorskip("torch")

    @ts.kernel
    def attn(
        Q: Tensor["B", "H", "S", "D", dt],
        K: Tensor["B", "G", "T", "D", dt],
        V: Tensor["B", "G", "T", "D", dt],
        M: Tensor[bias_dims + (dt,)],
    ) -> Tensor["B", "H", "S", "D", dt]:
        return ops.flash_attention(Q, K, V, bias=M, causal=causal, causal_align="bottom_right")

    rng = np.random.default_rng(17)
    b, h, s_q, s_kv, d = 2, 4, 45, 70, 32
    sizes = {"B": b, "H": h, "S": s_q, "T": s_kv}
    bias = (rng.standard_normal(tuple(sizes.get(x, x) for x in bias_dims)) * 2).astype(np.float32)
    bias[..., 50:60] = -np.inf  # masked keys (every query keeps keys it can see)
    arrays = [
        random_array(rng, (b, h, s_q, d), dt),
        random_array(rng, (b, h_kv, s_kv, d), dt),
        random_array(rng, (b, h_kv, s_kv, d), dt),
        bias.astype(dt.numpy),
    ]
    out = run(attn, *arrays)
    q, k, v, m = (torch.from_numpy(np.asarray(a, dtype=np.float32)) for a in arrays)
    k, v = (x.repeat_interleave(h // h_kv, dim=1) for x in (k, v))
    if causal:  # bottom-right: query i sees keys j <= i + s_kv - s_q
        m = m + torch.full((s_q, s_kv), float("-inf")).triu(s_kv - s_q + 1)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m).numpy()
    assert_close(out, want.astype(out.dtype), dt, "attention with a bias vs torch SDPA")


# ------------------------------------------------------------------------- f32 / f16 / bf16


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_gemm_epilogue_per_dtype(dt):
    @ts.kernel
    def linear(
        A: Tensor["M", "K", dt], W: Tensor["K", "N", dt], b: Tensor["N", dt], r: Tensor["M", "N", dt]
    ) -> Tensor["M", "N", dt]:
        return ops.clip(ops.gelu(ops.matmul(A, W) * 0.5 + b) + r, -0.25, 1.5)

    m, n, k = dims(20, (65, 140), (65, 140), (33, 90))
    rng = np.random.default_rng(20)
    run(
        linear,
        random_array(rng, (m, k), dt),
        random_array(rng, (k, n), dt, scale=0.2),
        random_array(rng, n, dt),
        random_array(rng, (m, n), dt),
    )


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_elementwise_chain_per_dtype(dt):
    @ts.kernel
    def chain(x: Tensor["M", "N", dt], y: Tensor["N", dt]) -> Tensor["M", "N", dt]:
        return ops.tanh(x) * ops.exp(y) - ops.silu(x) / 2.0 + ops.relu(-x) + ops.sigmoid(y) + ops.gelu(x)

    m, n = dims(21, (20, 50), (260, 400))
    rng = np.random.default_rng(21)
    run(chain, random_array(rng, (m, n), dt), random_array(rng, n, dt))


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_softmax_per_dtype(dt):
    @ts.kernel
    def sm(x: Tensor["M", "N", dt]) -> Tensor["M", "N", dt]:
        return ops.softmax(x)

    m, n = dims(22, (20, 50), (260, 1100))
    run(sm, random_array(np.random.default_rng(22), (m, n), dt, scale=5.0))


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_norms_per_dtype(dt):
    @ts.kernel
    def norms(
        x: Tensor["M", "N", dt], w: Tensor["N", dt], b: Tensor["N", dt]
    ) -> (Tensor["M", "N", dt], Tensor["M", "N", dt]):
        return ops.layer_norm(x, w, b), ops.rms_norm(x, w)

    m, n = dims(23, (20, 50), (260, 700))
    rng = np.random.default_rng(23)
    run(norms, random_array(rng, (m, n), dt), random_array(rng, n, dt), random_array(rng, n, dt))


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_reduction_per_dtype(dt):
    @ts.kernel
    def mean_max(x: Tensor["M", "N", dt]) -> Tensor["M", dt]:
        return ops.mean(x, axis=-1) + ops.max(x, axis=-1)

    m, n = dims(24, (20, 50), (260, 700))
    run(mean_max, random_array(np.random.default_rng(24), (m, n), dt))


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_flash_attention_per_dtype(dt):
    @ts.kernel
    def attn(
        Q: Tensor["B", "H", "S", "D", dt], K: Tensor["B", "G", "S", "D", dt], V: Tensor["B", "G", "S", "D", dt]
    ) -> Tensor["B", "H", "S", "D", dt]:
        return ops.flash_attention(Q, K, V, causal=True)

    rng = np.random.default_rng(25)
    run(
        attn,
        random_array(rng, (1, 4, 50, 32), dt),
        random_array(rng, (1, 2, 50, 32), dt),
        random_array(rng, (1, 2, 50, 32), dt),
    )


# ------------------------------------------------------------------------------ fused combinations


def test_layer_norm_then_linear_gelu_runs_two_kernels():
    @ts.kernel
    def mlp_in(
        x: Tensor["M", "K", ts.f16], g: Tensor["K", ts.f16], w: Tensor["K", "N", ts.f16], b: Tensor["N", ts.f16]
    ) -> Tensor["M", "N", ts.f16]:
        return ops.gelu(ops.matmul(ops.layer_norm(x, g), w) + b)

    m, n, k = dims(30, (40, 100), (40, 100), (70, 130))
    rng = np.random.default_rng(30)
    compiled = ts.compile(mlp_in, target="cpu", shapes={"M": m, "N": n, "K": k})
    assert [dk.spec.family for dk in compiled.device_kernels] == ["norm", "gemm"]
    args = (
        random_array(rng, (m, k), ts.f16),
        random_array(rng, k, ts.f16),
        random_array(rng, (k, n), ts.f16, 0.1),
        random_array(rng, n, ts.f16),
    )
    assert_close(compiled(*args), mlp_in.reference(*args), ts.f16)


def test_attention_block_with_projection_and_residual():
    @ts.kernel
    def block(
        x: Tensor["B", "H", "S", "D", ts.f32], wo: Tensor["D", "D", ts.f32]
    ) -> Tensor["B", "H", "S", "D", ts.f32]:
        y = ops.flash_attention(x, x, x, causal=True)
        return ops.matmul(y, wo) + x

    rng = np.random.default_rng(31)
    out = run(block, random_array(rng, (2, 3, 33, 24), ts.f32), random_array(rng, (24, 24), ts.f32))
    assert out.shape == (2, 3, 33, 24)


def test_softmax_of_scaled_scores():
    @ts.kernel
    def probs(q: Tensor["S", "D", ts.bf16], k: Tensor["T", "D", ts.bf16]) -> Tensor["S", "T", ts.f32]:
        return ops.softmax(ops.matmul(q, k, transpose_b=True, out_dtype=ts.f32) * 0.125)

    rng = np.random.default_rng(32)
    run(probs, random_array(rng, (45, 64), ts.bf16), random_array(rng, (70, 64), ts.bf16))


# ------------------------------------------------------------------------- NaN and infinities

# Issue #37, item 3: NaN and +-inf in, what torch gives out. Each row of NONFINITE holds one case:
# a NaN, a +inf, a -inf, a NaN and a +inf, a row of -inf, a NaN past the first CPU_LANES (64)
# elements, and a finite row.
NONFINITE_ROWS = 7


def nonfinite_array(n: int = 150, seed: int = 40) -> np.ndarray:
    x = random_array(np.random.default_rng(seed), (NONFINITE_ROWS, n), ts.f32)
    x[0, 3] = np.nan
    x[1, n - 1] = np.inf
    x[2, 7] = -np.inf
    x[3, 0], x[3, 1] = np.nan, np.inf
    x[4, :] = -np.inf
    x[5, min(70, n - 1)] = np.nan
    return x


def assert_same_nonfinite(out, ref, what: str) -> None:
    """NaN where the reference is NaN, the same infinities, the finite values within f32's tolerance."""
    np.testing.assert_allclose(np.asarray(out, np.float64), np.asarray(ref, np.float64), 1e-4, 1e-4, True, what)


NONFINITE_OPS = {
    "relu": ops.relu,
    "clip_0_6": lambda x: ops.clip(x, 0, 6),
    "clip_below_half": lambda x: ops.clip(x, None, 0.5),
    "max": lambda x: ops.max(x, axis=-1),
    "sum": lambda x: ops.sum(x, axis=-1),
    "softmax": ops.softmax,
    "layer_norm": ops.layer_norm,
    "gelu_silu": lambda x: ops.gelu(x) + ops.silu(x) * ops.sigmoid(x),
    "minus_itself": lambda x: x - x,  # TVM folds x - x and x * 0 to 0: NaN for NaN and inf
    "times_zero": lambda x: ops.scale(x, 0.0),
    "over_zero": lambda x: x / 0.0,  # before: TVM's "Divide by zero" check
}


@pytest.mark.parametrize("name", sorted(NONFINITE_OPS))
def test_nan_and_inf_propagate_as_in_the_reference(name):
    """Before: relu, clip and max returned finite values for a NaN (C's ``x > 0 ? x : 0``)."""
    op = NONFINITE_OPS[name]

    @ts.kernel
    def nonfinite(x: Tensor["M", "N", ts.f32]):
        return op(x)

    x = nonfinite_array()
    out = ts.compile(nonfinite, target="cpu")(x)
    ref = nonfinite.reference(x)
    assert np.isnan(ref).any(), f"{name}: the case holds no NaN"
    assert_same_nonfinite(out, ref, name)


MATMUL_EPILOGUES = {
    "relu": ops.relu,
    "clip": lambda y: ops.clip(y, 0, 6),
    "times_zero": lambda y: ops.scale(y, 0.0),
    "over_zero": lambda y: y / 0.0,  # before: a ZeroDivisionError while building the epilogue
}


@pytest.mark.parametrize("epilogue", sorted(MATMUL_EPILOGUES))
def test_a_matmul_epilogue_keeps_nan(epilogue):
    """Before: matmul + relu with a NaN input returned zeros where the reference has NaN."""

    @ts.kernel
    def linear(a: Tensor["M", "K", ts.f32], w: Tensor["K", "N", ts.f32]):
        return MATMUL_EPILOGUES[epilogue](ops.matmul(a, w))

    rng = np.random.default_rng(41)
    a, w = random_array(rng, (30, 40), ts.f32), random_array(rng, (40, 50), ts.f32)
    a[3, 5], a[7, 1], w[2, 9] = np.nan, np.inf, np.nan
    ref = linear.reference(a, w)
    assert np.isnan(ref).any()
    assert_same_nonfinite(ts.compile(linear, target="cpu")(a, w), ref, f"matmul + {epilogue}")


def test_attention_with_nan_and_inf_in_queries_and_keys():
    @ts.kernel
    def attention(q: Tensor["B", "H", "S", "D", ts.f32], k: Tensor["B", "H", "S", "D", ts.f32]):
        return ops.flash_attention(q, k, k, causal=True)

    rng = np.random.default_rng(42)
    q, k = random_array(rng, (1, 2, 40, 16), ts.f32), random_array(rng, (1, 2, 40, 16), ts.f32)
    q[0, 0, 5, 3], q[0, 1, 9, 0], k[0, 1, 30, 2] = np.nan, np.inf, np.nan
    ref = attention.reference(q, k)
    assert_same_nonfinite(ts.compile(attention, target="cpu")(q, k), ref, "attention")


def _torch_ops():
    import torch

    F = torch.nn.functional
    return torch, {
        "relu": (ops.relu, torch.relu),
        "clip_0_6": (lambda x: ops.clip(x, 0, 6), lambda t: torch.clamp(t, 0, 6)),
        "clip_below_half": (lambda x: ops.clip(x, None, 0.5), lambda t: torch.clamp(t, max=0.5)),
        "max": (lambda x: ops.max(x, axis=-1), lambda t: torch.amax(t, -1)),
        "sum": (lambda x: ops.sum(x, axis=-1), lambda t: t.sum(-1)),
        "mean": (lambda x: ops.mean(x, axis=-1), lambda t: t.mean(-1)),
        "softmax": (ops.softmax, lambda t: torch.softmax(t, -1)),
        "layer_norm": (ops.layer_norm, lambda t: F.layer_norm(t, t.shape[-1:], eps=1e-5)),
        "rms_norm": (ops.rms_norm, lambda t: F.rms_norm(t, t.shape[-1:], eps=1e-6)),
        "gelu": (ops.gelu, F.gelu),
        "gelu_tanh": (lambda x: ops.gelu(x, approximate="tanh"), lambda t: F.gelu(t, approximate="tanh")),
        "silu": (ops.silu, F.silu),
        "sigmoid": (ops.sigmoid, torch.sigmoid),
        "exp": (ops.exp, torch.exp),
        "tanh": (ops.tanh, torch.tanh),
        "neg": (ops.neg, torch.neg),
        "scale": (lambda x: ops.scale(x, -0.5), lambda t: t * -0.5),
        "matmul": (lambda x: ops.matmul(x, x, transpose_b=True), lambda t: t @ t.T),
    }


def test_the_reference_gives_nan_and_inf_where_torch_does():
    """Each op's reference on NaN and +-inf against torch in float64 (torch's float32 CPU GELU gives
    NaN for +inf, its float64 one and the limit give inf)."""
    torch, table = _torch_ops()
    x = nonfinite_array(n=80)
    for name, (op, torch_op) in table.items():
        expected = torch_op(torch.from_numpy(x.astype(np.float64))).numpy()
        assert_same_nonfinite(op(x), expected, name)
