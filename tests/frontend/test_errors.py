"""Every user mistake is reported with the user's file:line, the op, the names and the values."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops

HERE = Path(__file__)


def line_of(marker: str) -> int:
    """The line of this file holding ``marker`` (a comment next to the faulty statement)."""
    for i, text in enumerate(HERE.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# {marker}"):
            return i
    raise AssertionError(marker)


def where(marker: str) -> str:
    return re.escape(f"test_errors.py:{line_of(marker)}: ")


# ---------------------------------------------------------------------------------------- shapes


@ts.kernel
def linear(A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16]) -> Tensor["M", "N", ts.f16]:
    return ops.matmul(A, W)  # matmul-line


def test_matmul_contraction_mismatch_at_call_names_dims_and_values():
    cpu = ts.compile(linear, target="cpu")
    a = np.zeros((128, 64), np.float16)
    w = np.zeros((32, 256), np.float16)
    with pytest.raises(ts.ShapeError) as info:
        cpu(a, w)
    assert str(info.value) == (
        f"test_errors.py:{line_of('matmul-line')}: ops.matmul: A is [M, K] = [128, 64] but W "
        "is [K, N] = [32, 256]; K differs (64 vs 32)"
    )
    assert info.value.lineno == line_of("matmul-line") and info.value.filename == str(HERE)


@ts.kernel
def literal_dims(A: Tensor["M", 64, ts.f32], W: Tensor[32, "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return A @ W  # literal-line


def test_matmul_literal_dims_mismatch_at_trace():
    with pytest.raises(
        ts.ShapeError,
        match=where("literal-line")
        + re.escape("ops.matmul: A is [M, 64] but W is [32, N]; 64 and 32 differ (64 vs 32)"),
    ):
        literal_dims.inspect_ir("graph")


@ts.kernel
def broadcast_bad(x: Tensor["M", "N", ts.f32], y: Tensor["M", "K", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return x + y  # broadcast-line


def test_broadcast_needs_same_names():
    with pytest.raises(
        ts.ShapeError,
        match=where("broadcast-line")
        + re.escape(
            "ops.add: x is [M, N] but y is [M, K]: dim -1 is N in one and K in the other; dims that must match "
            "need the same name (or a literal 1 to broadcast)"
        ),
    ):
        broadcast_bad.graph()


def test_broadcast_values_differ():
    with pytest.raises(
        ts.ShapeError,
        match=where("broadcast-line")
        + re.escape(
            "ops.add: x is [M, N] = [4, 8] but y is [M, K] = [4, 5]: they do not broadcast, dim -1: N and K differ "
            "(8 vs 5)"
        ),
    ):
        broadcast_bad.graph(shapes={"M": 4, "N": 8, "K": 5})


@ts.kernel
def batched_bad(x: Tensor["B", "M", "K", ts.f32], w: Tensor["C", "K", "N", ts.f32]) -> Tensor["B", "M", "N", ts.f32]:
    return ops.matmul(x, w)  # batch-line


def test_matmul_batch_dims_must_broadcast():
    with pytest.raises(
        ts.ShapeError,
        match=where("batch-line")
        + re.escape("ops.matmul: x is [B, M, K] but w is [C, K, N]: batch dim -3 does not broadcast (B vs C)"),
    ):
        batched_bad.graph()


@ts.kernel
def rank_bad(v: Tensor["K", ts.f32], w: Tensor["K", "N", ts.f32]) -> Tensor["N", ts.f32]:
    return ops.matmul(v, w)  # rank-line


def test_matmul_needs_rank_2():
    with pytest.raises(
        ts.ShapeError,
        match=where("rank-line")
        + re.escape("ops.matmul: v is [K] (rank 1); matmul needs rank >= 2 ([..., rows, cols])"),
    ):
        rank_bad.graph()


@ts.kernel
def axis_bad(x: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.softmax(x, axis=2)  # axis-line


def test_axis_out_of_range():
    with pytest.raises(
        ts.ShapeError,
        match=where("axis-line")
        + re.escape("ops.softmax: axis 2 is out of range for x is [M, N] (rank 2); expected an int in [-2, 1]"),
    ):
        axis_bad.graph()


@ts.kernel
def axes_bad(x: Tensor["A", "B", "C", ts.f32]) -> Tensor["B", ts.f32]:
    return ops.sum(x, axis=(0, 2))  # axes-line


def test_reduction_axes_must_be_consecutive():
    with pytest.raises(
        ts.ShapeError,
        match=where("axes-line")
        + re.escape(
            "ops.sum: axes (0, 2) of x is [A, B, C] are not consecutive; reduce consecutive axes (or reduce twice)"
        ),
    ):
        axes_bad.graph()


@ts.kernel
def norm_bad(x: Tensor["M", "N", ts.f16], w: Tensor["K", ts.f16]) -> Tensor["M", "N", ts.f16]:
    return ops.layer_norm(x, w)  # norm-line


def test_norm_weight_must_match_last_dim():
    with pytest.raises(
        ts.ShapeError,
        match=where("norm-line")
        + re.escape(
            "ops.layer_norm: x is [M, N] = [2, 8] but w is [K] = [6]; weight must be [N], the normalised dim: "
            "N and K differ (8 vs 6)"
        ),
    ):
        norm_bad.graph(shapes={"M": 2, "N": 8, "K": 6})


@ts.kernel
def gqa_bad(
    Q: Tensor["B", "H", "S", "D", ts.f16], K: Tensor["B", "G", "S", "D", ts.f16], V: Tensor["B", "G", "S", "D", ts.f16]
) -> Tensor["B", "H", "S", "D", ts.f16]:
    return ops.flash_attention(Q, K, V, causal=True)  # gqa-line


def test_attention_heads_must_divide():
    with pytest.raises(
        ts.ShapeError,
        match=where("gqa-line")
        + re.escape(
            "ops.flash_attention: Q is [B, H, S, D] = [1, 8, 16, 32] has 8 heads but K is [B, G, S, D] = "
            "[1, 3, 16, 32] has 3; grouped-query attention needs H to be a multiple of H_kv"
        ),
    ):
        gqa_bad.graph(shapes={"B": 1, "H": 8, "G": 3, "S": 16, "D": 32})


@ts.kernel
def bias_bad(
    Q: Tensor["B", "H", "S", "D", ts.f16],
    K: Tensor["B", "H", "T", "D", ts.f16],
    V: Tensor["B", "H", "T", "D", ts.f16],
    M: Tensor["B", 1, "S", "S", ts.f16],
) -> Tensor["B", "H", "S", "D", ts.f16]:
    return ops.flash_attention(Q, K, V, bias=M)  # bias-line


@ts.kernel
def bias_int(
    Q: Tensor["B", "H", "S", "D", ts.f16],
    K: Tensor["B", "H", "S", "D", ts.f16],
    V: Tensor["B", "H", "S", "D", ts.f16],
    M: Tensor["B", 1, 1, "S", ts.int32],
) -> Tensor["B", "H", "S", "D", ts.f16]:
    return ops.flash_attention(Q, K, V, bias=M)


@ts.kernel
def bias_rank(
    Q: Tensor["B", "H", "S", "D", ts.f16],
    K: Tensor["B", "H", "S", "D", ts.f16],
    V: Tensor["B", "H", "S", "D", ts.f16],
    M: Tensor["S", "S", ts.f16],
) -> Tensor["B", "H", "S", "D", ts.f16]:
    return ops.flash_attention(Q, K, V, bias=M)


def test_an_attention_bias_must_broadcast_to_the_scores():
    with pytest.raises(
        ts.ShapeError,
        match=where("bias-line")
        + re.escape(
            "ops.flash_attention: M is [B, 1, S, S] but K is [B, H, T, D]; the bias's dim 3 (1, or the key "
            "length S_kv) must match: S vs T"
        ),
    ):
        bias_bad.graph()
    with pytest.raises(ts.DTypeError, match="M is int32; ops.flash_attention needs a floating-point tensor"):
        bias_int.graph()
    with pytest.raises(ts.ShapeError, match=re.escape("(rank 2); expected rank 4 ([B, H, S_q, S_kv], a dim 1 where")):
        bias_rank.graph()


@ts.kernel
def bias_per_query(
    Q: Tensor["B", "H", "S", "D", ts.f32],
    K: Tensor["B", "H", "T", "D", ts.f32],
    V: Tensor["B", "H", "T", "D", ts.f32],
    M: Tensor["B", "H", "S", 1, ts.f32],
) -> Tensor["B", "H", "S", "D", ts.f32]:
    return ops.flash_attention(Q, K, V, bias=M)


@ts.kernel
def bias_per_query_16(
    Q: Tensor["B", "H", 16, "D", ts.f32],
    K: Tensor["B", "H", 16, "D", ts.f32],
    V: Tensor["B", "H", 16, "D", ts.f32],
    M: Tensor["B", "H", 16, 1, ts.f32],
) -> Tensor["B", "H", 16, "D", ts.f32]:
    return ops.flash_attention(Q, K, V, bias=M)


def test_an_attention_bias_broadcast_over_the_keys_is_refused_by_name():
    # Relax's attention takes the bias's key dim whole: [.., S_q, 1] passed its check only while S_kv
    # was a symbol it could not tell from 1, then failed in the sharding pass; a literal S_kv failed in Relax.
    for kernel, dims in ((bias_per_query, "B, H, S, 1"), (bias_per_query_16, "B, H, 16, 1")):
        with pytest.raises(ts.ShapeError, match=re.escape(f"M is [{dims}]") + r".*, broadcast over the keys"):
            kernel.graph()
