"""tessera.Simplify (graph phase): identity casts and arithmetic go, cast and scale chains fold.

Bindings a rewrite leaves unused stay: relax.DeadCodeElimination, next in the list, drops them.
"""

from __future__ import annotations

from tvm.script import ir as I  # noqa: E741
from tvm.script import relax as R

from tessera_tvm._tvm import tvm
from tessera_tvm.pipeline import ensure_registered
from tessera_tvm.registry import BuildContext, get_pass


def run_pass(mod):
    ensure_registered()
    return get_pass("tessera.Simplify").factory(BuildContext(None, None))(mod)


def test_identity_cast_and_multiply_by_one_go():
    @I.ir_module
    class Before:
        @R.function
        def k(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
            with R.dataflow():
                a = R.astype(x, "float32")
                b = R.multiply(a, R.const(1.0, "float32"))
                c = R.nn.relu(b)
                R.output(c)
            return c

    @I.ir_module
    class Expected:
        @R.function
        def k(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
            with R.dataflow():
                c = R.nn.relu(x)
                R.output(c)
            return c

    tvm.ir.assert_structural_equal(run_pass(Before), Expected)


def test_a_cast_through_a_wider_type_folds_and_a_narrowing_one_stays():
    @I.ir_module
    class Before:
        @R.function
        def k(x: R.Tensor((4,), "bfloat16"), y: R.Tensor((4,), "float32")):
            with R.dataflow():
                a = R.astype(x, "float32")  # bf16 -> f32 -> bf16: exact, folds to x
                b = R.astype(a, "bfloat16")
                e = R.nn.relu(b)
                c = R.astype(y, "bfloat16")  # f32 -> bf16 -> f32 rounds: stays
                d = R.astype(c, "float32")
                R.output(e, d)
            return (e, d)

    @I.ir_module
    class Expected:
        @R.function
        def k(x: R.Tensor((4,), "bfloat16"), y: R.Tensor((4,), "float32")):
            with R.dataflow():
                _a = R.astype(x, "float32")
                e = R.nn.relu(x)
                c = R.astype(y, "bfloat16")
                d = R.astype(c, "float32")
                R.output(e, d)
            return (e, d)

    tvm.ir.assert_structural_equal(run_pass(Before), Expected)


def test_scale_chains_fold_into_one_multiply():
    @I.ir_module
    class Before:
        @R.function
        def k(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
            with R.dataflow():
                a = R.multiply(x, R.const(2.0, "float32"))
                b = R.multiply(a, R.const(4.0, "float32"))
                R.output(b)
            return b

    @I.ir_module
    class Expected:
        @R.function
        def k(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
            with R.dataflow():
                _a = R.multiply(x, R.const(2.0, "float32"))
                b = R.multiply(x, R.const(8.0, "float32"))
                R.output(b)
            return b

    tvm.ir.assert_structural_equal(run_pass(Before), Expected)


def test_a_scale_chain_folds_only_into_a_scale_its_dtype_holds():
    """f16 ``(x * 256) * 256`` stays two multiplies: one scale of 65536 is inf in f16 (the kernel gave
    inf and NaN where the reference has 65.56 and 0), and 1e-3 * 1e-4 a subnormal 19% off."""

    @I.ir_module
    class Before:
        @R.function
        def k(x: R.Tensor((4,), "float16")) -> R.Tensor((4,), "float16"):
            with R.dataflow():
                a = R.multiply(x, R.const(256.0, "float16"))
                b = R.multiply(a, R.const(256.0, "float16"))
                c = R.multiply(b, R.const(0.0009765625, "float16"))
                d = R.multiply(c, R.const(0.0001, "float16"))
                R.output(d)
            return d

    @I.ir_module
    class Expected:
        @R.function
        def k(x: R.Tensor((4,), "float16")) -> R.Tensor((4,), "float16"):
            with R.dataflow():
                a = R.multiply(x, R.const(256.0, "float16"))
                _b = R.multiply(a, R.const(256.0, "float16"))
                c = R.multiply(a, R.const(0.25, "float16"))  # 256 * 2^-10: exact in f16
                d = R.multiply(c, R.const(0.0001, "float16"))
                R.output(d)
            return d

    tvm.ir.assert_structural_equal(run_pass(Before), Expected)


def test_an_integer_scale_chain_folds_wrapped():
    """int8 ``(x * 100) * 3`` is ``x * 44`` in int8 arithmetic (300 was an error: out of bounds for int8)."""

    @I.ir_module
    class Before:
        @R.function
        def k(x: R.Tensor((4,), "int8")) -> R.Tensor((4,), "int8"):
            with R.dataflow():
                a = R.multiply(x, R.const(100, "int8"))
                b = R.multiply(a, R.const(3, "int8"))
                R.output(b)
            return b

    @I.ir_module
    class Expected:
        @R.function
        def k(x: R.Tensor((4,), "int8")) -> R.Tensor((4,), "int8"):
            with R.dataflow():
                _a = R.multiply(x, R.const(100, "int8"))
                b = R.multiply(x, R.const(44, "int8"))
                R.output(b)
            return b

    tvm.ir.assert_structural_equal(run_pass(Before), Expected)
