# ruff: noqa: F821, F722  (Tensor["M", "K", ts.f32]: dim names are strings, not forward references)
"""Both ways: a @tessera.kernel's Graph IR inside a user's Relax module, and a Relax function compiled
with ts.compile (tessera.from_relax, also tessera_tvm.relax.from_relax)."""

# No `from __future__ import annotations`: the kernels annotate with ts types evaluated at definition.

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops
from tessera_tvm import tvm
from tessera_tvm.relax import NotInOpSet, add_kernel, build, from_relax

from .models import causal_attention, gelu, softmax

relax = tvm.relax
nn = relax.frontend.nn


@ts.kernel
def linear(
    A: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]
) -> Tensor["M", "N", ts.f32]:
    return ops.gelu(ops.matmul(A, W) + b)


@ts.kernel
def attention(
    Q: Tensor["B", "H", "S", "D", ts.f32], K: Tensor["B", "H", "S", "D", ts.f32], V: Tensor["B", "H", "S", "D", ts.f32]
) -> Tensor["B", "H", "S", "D", ts.f32]:
    return ops.flash_attention(Q, K, V, causal=True)


def test_a_tessera_kernel_called_from_a_users_relax_function():
    shapes = {"M": 30, "K": 20, "N": 26}
    mod, gv = add_kernel(tvm.IRModule({}), linear, shapes=shapes)
    assert [str(p.name_hint) for p in mod[gv].params] == ["A", "W", "b"]
    bb = relax.BlockBuilder(mod)
    a, w, b, r = (relax.Var(n, relax.TensorStructInfo(s, "float32")) for n, s in
                  (("a", (30, 20)), ("w", (20, 26)), ("b", (26,)), ("r", (30, 26))))  # fmt: skip
    with bb.function("main", [a, w, b, r]):
        with bb.dataflow():
            y = bb.emit(relax.Call(gv, [a, w, b]))
            out = bb.emit_output(relax.op.multiply(y, r))
        bb.emit_func_output(out)
    built = build(bb.get(), "cpu")
    # The kernel's ops, and the user's multiply after it as an element-wise kernel of its own.
    assert [(o.function, o.ops) for o in built.report.offloaded] == [("linear", "matmul + add + gelu"), ("main", "mul")]
    assert built.report.not_offloaded == []
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((30, 20), (20, 26), (26,), (30, 26))]
    ref = gelu(arrays[0].astype(np.float64) @ arrays[1] + arrays[2]) * arrays[3]
    np.testing.assert_allclose(built.run("main", *arrays), ref, rtol=1e-4, atol=1e-4)  # f32 vs float64


def test_tessera_attention_keeps_its_layout_in_one_kernel():
    """Tessera's [B, H, S, D] attention (permutes around R.nn.attention) is one kernel, no TVM permutes."""
    mod, _ = add_kernel(tvm.IRModule({}), attention, shapes={"B": 2, "H": 3, "S": 19, "D": 16})
    built = build(mod, "cpu")
    assert [o.ops for o in built.report.offloaded] == ["attention"] and built.report.not_offloaded == []
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 19, 16)).astype(np.float32) for _ in range(3))
    swap = (0, 2, 1, 3)
    ref = causal_attention(*(t.transpose(swap).astype(np.float64) for t in (q, k, v))).transpose(swap)
    np.testing.assert_allclose(built.run("attention", q, k, v), ref, rtol=1e-4, atol=1e-4)


@ts.kernel
def padded_attention(
    Q: Tensor["B", "H", "S", "D", ts.f32],
    K: Tensor["B", "H", "S", "D", ts.f32],
    V: Tensor["B", "H", "S", "D", ts.f32],
    mask: Tensor["B", 1, 1, "S", ts.f32],
) -> Tensor["B", "H", "S", "D", ts.f32]:
    return ops.flash_attention(Q, K, V, bias=mask)


def _padded_reference(q, k, v, mask):
    """[B, H, S, D] in and out, float64: softmax(q k^T / sqrt(D) + mask) v."""
    scores = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) / np.sqrt(q.shape[-1]) + mask
    return np.einsum("bhqk,bhkd->bhqd", softmax(scores), v)


def _padded_inputs():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 3, 19, 16)).astype(np.float32) for _ in range(3))
    mask = np.zeros((2, 1, 1, 19), np.float32)
    mask[0, ..., 13:] = -np.inf  # batch 0's last 6 keys are padding
    return q, k, v, mask


def test_tessera_attention_with_a_bias_is_one_kernel_in_a_relax_module():
    """R.nn.attention_bias between Tessera's permutes: one kernel taking the mask as its fourth input."""
    mod, gv = add_kernel(tvm.IRModule({}), padded_attention, shapes={"B": 2, "H": 3, "S": 19, "D": 16})
    assert "R.nn.attention_bias" in mod[gv].script()
    built = build(mod, "cpu")
    (kernel,) = built.report.offloaded
    assert kernel.ops == "attention" and kernel.spec.bias == (2, 1, 1, 19) and built.report.not_offloaded == []
    q, k, v, mask = _padded_inputs()
    got = built.run("padded_attention", q, k, v, mask)
    np.testing.assert_allclose(got, _padded_reference(q, k, v, mask), rtol=1e-5, atol=1e-5)  # f32 vs float64


def test_a_relax_attention_with_a_bias_compiles_with_ts_compile():
    mod, gv = add_kernel(tvm.IRModule({}), padded_attention, shapes={"B": 2, "H": 3, "S": 19, "D": 16})
    kernel = from_relax(mod[gv])
    q, k, v, mask = _padded_inputs()
    out = ts.compile(kernel, target="cpu")(q, k, v, mask)
    np.testing.assert_allclose(out, _padded_reference(q, k, v, mask), rtol=1e-5, atol=1e-5)


class MLP(nn.Module):
    def __init__(self) -> None:
        self.fc1 = nn.Linear(24, 40)
        self.fc2 = nn.Linear(40, 24)
        self.norm = nn.LayerNorm(24)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.norm(self.fc2(nn.op.gelu(self.fc1(x))) + x)


def test_a_relax_function_in_the_op_set_compiles_with_ts_compile():
    mod, params = MLP().export_tvm({"forward": {"x": nn.spec.Tensor([3, 10, 24], "float32")}})
    kernel = from_relax(mod["forward"])
    assert [n for n, _ in kernel.params] == ["x", *(n.replace(".", "_") for n, _ in params)]
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 10, 24)).astype(np.float32)
    weights = [(rng.standard_normal(tuple(int(d) for d in p.shape)) * 0.2).astype(np.float32) for _, p in params]
    compiled = ts.compile(kernel, target="cpu")
    out = compiled(x, *weights)
    w1, b1, w2, b2, g, beta = (w.astype(np.float64) for w in weights)
    h = gelu(x @ w1.T + b1) @ w2.T + b2 + x
    mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    ref = (h - mean) / np.sqrt(var + 1e-5) * g + beta
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(kernel.reference(x, *weights), ref, rtol=1e-4, atol=1e-4)
    graph = compiled.inspect_ir("graph")
    assert "fused_matmul_add_gelu" in graph  # Tessera's own fusion of the traced function


def test_a_relax_clip_becomes_ops_clip_in_the_gemm_epilogue():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorStructInfo((5, 12), "float32"))
    w = relax.Var("w", relax.TensorStructInfo((12, 7), "float32"))
    with bb.function("relu6_linear", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            lo, hi = relax.PrimValue(0), relax.PrimValue(tvm.tirx.FloatImm("float64", 6.0))
            upper = bb.emit(relax.op.clip(y, lo, hi))  # ReLU6, as TVM's torch frontend writes it
            inf = relax.PrimValue(tvm.tirx.FloatImm("float64", float("inf")))
            out = bb.emit_output(relax.op.clip(upper, relax.PrimValue(tvm.tirx.FloatImm("float64", 0.5)), inf))
        bb.emit_func_output(out)
    kernel = from_relax(bb.get()["relu6_linear"])
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s).astype(np.float32) * 2 for s in ((5, 12), (12, 7)))
    compiled = ts.compile(kernel, target="cpu")
    np.testing.assert_allclose(compiled(a, b), np.clip(a @ b, 0.5, 6), rtol=1e-5, atol=1e-5)
    assert "max_scalar 0 -> min_scalar 6 -> max_scalar 0.5" in compiled.inspect_ir("sched")


def test_an_op_outside_the_op_set_is_named():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorStructInfo((1, 3, 8, 8), "float32"))
    k = relax.Var("k", relax.TensorStructInfo((4, 3, 3, 3), "float32"))
    with bb.function("conv", [x, k]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(x, k))
        bb.emit_func_output(out)
    kernel = from_relax(bb.get()["conv"])
    with pytest.raises(NotInOpSet, match=r"R\.nn\.conv2d is not in Tessera's op set.*R\.matmul"):
        ts.compile(kernel, target="cpu", shapes={})


def test_round_trip_keeps_the_graph():
    mod, gv = add_kernel(tvm.IRModule({}), linear, shapes={"M": 8, "K": 4, "N": 6})
    again = from_relax(mod[gv])
    assert (
        again.graph().text().count("R.matmul") == linear.graph({"M": 8, "K": 4, "N": 6}).text().count("R.matmul") == 1
    )


def test_from_relax_is_the_frontends_and_tessera_tvm_never_imports_it(monkeypatch):
    # tessera_tvm.relax.from_relax is what `import tessera` registered (tessera_tvm does not import the
    # kernel frontend: ARCHITECTURE.md, "Layers"); without it, an error says what to import.
    from tessera_tvm.relax import interop

    assert interop._kernel_frontend is ts.from_relax
    mod, gv = add_kernel(tvm.IRModule({}), linear, shapes={"M": 4, "K": 8, "N": 6})
    assert from_relax(mod[gv], name="again").name == ts.from_relax(mod[gv], name="again").name == "again"
    monkeypatch.setattr(interop, "_kernel_frontend", None)
    with pytest.raises(ts.TesseraError, match=r"`import tessera` first \(tessera.from_relax is the same function\)"):
        from_relax(mod[gv])
