"""partition_for_tessera: what it offloads, what it leaves to TVM and why, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

import tessera_tvm
from tessera_tvm import ConfigError, tvm
from tessera_tvm.relax import PipelineError, build, compile_module, partition_for_tessera
from tessera_tvm.relax.pipeline import KERNEL_ATTR

from .models import gelu, softmax

relax = tvm.relax
R = relax.op


def _module(name: str, params: dict[str, tuple[tuple, str]], body) -> tvm.IRModule:
    """A one-function module: ``body(bb, *param_vars)`` emits the dataflow and returns the output."""
    bb = relax.BlockBuilder()
    args = [relax.Var(n, relax.TensorStructInfo(shape, dtype)) for n, (shape, dtype) in params.items()]
    with bb.function(name, args):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *args))
        bb.emit_func_output(out)
    return bb.get()


def _conv_mlp():
    """conv1d_transpose (no Tessera kernel) -> reshape -> matmul + bias + relu (a Tessera GEMM)."""

    def body(bb, x, k, w, b):
        c = bb.emit(R.nn.conv1d_transpose(x, k))
        f = bb.emit(R.reshape(c, (2, 4 * 6)))
        return R.nn.relu(bb.emit(R.add(bb.emit(R.matmul(f, w)), b)))

    f32 = "float32"
    return _module(
        "main", {"x": ((2, 3, 4), f32), "k": ((3, 4, 3), f32), "w": ((24, 40), f32), "b": ((40,), f32)}, body
    )


def _conv1d_transpose(x, k):
    """x [N, C, L], k [C, O, K] (IOW), stride 1, no padding: [N, O, L + K - 1]."""
    n, _, length = x.shape
    _, o, width = k.shape
    out = np.zeros((n, o, length + width - 1))
    for i in range(width):
        out[:, :, i : i + length] += np.einsum("ncl,co->nol", x, k[:, :, i])
    return out


def test_unsupported_op_stays_with_tvm_and_the_module_compiles_and_runs():
    built = build(_conv_mlp(), "cpu")
    report = built.report
    assert [o.ops for o in report.offloaded] == ["matmul + add + relu"]
    conv = [n for n in report.not_offloaded if n.op == "R.nn.conv1d_transpose"]
    assert len(conv) == 1 and conv[0].reason == "no Tessera kernel"
    assert "R.nn.conv1d_transpose" in str(report) and "no Tessera kernel" in str(report)
    rng = np.random.default_rng(0)
    x, k = rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 4, 3)) * 0.3
    w, b = rng.standard_normal((24, 40)) * 0.1, rng.standard_normal(40)
    out = built.run("main", *(a.astype(np.float32) for a in (x, k, w, b)))
    ref = np.maximum(_conv1d_transpose(x, k).reshape(2, 24) @ w + b, 0)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)  # f32 kernels vs float64 numpy


def test_a_dynamic_k_runs_on_the_cpu_and_is_left_to_tvm_on_a_gpu_config():
    k = tvm.tirx.Var("k", "int64")
    mod = _module("main", {"x": ((8, k), "float32"), "w": ((k, 16), "float32")}, lambda bb, x, w: R.matmul(x, w))
    # The CPU's GEMM loops over K in clamped steps: K binds at call time, any K runs.
    built = build(mod, "cpu")
    (offloaded,) = built.report.offloaded
    assert offloaded.ops == "matmul" and set(offloaded.dynamic) == {"k"}, built.report
    assert built.report.not_offloaded == []
    rng = np.random.default_rng(1)
    for depth in (1, 5, 300):  # below a K block, a ragged one, several blocks
        x, w = rng.standard_normal((8, depth)).astype(np.float32), rng.standard_normal((depth, 16)).astype(np.float32)
        np.testing.assert_allclose(built.run("main", x, w), x @ w, rtol=1e-5, atol=1e-5)
    # GPU GEMMs size their K pipeline statically: the matmul stays with TVM, and the report says why.
    _, report = partition_for_tessera(mod, "hopper")
    assert report.offloaded == []
    (left,) = report.not_offloaded
    assert left.op == "R.matmul"
    assert left.reason.startswith("matmul with dynamic K (k)") and "'hopper'" in left.reason, left.reason


def test_row_kernels_over_a_dynamic_axis_run_on_the_cpu_and_are_left_to_tvm_on_a_gpu_config():
    n = tvm.tirx.Var("n", "int64")

    def body(bb, x, w, b):
        s = bb.emit(R.nn.softmax(x, axis=-1))
        return R.add(bb.emit(R.nn.layer_norm(s, w, b, axes=[-1])), bb.emit(R.sum(x, axis=[-1], keepdims=True)))

    f32 = "float32"
    mod = _module("main", {"x": ((6, n), f32), "w": ((n,), f32), "b": ((n,), f32)}, body)
    built = build(mod, "cpu")
    families = sorted(o.family for o in built.report.offloaded)
    assert {"softmax", "norm"} <= set(families), built.report
    assert all("n" in o.dynamic for o in built.report.offloaded), built.report
    rng = np.random.default_rng(3)
    for length in (1, 7, 8, 300):  # under one vector of lanes, a ragged one, exact, many
        x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((6, length), (length,), (length,)))
        s = softmax(x.astype(np.float64))
        centred = s - s.mean(-1, keepdims=True)
        ln = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5) * w + b
        np.testing.assert_allclose(built.run("main", x, w, b), ln + x.sum(-1, keepdims=True), rtol=1e-4, atol=1e-4)
    # A GPU row kernel keeps a fragment per row block: the reduced axis must be static there.
    _, report = partition_for_tessera(mod, "hopper")
    assert not {o.family for o in report.offloaded} & {"softmax", "norm"}, report
    reasons = [r.reason for r in report.not_offloaded if r.op == "R.nn.softmax"]
    assert reasons and "over a dynamic axis (n)" in reasons[0] and "'hopper'" in reasons[0], reasons


@pytest.mark.parametrize("causal", [None, "TopLeft", "BottomRight"])
def test_attention_with_dynamic_sequence_lengths_runs_on_the_cpu(causal):
    s_q, s_kv = tvm.tirx.Var("s_q", "int64"), tvm.tirx.Var("s_kv", "int64")
    f32 = "float32"
    params = {"q": ((2, s_q, 4, 16), f32), "k": ((2, s_kv, 2, 16), f32), "v": ((2, s_kv, 2, 16), f32)}
    mod = _module("main", params, lambda bb, q, k, v: R.nn.attention(q, k, v, causal_mask=causal))
    built = build(mod, "cpu")
    (kernel,) = built.report.offloaded
    assert kernel.family == "attention" and set(kernel.dynamic) == {"s_q", "s_kv"}, built.report
    rng = np.random.default_rng(4)
    # Lengths under a block, ragged, past the hint; more keys than queries and fewer.
    for queries, keys in ((1, 1), (5, 9), (9, 5), (70, 70), (33, 130)):
        q = rng.standard_normal((2, queries, 4, 16)).astype(np.float32)
        k, v = (rng.standard_normal((2, keys, 2, 16)).astype(np.float32) for _ in range(2))
        got = built.run("main", q, k, v)
        scores = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), np.repeat(k, 2, axis=2)) / 4.0
        if causal:
            offset = keys - queries if causal == "BottomRight" else 0
            visible = np.arange(keys)[None, :] <= np.arange(queries)[:, None] + offset
            scores = np.where(visible, scores, -np.inf)
        with np.errstate(invalid="ignore"):
            probs = np.nan_to_num(softmax(scores))  # a query that sees no key: 0 (Tessera's empty rows)
        expected = np.einsum("bhqk,bkhd->bqhd", probs, np.repeat(v, 2, axis=2))
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=f"{queries} x {keys}")


def test_softmax_rms_norm_and_a_cast_epilogue_run_as_tessera_kernels():
    def body(bb, x, w, g):
        s = bb.emit(R.nn.softmax(x, axis=-1))
        n = bb.emit(R.nn.rms_norm(s, g, axes=[-1], epsilon=1e-6))
        y = bb.emit(R.matmul(n, w, out_dtype="float32"))
        return R.astype(R.nn.gelu(y), "float16")

    mod = _module("main", {"x": ((37, 50), "float32"), "w": ((50, 21), "float32"), "g": ((50,), "float32")}, body)
    built = build(mod, "cpu")
    assert sorted(o.ops for o in built.report.offloaded) == ["matmul + gelu + cast", "rms_norm", "softmax"]
    assert built.report.not_offloaded == []
    rng = np.random.default_rng(2)
    x, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((37, 50), (50, 21), (50,)))
    out = built.run("main", x, w, g)
    s = softmax(x.astype(np.float64))
    n = s / np.sqrt((s * s).mean(-1, keepdims=True) + 1e-6) * g
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, gelu(n @ w), rtol=1e-2, atol=1e-2)  # one f16 rounding of O(1) values


def test_sum_mean_and_max_of_floats_run_as_tessera_kernels_and_integer_sums_stay():
    def body(bb, x, counts):
        pooled = bb.emit(R.mean(x, axis=[2, 3], keepdims=True))  # a CNN's global average pooling
        peak = bb.emit(R.astype(R.max(x, axis=[-1]), "float16"))
        total = bb.emit(R.sum(x, axis=None))
        ints = bb.emit(R.sum(counts, axis=[1]))  # int32: TVM keeps it (Tessera sums in float32)
        return relax.Tuple([pooled, peak, total, ints])

    mod = _module("main", {"x": ((2, 5, 7, 9), "float32"), "counts": ((3, 4), "int32")}, body)
    built = build(mod, "cpu")
    assert sorted(o.ops for o in built.report.offloaded) == ["max + cast", "mean", "sum"], built.report
    view, left = built.report.not_offloaded
    assert left.op == "R.sum" and "sum of int32: Tessera's reductions take float tensors" in left.reason
    # the sum to a scalar: the kernel's [1] given back the shape () the module declares
    assert view.op == "R.reshape" and view.reason.startswith("view [1] -> ()"), built.report
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5, 7, 9)).astype(np.float32)
    counts = rng.integers(-1000, 1000, (3, 4)).astype(np.int32)
    pooled, peak, total, ints = built.run("main", x, counts)
    np.testing.assert_allclose(pooled, x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
    assert peak.dtype == np.float16
    np.testing.assert_array_equal(peak, x.max(axis=-1).astype(np.float16))
    assert total.shape == ()
    np.testing.assert_allclose(total, x.sum(), rtol=1e-5)
    np.testing.assert_array_equal(ints, counts.sum(axis=1))


def test_bf16_on_the_cpu_is_offloaded():
    # bf16 buffers reach the CPU kernels as uint16 storage (tirx.BF16StorageLegalize); models in
    # tests/relax/test_bf16_cpu.py. fp8 is still left to TVM there.
    mod = _module("main", {"x": ((16, 16), "bfloat16"), "w": ((16, 16), "bfloat16")}, lambda bb, x, w: R.matmul(x, w))
    _, report = partition_for_tessera(mod, "cpu")
    assert not report.not_offloaded, report
    (kernel,) = report.offloaded
    assert kernel.family == "gemm" and kernel.spec.dtype_a == "bfloat16" and kernel.spec.dtype_acc == "float32"


def test_offloaded_kernels_are_tile_programs_marked_for_the_pipeline():
    mod, report = partition_for_tessera(_conv_mlp(), "hopper")
    (name,) = report.kernels
    func = mod[name]
    assert isinstance(func, tvm.tirx.PrimFunc) and str(func.attrs[KERNEL_ATTR]) == "gemm"
    assert report.tir_pipeline == "tessera.hopper" and report.target.kind.name == "cuda"
    assert "R.call_tir" in mod["main"].script() and "R.matmul" not in mod["main"].script()


def test_an_unknown_config_fails_before_any_work(monkeypatch, tmp_path):
    def no_work(*args, **kwargs):
        raise AssertionError("partition_for_tessera started work before checking the config")

    monkeypatch.setattr(relax.transform, "FuseOpsByPattern", no_work)
    with pytest.raises(ConfigError, match="no_such_target"):
        partition_for_tessera(_conv_mlp(), "no_such_target")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (tessera_tvm.config.resources.files("tessera_tvm.configs") / "cpu.yaml")
        .read_text()
        .replace("target: {kind: c}", "target: {kind: tpu}")
    )
    with pytest.raises(ConfigError, match="tpu"):
        partition_for_tessera(_conv_mlp(), str(bad))
    with pytest.raises(ConfigError):
        build(_conv_mlp(), "no_such_target")


def test_tenstorrent_is_rejected_with_the_reason():
    with pytest.raises(PipelineError, match="tt-metal"):
        partition_for_tessera(_conv_mlp(), "tenstorrent")


def test_compiling_with_another_config_or_target_is_an_error():
    mod, _ = partition_for_tessera(_conv_mlp(), "cpu")
    with pytest.raises(PipelineError, match="partitioned for config 'cpu'.*tessera.hopper"):
        compile_module(mod, "hopper")
    hopper = tessera_tvm.load_config("hopper").tvm_target()
    with pytest.raises(PipelineError, match="target is cuda sm_90a but tir_pipeline='tessera.cpu'"):
        compile_module(mod, "cpu", target=hopper)


def test_a_kernel_that_fails_to_lower_stays_with_tvm(monkeypatch):
    from tessera_tvm.errors import LoweringError
    from tessera_tvm.relax import offload

    def failing_lower(*args, **kwargs):
        raise LoweringError("pass tl.LowerTileOp (LowerAndLegalize, config 'cpu') failed:\nsome TileLang limit")

    monkeypatch.setattr(offload, "lower", failing_lower)
    mod, report = partition_for_tessera(_conv_mlp(), "cpu")
    assert report.offloaded == []
    matmul = next(n for n in report.not_offloaded if n.op == "R.matmul")
    assert (
        matmul.reason
        == "lowering failed: pass tl.LowerTileOp (LowerAndLegalize, config 'cpu') failed: some TileLang limit"
    )
    assert "R.matmul" in mod["main"].script()  # the composite went back to TVM's operators


def test_weights_bound_as_constants_are_offloaded_too():
    """After BindParams the weights are relax.Constant: the kernels take them as arguments."""
    from .models import block_inputs, block_module
    from .test_end_to_end import EXPECTED_OPS

    mod, params = block_module("float32")
    weights = [tvm.runtime.tensor(a) for a in block_inputs(params)[1:]]
    names = [str(p.name_hint) for p in mod["forward"].params[1:]]
    bound = relax.transform.BindParams("forward", dict(zip(names, weights, strict=True)))(mod)
    _, report = partition_for_tessera(bound, "cpu")
    assert sorted(o.ops for o in report.offloaded) == EXPECTED_OPS


# Attention with a bias (R.nn.attention_bias; torch SDPA's float attn_mask): 2 batches, 4 heads of 16,
# 37 tokens (a ragged key block on the CPU's 32 x 64 tiles).
B, H, S, D = 2, 4, 37, 16


def _biased_attention_module(bias_shape, *, layout="bshd", causal=None, constant=None, dtype="float32"):
    """``R.nn.attention_bias`` on [B, S, H, D] parameters ("bshd", as TVM's frontend imports SDPA), or
    Tessera's own form ("bhsd": [B, H, S, D] parameters, permute_dims around it); the bias a parameter
    ``mask`` of ``bias_shape``, or ``constant`` (a relax.Constant)."""
    shape = (B, S, H, D) if layout == "bshd" else (B, H, S, D)
    params = {name: (shape, dtype) for name in "qkv"}
    if constant is None:
        params["mask"] = (bias_shape, dtype)

    def body(bb, q, k, v, mask=None):
        bias = relax.const(constant) if constant is not None else mask
        if layout == "bshd":
            return R.nn.attention(q, k, v, bias, causal_mask=causal)
        q, k, v = (bb.emit(R.permute_dims(t, [0, 2, 1, 3])) for t in (q, k, v))
        return R.permute_dims(bb.emit(R.nn.attention(q, k, v, bias, causal_mask=causal)), [0, 2, 1, 3])

    return _module("main", params, body)


def _biased_attention(q, k, v, bias, causal=None):
    """The float64 reference on [B, S, H, D]: softmax(q k^T / sqrt(D) + bias [+ causal mask]) v; a query
    whose keys are all masked gets zeros (Tessera's kernel; torch's decomposition guards it so too)."""
    scores = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k) / np.sqrt(q.shape[-1]) + bias
    if causal:
        scores = np.where(np.tril(np.ones((S, S), dtype=bool)), scores, -np.inf)
    with np.errstate(invalid="ignore"):
        probs = np.nan_to_num(softmax(scores))
    return np.einsum("bhqk,bkhd->bqhd", probs, v)


def _padding_mask(rng) -> np.ndarray:
    """[B, 1, 1, S]: batch 1's last 9 keys are padding (-inf)."""
    mask = np.zeros((B, 1, 1, S), np.float32)
    mask[1, ..., S - 9 :] = -np.inf
    return mask


def _empty_row_mask(rng) -> np.ndarray:
    """[B, 1, S, S] of random values, query 5 of batch 1 masked from every key."""
    mask = rng.standard_normal((B, 1, S, S)).astype(np.float32)
    mask[1, :, 5, :] = -np.inf
    return mask


def _alibi(rng) -> np.ndarray:
    """[1, H, S, S]: ALiBi, each head's slope times the distance to the key."""
    slopes = 2.0 ** -np.arange(1, H + 1)
    distance = np.arange(S)[None, :] - np.arange(S)[:, None]
    return (slopes[:, None, None] * distance)[None].astype(np.float32)


@pytest.mark.parametrize(
    "make_mask, layout, causal",
    [
        (_padding_mask, "bshd", None),
        (_padding_mask, "bhsd", "TopLeft"),
        (_alibi, "bshd", "TopLeft"),
        (_alibi, "bhsd", None),
        (_empty_row_mask, "bshd", None),
    ],
    ids=["padding", "padding causal, Tessera's layout", "alibi causal", "alibi, Tessera's layout", "an empty row"],
)
def test_attention_with_a_bias_runs_as_one_tessera_kernel(make_mask, layout, causal):
    rng = np.random.default_rng(5)
    mask = make_mask(rng)
    built = build(_biased_attention_module(mask.shape, layout=layout, causal=causal), "cpu")
    (kernel,) = built.report.offloaded
    assert kernel.family == "attention" and kernel.spec.bias == mask.shape, built.report
    assert kernel.spec.causal == (causal is not None)
    assert {r.op for r in built.report.not_offloaded} <= {"R.permute_dims"}, built.report  # [B, S, H, D] layout
    q, k, v = (rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(3))
    swap = (0, 2, 1, 3)
    if layout == "bshd":
        got = built.run("main", q, k, v, mask)
    else:
        got = built.run("main", *(np.ascontiguousarray(t.transpose(swap)) for t in (q, k, v)), mask).transpose(swap)
    # f32 kernel against float64: sums of 37 terms of magnitude ~1.
    np.testing.assert_allclose(got, _biased_attention(q, k, v, mask, causal), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_an_attention_bias_bound_as_a_constant_is_an_input_of_the_kernel(layout):
    rng = np.random.default_rng(6)
    alibi = _alibi(rng)
    built = build(_biased_attention_module(None, layout=layout, constant=alibi), "cpu")
    (kernel,) = built.report.offloaded
    assert kernel.family == "attention" and kernel.spec.bias == (1, H, S, S), built.report
    q, k, v = (rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(3))
    swap = (0, 2, 1, 3)
    if layout == "bshd":
        got = built.run("main", q, k, v)
    else:
        got = built.run("main", *(np.ascontiguousarray(t.transpose(swap)) for t in (q, k, v))).transpose(swap)
    np.testing.assert_allclose(got, _biased_attention(q, k, v, alibi), rtol=1e-5, atol=1e-5)


def test_an_attention_bias_that_does_not_broadcast_or_is_not_float_is_left_to_tvm_with_the_reason():
    n, m = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("m", "int64")
    f32 = "float32"
    # Relax takes bias dim m for the queries' n (it cannot prove them different); Tessera cannot.
    params = {"q": ((2, n, 4, 16), f32), "k": ((2, n, 4, 16), f32), "v": ((2, n, 4, 16), f32)}
    params["mask"] = ((2, 1, m, n), f32)
    mod = _module("main", params, lambda bb, q, k, v, mask: R.nn.attention(q, k, v, mask))
    _, report = partition_for_tessera(mod, "cpu")
    assert report.offloaded == []
    (left,) = report.not_offloaded
    assert left.op == "R.nn.attention_bias"
    assert left.reason == (
        "attention with a bias mask of shape [2, 1, m, n]: Tessera's kernel takes a bias [B, H, S_q, S_kv] = "
        "[2|1, 4|1, n|1, n|1], a dim 1 where it is broadcast"
    ), left.reason
    params["mask"] = ((2, 1, 1, n), "int32")
    mod = _module("main", params, lambda bb, q, k, v, mask: R.nn.attention(q, k, v, mask))
    _, report = partition_for_tessera(mod, "cpu")
    (left,) = report.not_offloaded
    assert left.reason == "attention with a bias mask of int32: an additive bias is a float tensor", left.reason


def test_attention_with_a_bias_plans_a_kernel_on_a_gpu_config_and_a_dynamic_length_stays_with_tvm():
    """Planning only (no GPU needed): the Hopper attention program adds the bias too."""
    mod = _biased_attention_module((B, 1, 1, S), dtype="float16")
    out, report = partition_for_tessera(mod, "hopper")
    (kernel,) = report.offloaded
    assert kernel.family == "attention" and kernel.spec.bias == (B, 1, 1, S) and kernel.spec.dtype_bias == "float16"
    assert str(out[kernel.kernel].attrs[KERNEL_ATTR]) == "attention"
    # The GPU kernel takes a symbolic batch only: a dynamic sequence length stays with TVM, and says so.
    s = tvm.tirx.Var("s", "int64")
    params = {name: ((B, s, H, D), "float16") for name in "qkv"}
    params["mask"] = ((B, 1, 1, s), "float16")
    mod = _module("main", params, lambda bb, q, k, v, mask: R.nn.attention(q, k, v, mask))
    _, report = partition_for_tessera(mod, "hopper")
    assert report.offloaded == []
    (left,) = report.not_offloaded
    assert left.op == "R.nn.attention_bias" and "dynamic S_q (s), S_kv (s)" in left.reason, left.reason


def _linears_with_constant_weights(rng):
    """x [b, 37, 70] -> gelu(x @ w1^T + b1) (w1 [45, 70], a linear's weight: B read transposed) -> @ w2
    ([45, 53], B as it is) -> @ w (a parameter). N and K are not multiples of the CPU's blocks or its
    32-column strips; the batch (symbolic, as in a model exported with a dynamic batch) shares each
    weight."""
    w1 = (rng.standard_normal((45, 70)) * 0.2).astype(np.float32)
    b1 = rng.standard_normal(45).astype(np.float32)
    w2 = (rng.standard_normal((45, 53)) * 0.2).astype(np.float32)

    def body(bb, x, w):
        h = bb.emit(R.matmul(x, bb.emit(R.permute_dims(relax.const(w1)))))
        h = bb.emit(R.nn.gelu(bb.emit(R.add(h, relax.const(b1)))))
        h = bb.emit(R.matmul(h, relax.const(w2)))
        return R.matmul(h, w)

    batch = tvm.tirx.Var("b", "int64")
    mod = _module("main", {"x": ((batch, 37, 70), "float32"), "w": ((53, 20), "float32")}, body)
    return mod, lambda x, w: gelu(x.astype(np.float64) @ w1.T + b1) @ w2 @ w


def test_constant_weights_are_packed_ahead_and_a_parameter_weight_is_packed_per_call():
    rng = np.random.default_rng(5)
    mod, reference = _linears_with_constant_weights(rng)
    built = build(mod, "cpu")
    assert [o.ops for o in built.report.offloaded] == ["matmul + add + gelu", "matmul", "matmul"], built.report
    packed = [o.packed_weight for o in built.report.offloaded]
    assert packed == [True, True, False], built.report
    assert all(set(o.dynamic) == {"b"} for o in built.report.offloaded), built.report  # the batch binds per call
    assert "(weight packed ahead)" in str(built.report) and built.report.as_dict()["offloaded"][0]["packed_weight"]
    for o in built.report.offloaded:  # the PrimFunc reads B's panels, or packs B in its K loop
        script = built.module[o.kernel].script()
        if o.packed_weight:
            assert "tessera_cpu_gemm_panel_f32" in script and "tessera_cpu_pack_b_" not in script, o.kernel
            assert o.spec.packed_b is not None and not o.spec.transpose_b
        else:
            assert "tessera_cpu_pack_b_f32" in script and "tessera_cpu_gemm_panel_f32" not in script, o.kernel
    x = rng.standard_normal((2, 37, 70)).astype(np.float32)
    w = (rng.standard_normal((53, 20)) * 0.2).astype(np.float32)
    np.testing.assert_allclose(built.run("main", x, w), reference(x, w), rtol=1e-4, atol=1e-4)
    # pack_weights=False keeps the constants as they are: every kernel packs its B
    _, kept = partition_for_tessera(mod, "cpu", pack_weights=False)
    assert [o.packed_weight for o in kept.offloaded] == [False, False, False]


def test_patterns_that_need_an_op_the_module_lacks_are_left_out_and_the_partition_is_the_same(monkeypatch):
    """FuseOpsByPattern rewrites the module once per pattern (354); partition_for_tessera passes
    only those whose ops the module calls, which must not change what it offloads."""
    from tessera_tvm.relax import offload, patterns

    dpl = relax.dpl
    add = dpl.is_op("relax.add")
    gemm = add(dpl.is_op("relax.matmul")(dpl.wildcard(), dpl.wildcard()), dpl.wildcard())
    assert patterns.required_ops(gemm) == {"relax.add", "relax.matmul"}
    either = dpl.is_op("relax.nn.relu")(gemm) | dpl.is_op("relax.nn.gelu")(gemm)
    assert patterns.required_ops(either) == {"relax.add", "relax.matmul"}  # an alternative needs only what both need
    assert patterns.required_ops(dpl.is_op("relax.astype")(either)) == {"relax.add", "relax.astype", "relax.matmul"}

    def body(bb, x, w, g, b):
        s = bb.emit(R.nn.softmax(x, axis=-1))
        n = bb.emit(R.nn.rms_norm(s, g, axes=[-1], epsilon=1e-6))
        y = bb.emit(R.add(bb.emit(R.matmul(n, w)), b))
        return R.astype(R.nn.silu(y), "float16")

    f32 = "float32"
    mod = _module("main", {"x": ((8, 16), f32), "w": ((16, 24), f32), "g": ((16,), f32), "b": ((24,), f32)}, body)
    kept = []
    every = patterns.tessera_patterns(tessera_tvm.load_config("cpu"), patterns.MatchLog())
    real_ops_in = offload.ops_in
    monkeypatch.setattr(offload, "ops_in", lambda m: kept.append(real_ops_in(m)) or kept[-1])
    filtered, report = partition_for_tessera(mod, "cpu")
    assert 0 < sum(patterns.required_ops(p.pattern) <= kept[0] for p in every) < len(every) / 2
    monkeypatch.setattr(
        offload, "ops_in", lambda m: frozenset().union(*(patterns.required_ops(p.pattern) for p in every))
    )
    whole, whole_report = partition_for_tessera(mod, "cpu")  # every pattern tried
    assert sorted(o.ops for o in report.offloaded) == ["matmul + add + silu + cast", "rms_norm", "softmax"]
    assert str(report) == str(whole_report)
    assert filtered.script() == whole.script()


def test_a_slice_or_squeeze_of_a_constant_is_folded_into_the_constant_it_computes():
    from tessera_tvm.relax.recover import fold_constant_slices

    relax = tvm.relax
    c = np.arange(2 * 3 * 8, dtype="float32").reshape(2, 3, 8)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorStructInfo((3, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            first = bb.emit(relax.op.strided_slice(relax.const(c), axes=[0], begin=[1], end=[2]))
            squeezed = bb.emit(relax.op.squeeze(first, axis=[0]))
            # backwards over the last axis from its end, every other row: TVM's clamping and strides
            stepped = bb.emit_output(
                relax.op.strided_slice(relax.const(c), axes=[2, 1], begin=[-1, 0], end=[-9, 3], strides=[-2, 2])
            )
            out = bb.emit_output(relax.op.add(x, squeezed))
        bb.emit_func_output([out, stepped])
    folded, count = fold_constant_slices(bb.get())
    assert count == 3
    calls, consts = [], []

    def visit(expr):
        if isinstance(expr, relax.Call):
            calls.append(str(expr.op.name))
        elif isinstance(expr, relax.Constant):
            consts.append(expr.data.numpy())

    relax.analysis.post_order_visit(folded["main"], visit)
    assert calls == ["relax.add"]
    np.testing.assert_array_equal(consts[0], c[1])
    np.testing.assert_array_equal(consts[1], c[:, [0, 2]][:, :, [7, 5, 3, 1]])


@pytest.mark.parametrize(
    "shape, axis",
    [(("n", 2, 24), 1), ((6, "n", 3), 0)],
    ids=["symbolic rows, static columns after the axis", "symbolic columns after the axis"],
)
def test_a_sum_over_an_axis_with_a_symbolic_dim_around_it_runs_on_the_cpu(shape, axis):
    # The first reduces runs of 24 columns at a time (tile/reduce.py _reduce_cpu_columns) over a
    # symbolic number of them; the second, whose run of columns is symbolic, row by row.
    n = tvm.tirx.Var("n", "int64")
    dims = tuple(n if d == "n" else d for d in shape)
    mod = _module("main", {"x": (dims, "float32")}, lambda bb, x: R.sum(x, axis=[axis]))
    built = build(mod, "cpu")
    assert [o.family for o in built.report.offloaded] == ["reduce"], built.report
    rng = np.random.default_rng(5)
    for length in (1, 5, 40):
        x = rng.standard_normal(tuple(length if d == "n" else d for d in shape)).astype(np.float32)
        np.testing.assert_allclose(built.run("main", x), x.sum(axis), rtol=1e-5, atol=1e-5)
