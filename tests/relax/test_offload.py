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
    """conv2d (no Tessera kernel) -> reshape -> matmul + bias + relu (a Tessera GEMM)."""

    def body(bb, x, k, w, b):
        c = bb.emit(R.nn.conv2d(x, k))
        f = bb.emit(R.reshape(c, (2, 4 * 6 * 6)))
        return R.nn.relu(bb.emit(R.add(bb.emit(R.matmul(f, w)), b)))

    f32 = "float32"
    return _module(
        "main", {"x": ((2, 3, 8, 8), f32), "k": ((4, 3, 3, 3), f32), "w": ((144, 40), f32), "b": ((40,), f32)}, body
    )


def _conv2d(x, k):
    n, _, h, w = x.shape
    o, _, kh, kw = k.shape
    out = np.zeros((n, o, h - kh + 1, w - kw + 1))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", x[:, :, i : i + h - kh + 1, j : j + w - kw + 1], k[:, :, i, j])
    return out


def test_unsupported_op_stays_with_tvm_and_the_module_compiles_and_runs():
    built = build(_conv_mlp(), "cpu")
    report = built.report
    assert [o.ops for o in report.offloaded] == ["matmul + add + relu"]
    conv = [n for n in report.not_offloaded if n.op == "R.nn.conv2d"]
    assert len(conv) == 1 and conv[0].reason == "no Tessera kernel"
    assert "R.nn.conv2d" in str(report) and "no Tessera kernel" in str(report)
    rng = np.random.default_rng(0)
    x, k = rng.standard_normal((2, 3, 8, 8)), rng.standard_normal((4, 3, 3, 3)) * 0.3
    w, b = rng.standard_normal((144, 40)) * 0.1, rng.standard_normal(40)
    out = built.run("main", *(a.astype(np.float32) for a in (x, k, w, b)))
    ref = np.maximum(_conv2d(x, k).reshape(2, 144) @ w + b, 0)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)  # f32 kernels vs float64 numpy


def test_dynamic_k_is_reported_and_left_to_tvm():
    k = tvm.tirx.Var("k", "int64")
    mod = _module("main", {"x": ((8, k), "float32"), "w": ((k, 16), "float32")}, lambda bb, x, w: R.matmul(x, w))
    built = build(mod, "cpu")
    assert built.report.offloaded == []
    (left,) = built.report.not_offloaded
    assert left.op == "R.matmul"
    assert left.reason.startswith("matmul with dynamic K (k)"), left.reason
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((5, 16)).astype(np.float32)
    np.testing.assert_allclose(built.run("main", x, w), x @ w, rtol=1e-5, atol=1e-5)


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


def test_bf16_on_the_cpu_is_left_to_tvm_with_the_reason():
    mod = _module("main", {"x": ((16, 16), "bfloat16"), "w": ((16, 16), "bfloat16")}, lambda bb, x, w: R.matmul(x, w))
    _, report = partition_for_tessera(mod, "cpu")
    (left,) = report.not_offloaded
    assert "bfloat16" in left.reason and "C codegen" in left.reason


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
