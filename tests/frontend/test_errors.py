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


@ts.kernel
def head_dim_bad(
    Q: Tensor["B", "H", "S", "D", ts.f16], K: Tensor["B", "H", "S", "E", ts.f16], V: Tensor["B", "H", "S", "E", ts.f16]
) -> Tensor["B", "H", "S", "D", ts.f16]:
    return ops.flash_attention(Q, K, V)  # headdim-line


def test_attention_head_dims_must_match():
    with pytest.raises(
        ts.ShapeError,
        match=where("headdim-line")
        + re.escape("ops.flash_attention: Q is [B, H, S, D] but K is [B, H, S, E]; the head dim D must match: D vs E"),
    ):
        head_dim_bad.graph()


# ---------------------------------------------------------------------------------------- dtypes


@ts.kernel
def mixed(x: Tensor["M", ts.f16], y: Tensor["M", ts.f32]) -> Tensor["M", ts.f32]:
    return x * y  # mixed-line


def test_mixed_dtypes_need_a_cast():
    with pytest.raises(
        ts.DTypeError,
        match=where("mixed-line") + re.escape("ops.mul: x is f16 but y is f32; cast one of them (ops.cast(y, ts.f16))"),
    ):
        mixed.graph()


@ts.kernel
def int_exp(x: Tensor["M", ts.int32]) -> Tensor["M", ts.int32]:
    return ops.exp(x)  # intexp-line


def test_float_op_on_integers():
    with pytest.raises(
        ts.DTypeError,
        match=where("intexp-line")
        + re.escape("ops.exp: x is int32; ops.exp needs a floating-point tensor (cast first: ops.cast(x, ts.f32))"),
    ):
        int_exp.graph()


@ts.kernel
def fp8_scalar(x: Tensor["M", ts.fp8_e4m3]) -> Tensor["M", ts.fp8_e4m3]:
    return x * 2.0  # fp8-line


def test_fp8_numbers_need_a_cast():
    with pytest.raises(
        ts.DTypeError,
        match=where("fp8-line") + re.escape("ops.mul: x is fp8_e4m3; fp8 tensors take no Python-number operands"),
    ):
        fp8_scalar.graph()


@ts.kernel
def bad_accumulate(a: Tensor["M", "K", ts.f16], b: Tensor["K", "N", ts.f16]) -> Tensor["M", "N", ts.f16]:
    return ops.matmul(a, b, accumulate=ts.int32)  # acc-line


def test_matmul_accumulate_dtype():
    with pytest.raises(
        ts.DTypeError,
        match=where("acc-line") + re.escape("ops.matmul: accumulate is int32 but the operands are f16; use ts.f32"),
    ):
        bad_accumulate.graph()


# ------------------------------------------------------------------------------ annotations, results


@ts.kernel
def wrong_dtype_result(x: Tensor["M", ts.f16]) -> Tensor["M", ts.f32]:
    return ops.relu(x)  # result-dtype-line


@ts.kernel
def wrong_dim_result(a: Tensor["M", "K", ts.f32], b: Tensor["K", "N", ts.f32]) -> Tensor["M", "K", ts.f32]:
    return ops.matmul(a, b)  # result-dim-line


@ts.kernel
def wrong_rank_result(x: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.sum(x, axis=1)  # result-rank-line


def test_return_annotation_dtype():
    with pytest.raises(
        ts.DTypeError,
        match=where("result-dtype-line")
        + re.escape(
            "kernel wrong_dtype_result returns [M] f16 but is annotated -> Tensor['M', ts.f32]: dtype f16 vs f32 "
            "(cast the result: ops.cast(..., ts.f32))"
        ),
    ):
        wrong_dtype_result.graph()


def test_return_annotation_dims():
    with pytest.raises(
        ts.ShapeError,
        match=where("result-dim-line")
        + re.escape(
            "kernel wrong_dim_result returns [M, N] f32 but is annotated -> Tensor['M', 'K', ts.f32]: dim 1 is N, "
            "annotated K"
        ),
    ):
        wrong_dim_result.graph()


def test_return_annotation_rank():
    with pytest.raises(
        ts.ShapeError,
        match=where("result-rank-line")
        + re.escape(
            "kernel wrong_rank_result returns [M] f32 but is annotated -> Tensor['M', 'N', ts.f32]: rank 1 vs 2"
        ),
    ):
        wrong_rank_result.graph()


def test_return_must_be_a_tensor():
    @ts.kernel
    def returns_number(x: Tensor["M", ts.f32]) -> Tensor["M", ts.f32]:
        return 1.0  # number-line

    with pytest.raises(
        ts.KernelError,
        match=where("number-line") + re.escape("kernel returns_number returns float 1.0; a kernel returns tensors"),
    ):
        returns_number.graph()


def test_unannotated_parameter():
    with pytest.raises(
        ts.KernelError,
        match=r"test_errors.py:\d+: kernel f: parameter y has no annotation; "
        r"annotate it as a tensor, e.g. y: Tensor\['M', 'N', ts.f32\]",
    ):

        @ts.kernel
        def f(x: Tensor["M", ts.f32], y) -> Tensor["M", ts.f32]:
            return x


def test_traced_tensor_has_no_truth_value():
    @ts.kernel
    def branchy(x: Tensor["M", ts.f32]) -> Tensor["M", ts.f32]:
        if x:  # branch-line
            return x
        return -x

    with pytest.raises(ts.KernelError, match=where("branch-line") + "x is a traced tensor"):
        branchy.graph()


def test_shapes_names_unknown_dim():
    with pytest.raises(
        ts.ShapeError,
        match=r"shapes= names 'Q', which is not a dim of kernel linear; its dims are "
        r"M, K, N",
    ):
        ts.compile(linear, target="cpu", shapes={"Q": 4})


def test_gpu_target_needs_all_shapes():
    with pytest.raises(
        ts.ShapeError,
        match=r"ts.compile: target hopper compiles for fixed shapes; bind N with "
        r"shapes=\{'N': ...\}",
    ):
        ts.compile(linear, target="hopper", shapes={"M": 128, "K": 64})


def test_unknown_stage():
    with pytest.raises(ts.KernelError, match=r"unknown stage 'ptx'; stages are graph, sched, tile, target"):
        linear.inspect_ir("ptx")


def test_later_stages_need_a_target():
    with pytest.raises(ts.KernelError, match=r"stage 'sched' needs a target: ts.compile\(linear, target="):
        linear.inspect_ir("sched")


def test_calling_a_kernel_directly():
    with pytest.raises(TypeError, match=r"kernel linear is not called directly: compile it"):
        linear(np.zeros((2, 2), np.float16), np.zeros((2, 2), np.float16))


# ---------------------------------------------------------------------------------- call arguments


@ts.kernel
def scale2(x: Tensor["M", 4, ts.f32]) -> Tensor["M", 4, ts.f32]:
    return x * 2.0


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "scale2 takes 1 arrays (x), got 0"),
        (([[1.0]],), "scale2: argument x is a list; expected a numpy array or a torch CPU tensor [M, 4] f32"),
        (
            (np.zeros((3, 4), np.float64),),
            "scale2: argument x has dtype float64, expected f32 (float32); convert it: x.astype(np.float32)",
        ),
        ((np.zeros((3,), np.float32),), "scale2: argument x has shape (3,) (rank 1), expected [M, 4] f32 (rank 2)"),
        (
            (np.zeros((3, 5), np.float32),),
            "scale2: argument x has shape (3, 5), expected [M, 4] f32: dim 1 is 5, expected 4",
        ),
    ],
)
def test_call_argument_errors(args, message):
    with pytest.raises(ts.ArgumentError, match=re.escape(message)):
        ts.compile(scale2, target="cpu")(*args)


def test_call_shape_differs_from_compiled_shapes():
    with pytest.raises(
        ts.ArgumentError,
        match=re.escape(
            "scale2: argument x has shape (3, 4), expected [M, 4] f32: dim 0 (M) is 3 but it was compiled with M=8"
        ),
    ):
        ts.compile(scale2, target="cpu", shapes={"M": 8})(np.zeros((3, 4), np.float32))


def test_conflicting_dims_no_op_relates():
    @ts.kernel
    def two(x: Tensor["M", ts.f32], y: Tensor["M", ts.f32]) -> Tensor["M", ts.f32]:
        return ops.relu(x)

    with pytest.raises(
        ts.ArgumentError, match=re.escape("two: dim M is 5 in y.shape[0] but 4 in x.shape[0]; arrays must agree on M")
    ):
        ts.compile(two, target="cpu")(np.zeros(4, np.float32), np.zeros(5, np.float32))


def test_gpu_kernels_are_not_runnable_here():
    k = ts.compile(scale2, target="ampere", shapes={"M": 8}, build=False)
    with pytest.raises(
        ts.NotRunnableError,
        match=r"scale2 for ampere has no CUDA runtime library for .*: it was compiled with build=False",
    ):
        k(np.zeros((8, 4), np.float32))


@pytest.mark.parametrize(
    "lo, hi, message",
    [
        (None, None, "clip needs lo, hi or both"),
        (2.0, 1.0, "lo=2.0 is above hi=1.0"),
        ("0", None, "lo is str '0'; expected a Python number or None"),
        (None, float("nan"), "hi is NaN; expected a number or None"),  # the kernel ignored it, no error
    ],
)
def test_clip_bounds_are_checked(lo, hi, message):
    @ts.kernel
    def clipped(x: Tensor["M", ts.f32]) -> Tensor["M", ts.f32]:
        return ts.ops.clip(x, lo, hi)

    with pytest.raises(ts.KernelError, match=re.escape(message)):
        clipped.graph()
