"""Element-wise trees between offloaded kernels (RoPE's multiply-adds, a residual add after
attention): each tree whose inner values are used once is one Tessera element-wise kernel."""

from __future__ import annotations

import numpy as np

from tessera_tvm import tvm
from tessera_tvm.relax import build
from tessera_tvm.relax.elementwise import elementwise_trees

relax = tvm.relax
R = relax.op


def _module(params: dict[str, tuple[tuple, str]], body) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    args = [relax.Var(n, relax.TensorStructInfo(shape, dtype)) for n, (shape, dtype) in params.items()]
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *args))
        bb.emit_func_output(out)
    return bb.get()


def test_a_value_read_twice_ends_a_tree_and_starts_its_own():
    def body(bb, x, y):
        s = bb.emit(R.add(x, y))  # read by both t and u: its own tree
        t = bb.emit(R.multiply(s, x))
        u = bb.emit(R.negative(s))
        v = bb.emit(R.subtract(t, u))  # v = (s * x) - (-s): t and u join v's tree
        w = bb.emit(R.astype(v, "float16"))  # v is also an output, so this is a lone cast: TVM keeps it
        return relax.Tuple([v, w])

    f32 = "float32"
    mod = _module({"x": ((4, 8), f32), "y": ((4, 8), f32)}, body)
    trees = elementwise_trees(mod["main"])
    assert sorted([n.op for n in tree] for tree in trees.values()) == [["add"], ["multiply", "negative", "subtract"]]


def test_rope_and_a_residual_after_attention_run_as_elementwise_kernels():
    rng = np.random.default_rng(0)
    b, s, h, d = 2, 12, 2, 8
    cos = rng.standard_normal((s, 1, d)).astype(np.float32)  # [S, 1, D] broadcast over B and H
    sin = rng.standard_normal((s, 1, d)).astype(np.float32)

    def body(bb, q, k, v, x2):
        c, sn = relax.const(cos), relax.const(sin)  # tables held as constants, as imported models do
        q1 = bb.emit(R.add(bb.emit(R.multiply(q, c)), bb.emit(R.multiply(x2, sn))))
        att = bb.emit(R.nn.attention(q1, k, v, causal_mask="TopLeft"))
        return R.add(att, q)  # a residual after attention: follows no GEMM

    f32 = "float32"
    shape = (b, s, h, d)
    mod = _module({"q": (shape, f32), "k": (shape, f32), "v": (shape, f32), "x2": (shape, f32)}, body)
    built = build(mod, "cpu")
    ops = [row.ops for row in built.report.offloaded]
    assert ops == ["mul + mul + add", "attention", "add"], built.report
    assert {r.op for r in built.report.not_offloaded} <= {"R.permute_dims"}, built.report  # around attention
    q, k, v, x2 = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
    got = built.run("main", q, k, v, x2)

    def attention(q_, k_, v_):  # [B, S, H, D], causal
        qt, kt, vt = (np.swapaxes(t, 1, 2) for t in (q_, k_, v_))
        scores = qt @ np.swapaxes(kt, -1, -2) / np.sqrt(d)
        scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        return np.swapaxes((p / p.sum(-1, keepdims=True)) @ vt, 1, 2)

    q1 = q * cos + x2 * sin
    np.testing.assert_allclose(got, attention(q1, k, v) + q, atol=1e-5)


def test_integer_and_boolean_element_wise_ops_stay_with_tvm():
    def body(bb, x, y):
        return R.add(x, y)

    built = build(_module({"x": ((4, 8), "int32"), "y": ((4, 8), "int32")}, body), "cpu")
    assert built.report.offloaded == []
    assert [r.op for r in built.report.not_offloaded] == ["R.add"]
    x = np.arange(32, dtype=np.int32).reshape(4, 8)
    np.testing.assert_array_equal(built.run("main", x, x), 2 * x)


def test_a_zero_dim_operand_keeps_its_ops_with_tvm():
    def body(bb, x, y):
        a = bb.emit(R.multiply(x, x))  # 0-d: TVM keeps it (a kernel would read it as [1])
        b = bb.emit(R.add(a, relax.const(1.0, "float32")))
        return R.add(y, b)

    built = build(_module({"x": ((), "float32"), "y": ((4,), "float32")}, body), "cpu")
    got = built.run("main", np.array(3.0, np.float32), np.arange(4, dtype=np.float32))
    np.testing.assert_allclose(got, np.arange(4) + 10.0)
    assert not any(row.ops.startswith("mul") for row in built.report.offloaded), built.report
