"""tessera.DecomposeRowOps (graph phase, tenstorrent list): softmax and the norms over the last axis
become reductions and element-wise ops that compute the same values; other axes stay as they are."""

from __future__ import annotations

import numpy as np
from tvm.script import ir as I  # noqa: E741
from tvm.script import relax as R

from tessera_tvm._tvm import tvm
from tessera_tvm.graph.nodes import flatten
from tessera_tvm.pipeline import ensure_registered
from tessera_tvm.registry import BuildContext, get_pass


def run_pass(mod):
    ensure_registered()
    return get_pass("tessera.DecomposeRowOps").factory(BuildContext(None, None))(mod)


def ops_of(mod) -> list[str]:
    return [n.op for n in flatten(mod["k"], "k").nodes]


def run_relax(mod, *arrays):
    ex = tvm.compile(mod, target="c")
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    return vm["k"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def test_softmax_becomes_max_exp_sum_divide_with_the_same_values():
    @I.ir_module
    class Before:
        @R.function
        def k(x: R.Tensor((4, 40), "float32")) -> R.Tensor((4, 40), "float32"):
            with R.dataflow():
                y = R.nn.softmax(x, axis=-1)
                R.output(y)
            return y

    after = run_pass(Before)
    assert ops_of(after) == ["max", "subtract", "exp", "sum", "divide"]
    x = np.random.default_rng(0).standard_normal((4, 40)).astype(np.float32) * 4
    np.testing.assert_allclose(run_relax(after, x), run_relax(Before, x), rtol=1e-6, atol=1e-7)


def test_layer_norm_and_rms_norm_decompose_with_the_same_values():
    @I.ir_module
    class Before:
        @R.function
        def k(
            x: R.Tensor((3, 50), "float32"), w: R.Tensor((50,), "float32"), b: R.Tensor((50,), "float32")
        ) -> R.Tensor((3, 50), "float32"):
            with R.dataflow():
                y = R.nn.layer_norm(x, w, b, axes=[-1], epsilon=1e-5)
                z = R.nn.rms_norm(y, w, axes=[-1], epsilon=1e-6)
                R.output(z)
            return z

    after = run_pass(Before)
    ops = ops_of(after)
    assert "nn.layer_norm" not in ops and "nn.rms_norm" not in ops
    assert ops.count("mean") == 3 and ops.count("rsqrt") == 2
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((3, 50), (50,), (50,)))
    np.testing.assert_allclose(run_relax(after, x, w, b), run_relax(Before, x, w, b), rtol=1e-5, atol=1e-5)


def test_other_axes_are_left_alone():
    @I.ir_module
    class Before:
        @R.function
        def k(x: R.Tensor((4, 40), "float32")) -> R.Tensor((4, 40), "float32"):
            with R.dataflow():
                y = R.nn.softmax(x, axis=0)
                R.output(y)
            return y

    tvm.ir.assert_structural_equal(run_pass(Before), Before)
