"""Element-wise tile programs: every op, numpy broadcasting, edges, fp16/bf16; GPU artifacts."""

from __future__ import annotations

import numpy as np
import pytest

import tessera_tvm
from tessera_tvm.tile import Binary, Const, ElementwiseSpec, Input, TileSchedule, Unary, build_tile_program
from tests.tile.conftest import erf

from .conftest import as64, assert_close, random_inputs, run_cpu

UNARY = {
    "exp": np.exp,
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0),
    "gelu_erf": lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "gelu_quick": lambda x: x / (1 + np.exp(-1.702 * x)),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "neg": np.negative,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "abs": np.abs,
    "log": np.log,
}
BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
    "pow": np.power,
}


def evaluate(expr, values):
    """numpy reference of an expression tree."""
    if isinstance(expr, Input):
        return values[expr.name]
    if isinstance(expr, Const):
        return np.float64(expr.value)
    if isinstance(expr, Unary):
        x = evaluate(expr.x, values)
        if expr.op == "cast":
            from tessera_tvm.target.cpu import numpy_dtype

            return x.astype(numpy_dtype(expr.dtype)).astype(np.float64)
        return UNARY[expr.op](x)
    return BINARY[expr.op](evaluate(expr.x, values), evaluate(expr.y, values))


def reference(spec, arrays):
    return evaluate(spec.expr, {name: as64(a) for name, a in arrays.items()})


# Every unary op once, on values kept in each op's domain: sqrt/rsqrt/log/pow read |x| + 0.5.
POSITIVE = Binary("add", Unary("abs", Input("x")), Const(0.5))
EVERY_OP = Binary(
    "add",
    Binary(
        "add",
        Binary(
            "add",
            Binary("sub", Unary("exp", Unary("tanh", Input("x"))), Unary("relu", Unary("gelu_quick", Input("y")))),
            Binary("mul", Unary("gelu_erf", Input("x")), Unary("gelu_tanh", Input("y"))),
        ),
        Binary("div", Unary("silu", Input("x")), Binary("add", Unary("sigmoid", Input("y")), Const(1.0))),
    ),
    Binary(
        "max",
        Binary("min", Unary("neg", Unary("sqrt", POSITIVE)), Unary("rsqrt", POSITIVE)),
        Binary("pow", POSITIVE, Unary("log", POSITIVE)),
    ),
)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cpu_every_op_with_broadcasting(dtype, cpu_config, tmp_path):
    # x is the full [3, 37, 53] tensor, y a [37, 1] column broadcast over the batch and the last dim.
    spec = ElementwiseSpec((3, 37, 53), (("x", (3, 37, 53), dtype), ("y", (37, 1), dtype)), EVERY_OP, dtype)
    arrays = random_inputs(spec)
    out = run_cpu(spec, arrays, cpu_config, tmp_path)["out"]
    assert_close(out, reference(spec, arrays), dtype)


def test_cpu_row_vector_scalar_and_cast(cpu_config, tmp_path):
    # A [53] row vector and a [1] scalar broadcast; an explicit cast to bf16 in the middle.
    expr = Binary("mul", Unary("cast", Binary("add", Input("x"), Input("b")), dtype="bfloat16"), Input("s"))
    spec = ElementwiseSpec(
        (5, 53), (("x", (5, 53), "float32"), ("b", (53,), "float16"), ("s", (1,), "float32")), expr, "float32"
    )
    arrays = random_inputs(spec, seed=1)
    out = run_cpu(spec, arrays, cpu_config, tmp_path)["out"]
    assert_close(out, reference(spec, arrays), "bfloat16")


@pytest.mark.parametrize("shape", [(1,), (131,), (7, 1, 13)], ids=str)
def test_cpu_edge_shapes(shape, cpu_config, tmp_path):
    spec = ElementwiseSpec(shape, (("x", shape, "float32"),), Unary("silu", Input("x")), "float32")
    arrays = random_inputs(spec, seed=2)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=TileSchedule(block_m=4, block_n=16))["out"]
    assert_close(out, reference(spec, arrays), "float32")


@pytest.mark.parametrize("target", ["hopper", "ampere", "rocm"])
def test_gpu_elementwise_masks_the_edge(target):
    spec = ElementwiseSpec(
        (37, 1001),
        (("x", (37, 1001), "float16"), ("b", (1001,), "float16")),
        Unary("gelu_tanh", Binary("add", Input("x"), Input("b"))),
        "float16",
    )
    source = tessera_tvm.lower(build_tile_program(spec, None, target), target, build=False).source
    assert "elementwise_kernel" in source
    assert "< 1001)" in source and "tanhf" in source


@pytest.mark.parametrize("op", ["tanh", "gelu_erf", "gelu_tanh", "sigmoid", "silu", "exp"])
def test_cpu_vectorised_math_over_the_whole_float_range(op, cpu_config, tmp_path):
    # The CPU evaluates exp, erf and tanh with tessera/cpu_math.h's inline functions (g++ vectorises
    # them; libm's calls stay scalar). Their accuracy, against float64 numpy, where it is hardest: tiny
    # values (tanh's cancellation), the switch at |x| = 0.25, large magnitudes, overflow, inf and NaN.
    # Bounds: 2 float32 ulps plus 2e-7 absolute (erf is A&S 7.1.26, |error| < 1.5e-7).
    x = np.concatenate(
        [np.linspace(-30, 30, 2001), np.geomspace(1e-30, 0.3, 200), -np.geomspace(1e-30, 0.3, 200),
         [0.25, -0.25, 0.2499999, 88.0, -88.0, 100.0, -100.0, 0.0, -0.0]]
    ).astype(np.float32)  # fmt: skip
    if op == "exp":
        x = x[x < 88]  # beyond, float32 exp overflows to inf (checked below)
    spec = ElementwiseSpec(shape=(x.size,), operands=(("x", (x.size,), "float32"),), expr=Unary(op, Input("x")))
    out = run_cpu(spec, {"x": x}, cpu_config, tmp_path)["out"]
    want = UNARY[op](x.astype(np.float64))
    bound = 2 * np.spacing(np.abs(want).astype(np.float32)).astype(np.float64) + 2e-7 * np.maximum(1, np.abs(x))
    if op in ("tanh",):
        bound = 2 * np.spacing(np.abs(want).astype(np.float32)).astype(np.float64) + 2e-7
    err = np.abs(out.astype(np.float64) - want)
    assert np.all(err <= bound), (x[np.argmax(err - bound)], float(np.max(err - bound)))
    if op == "tanh":  # tiny values keep their relative accuracy (no 1 - 2 / (e^2x + 1) cancellation)
        tiny = np.abs(x) < 0.25
        np.testing.assert_allclose(out[tiny], want[tiny], rtol=1e-6)
    special = ElementwiseSpec(shape=(3,), operands=(("x", (3,), "float32"),), expr=Unary(op, Input("x")))
    edge = run_cpu(special, {"x": np.array([np.inf, -np.inf, np.nan], np.float32)}, cpu_config, tmp_path / "e")["out"]
    with np.errstate(all="ignore"):
        expected = UNARY[op](np.array([np.inf, -np.inf, np.nan]))
    np.testing.assert_array_equal(np.isnan(edge), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_array_equal(edge[finite], expected[finite].astype(np.float32))
