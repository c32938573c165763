"""Graph IR: the traced Relax function, the graph passes, and how ops fuse into kernels."""

from __future__ import annotations

import tessera as ts
from tessera import Tensor, ops
from tessera_tvm.graph import graph_pass_names


@ts.kernel
def linear(
    A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16], b: Tensor["N", ts.f16]
) -> Tensor["M", "N", ts.f16]:
    return ops.gelu(ops.matmul(A, W) + b)


def kernels_of(k, **shapes):
    """[(family, ops)] of each fused kernel, in launch order."""
    return [(g.family, g.describe()) for g in k.graph(shapes or None).groups]


def test_traced_graph_is_relax_with_symbolic_dims():
    text = linear.inspect_ir("graph", traced=True)
    assert 'def linear(A: R.Tensor(("M", "K"), dtype="float16"), W: R.Tensor(("K", "N"), dtype="float16")' in text
    assert "M = T.int64()" in text and "K = T.int64()" in text
    assert 'matmul: R.Tensor((M, N), dtype="float32") = R.matmul(A, W, out_dtype="float32")' in text
    assert 'cast: R.Tensor((M, N), dtype="float16") = R.astype(matmul, dtype="float16")' in text
    assert "R.nn.gelu(add)" in text


def test_graph_after_passes_outlines_one_function_per_kernel():
    text = linear.inspect_ir("graph")
    assert "@R.function(private=True)\n    def fused_matmul_cast_add_gelu(" in text
    assert 'R.func_attr({"tessera.family": "gemm"})' in text
    assert "cls.fused_matmul_cast_add_gelu(A, W, b)" in text


def test_graph_pass_log_names_every_pass():
    graph = linear.graph()
    assert [r.name for r in graph.records] == graph_pass_names()
    assert all(r.phase == "graph" for r in graph.records)
    status = {r.name: r.status for r in graph.records}
    assert status["tessera.FuseEpilogues"] == "ran (1 kernel)"
    assert status["tessera.InsertCollectives"] == "ran (not sharded)"


def test_literal_dims_stay_literal():
    @ts.kernel
    def fixed(x: Tensor["M", 64, ts.f32]) -> Tensor["M", 64, ts.f32]:
        return ops.relu(x)

    assert 'x: R.Tensor(("M", 64), dtype="float32")' in fixed.inspect_ir("graph", traced=True)


def test_matmul_epilogue_fuses_bias_activation_scale_residual_cast():
    @ts.kernel
    def block(
        x: Tensor["M", "K", ts.bf16],
        w: Tensor["K", "N", ts.bf16],
        b: Tensor["N", ts.bf16],
        r: Tensor["M", "N", ts.bf16],
    ) -> Tensor["M", "N", ts.f32]:
        return ops.cast(ops.silu(ops.matmul(x, w) * 0.5 + b) + r, ts.f32)

    assert kernels_of(block) == [("gemm", "matmul + cast + mul + add + silu + add + cast")]
    spec = ts.compile(block, target="cpu", shapes={"M": 8, "N": 8, "K": 8}).device_kernels[0].spec
    assert [(op.kind, op.operand, op.value) for op in spec.epilogue] == [
        ("cast", None, None),
        ("scale", None, 0.5),
        ("bias", "b", None),
        ("silu", None, None),
        ("residual", "r", None),
    ]
    assert spec.dtype_out == "float32" and spec.dtype_acc == "float32"


def test_layer_norm_then_matmul_gelu_is_two_kernels():
    @ts.kernel
    def mlp_in(
        x: Tensor["M", "K", ts.f16], g: Tensor["K", ts.f16], w: Tensor["K", "N", ts.f16]
    ) -> Tensor["M", "N", ts.f16]:
        return ops.gelu(ops.matmul(ops.layer_norm(x, g), w))

    assert kernels_of(mlp_in) == [("norm", "layer_norm"), ("gemm", "matmul + cast + gelu")]


def test_transposed_operands_fuse_into_the_gemm():
    @ts.kernel
    def qk(q: Tensor["S", "D", ts.f32], k: Tensor["T", "D", ts.f32]) -> Tensor["S", "T", ts.f32]:
        return ops.matmul(q, k, transpose_b=True)

    assert kernels_of(qk) == [("gemm", "matmul")]
    spec = ts.compile(qk, target="cpu", shapes={"S": 4, "T": 5, "D": 3}).device_kernels[0].spec
    assert spec.transpose_b and not spec.transpose_a and (spec.M, spec.N, spec.K) == (4, 5, 3)


def test_attention_is_one_kernel_with_its_layout_permutes():
    @ts.kernel
    def attn(
        Q: Tensor["B", "H", "S", "D", ts.f16],
        K: Tensor["B", "G", "S", "D", ts.f16],
        V: Tensor["B", "G", "S", "D", ts.f16],
    ) -> Tensor["B", "H", "S", "D", ts.f16]:
        return ops.flash_attention(Q, K, V, causal=True, scale=0.125)

    traced = attn.inspect_ir("graph", traced=True)
    assert 'R.nn.attention(q_bshd, k_bshd, v_bshd, scale=T.float32(0.125), causal_mask="TopLeft"' in traced
    assert kernels_of(attn) == [("attention", "attention")]
    spec = ts.compile(attn, target="cpu", shapes={"B": 1, "H": 8, "G": 2, "S": 16, "D": 32}).device_kernels[0].spec
    assert (spec.H, spec.H_kv, spec.causal, spec.scale, spec.causal_align) == (8, 2, True, 0.125, "top_left")


def test_softmax_norms_reductions_are_own_kernels_elementwise_chains_fuse():
    @ts.kernel
    def mixed(x: Tensor["M", "N", ts.f32], w: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
        y = ops.exp(x) * 2.0 - x  # one element-wise kernel
        s = ops.softmax(y)  # its own kernel
        n = ops.rms_norm(s, w)  # its own kernel
        return ops.tanh(n) + ops.mean(n, axis=-1, keepdims=True)  # reduction, then element-wise

    assert kernels_of(mixed) == [
        ("elementwise", "exp + mul + sub"),
        ("softmax", "softmax"),
        ("norm", "rms_norm"),
        ("reduce", "mean"),
        ("elementwise", "tanh + add"),
    ]


def test_softmax_absorbs_a_trailing_cast():
    @ts.kernel
    def sm(x: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.f16]:
        return ops.cast(ops.softmax(x), ts.f16)

    assert kernels_of(sm) == [("softmax", "softmax + cast")]


def test_a_value_used_twice_ends_its_kernel():
    @ts.kernel
    def twice(a: Tensor["M", "K", ts.f32], w: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
        h = ops.matmul(a, w)
        return ops.relu(h) + h

    assert kernels_of(twice) == [("gemm", "matmul"), ("elementwise", "relu + add")]


def test_simplify_removes_identities_and_folds_chains():
    @ts.kernel
    def noisy(x: Tensor["M", ts.f16]) -> Tensor["M", ts.f16]:
        y = ops.cast(ops.cast(x, ts.f32), ts.f16)  # lossless round trip: x
        y = ops.scale(ops.scale(y, 2.0), 0.25) * 1.0  # one multiply by 0.5, no multiply by 1
        return ops.relu(ops.cast(y, ts.f16))  # identity cast

    graph = noisy.graph()
    assert graph.records[1].name == "tessera.Simplify" and graph.records[1].status == "ran (4 rewrites)"
    text = graph.text()
    assert "R.astype" not in text
    assert text.count("R.multiply") == 1 and 'R.const(0.5, "float16")' in text
    assert [(g.family, g.describe()) for g in graph.groups] == [("elementwise", "mul + relu")]


def test_inlining_another_kernel():
    @ts.kernel
    def act(x: Tensor["M", ts.f32]) -> Tensor["M", ts.f32]:
        return ops.silu(x)

    @ts.kernel
    def outer(x: Tensor["M", ts.f32]) -> Tensor["M", ts.f32]:
        return act(x) * 2.0

    assert kernels_of(outer) == [("elementwise", "silu + mul")]
