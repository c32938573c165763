# ruff: noqa: F821, F722  (Tensor["M", "K", ...] dims are strings, not names)
"""Property-based fuzzing of the frontend on the CPU target, and of the Tenstorrent emulator.

Each example builds a kernel from random parts (op composition, shapes, dtype), compiles it with
``ts.compile(..., target="cpu")``, runs it on random arrays and compares the result with the
kernel's own numpy reference (``kernel.reference``) at the per-dtype tolerance of
``tests/frontend/helpers.py``. Shapes include 1, primes and sizes just off every block size (CPU
blocks: GEMM 224x256x128 shrunk to the problem, attention 96x112, reductions 8x256, element-wise 16x256).

Inputs are scaled so intermediate values stay O(1): the reference rounds after every op and a fused
kernel only at its store, so their difference is a few ulps of the largest intermediate, which the
tolerance covers only when that intermediate is O(1). Some examples put NaN and +-inf into the
inputs (``special``); those compare NaN-aware (``np.testing.assert_allclose(..., equal_nan=True)``:
NaN and the infinities where the reference has them).

The Tenstorrent part lowers the TileLang programs of ``tests/target/tt/programs.py`` (the ops that target
supports: GEMM with epilogues, element-wise, SFPU unary ops; bf16 on 32x32 tiles) at random shapes
with ``tessera_tvm.lower(..., "tenstorrent", out_dir=...)`` and runs the plan in the emulator.

CI runs a few examples per test (derandomized); ``TESSERA_FUZZ_EXAMPLES=500 python -m pytest
tests/robustness -q`` runs a longer, freshly random search.
"""

# No `from __future__ import annotations`: the kernels annotate with closure variables (dtypes, dims).

import json
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import tessera as ts
from tessera import Tensor, ops
from tests.conftest import emu_cache
from tests.frontend.helpers import TOLERANCE, assert_close, random_array

from .fuzz import count, fuzz_settings

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

FLOATS = [ts.f32, ts.f16, ts.bf16]
#: 1, primes, and one off every block size of the CPU config (and of the 32x32 Tenstorrent tile).
EDGE_SIZES = [1, 2, 3, 5, 7, 13, 17, 31, 33, 37, 63, 65, 97, 127, 129, 251, 255, 257]


def sizes(high: int = 300):
    """A dim size: an edge case or any size up to ``high``."""
    return st.one_of(st.sampled_from([s for s in EDGE_SIZES if s <= high]), st.integers(1, high))


dtypes = st.sampled_from(FLOATS)


#: Non-finite values an example puts into its inputs (None: none). NaN and +-inf must come out where
#: the reference (numpy, as torch) has them: relu, clamp and max keep a NaN (issue #37, item 3).
specials = st.sampled_from([None, None, "nan", "inf", "mixed"])
_SPECIAL_VALUES = {"nan": [np.nan], "inf": [np.inf, -np.inf], "mixed": [np.nan, np.inf, -np.inf]}


def poison(rng: np.random.Generator, array: np.ndarray, special) -> np.ndarray:
    """``array`` with one to three elements set to the non-finite values of ``special``."""
    if special is None:
        return array
    array = array.copy()
    flat = array.reshape(-1)
    for _ in range(int(rng.integers(1, 4))):
        flat[rng.integers(flat.size)] = rng.choice(_SPECIAL_VALUES[special])
    return array


def check(kernel, *arrays):
    """Compile for the CPU, run, compare with the kernel's numpy reference. With non-finite inputs,
    NaN-aware: NaN where the reference has NaN, the same infinities, the rest within tolerance."""
    out = ts.compile(kernel, target="cpu")(*arrays)
    ref = kernel.reference(*arrays)
    outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    finite_inputs = all(np.isfinite(np.asarray(a, np.float32)).all() for a in arrays)
    what = f"{kernel.name} {[a.shape for a in arrays]}"
    for o, r in zip(outs, refs, strict=True):
        r = np.asarray(r)
        if finite_inputs:
            assert_close(o, r, ts.dtype(o.dtype), what)
            assert np.isfinite(o.astype(np.float32)).all(), f"{kernel.name}: non-finite output"
            continue
        assert o.dtype == r.dtype and o.shape == r.shape, f"{what}: {o.dtype}{o.shape} vs {r.dtype}{r.shape}"
        rtol, atol = TOLERANCE[ts.dtype(o.dtype)]
        o64, r64 = o.astype(np.float64), r.astype(np.float64)
        np.testing.assert_allclose(o64, r64, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


# --------------------------------------------------------------------------- GEMM with epilogues

ACTIVATIONS = {
    "none": lambda y: y,
    "relu": ops.relu,
    "gelu": ops.gelu,
    "gelu_tanh": lambda y: ops.gelu(y, approximate="tanh"),
    "silu": ops.silu,
    "sigmoid": ops.sigmoid,
    "tanh": ops.tanh,
}


@fuzz_settings(ci=12)
@given(
    dt=dtypes,
    m=sizes(),
    n=sizes(),
    k=sizes(),
    transpose_b=st.booleans(),
    bias=st.booleans(),
    act=st.sampled_from(sorted(ACTIVATIONS)),
    scale=st.sampled_from([None, 0.5, 2.0]),
    residual=st.booleans(),
    special=specials,
    seed=st.integers(0, 2**16),
)
# Issue #37: a NaN through relu came out as 0.
@example(ts.f32, 9, 7, 5, False, True, "relu", None, False, "nan", 1)
def test_matmul_epilogues(dt, m, n, k, transpose_b, bias, act, scale, residual, special, seed):
    count("cpu matmul+epilogue")
    w_dims = ("N", "K") if transpose_b else ("K", "N")
    activation = ACTIVATIONS[act]

    @ts.kernel
    def linear(
        A: Tensor["M", "K", dt], W: Tensor[w_dims[0], w_dims[1], dt], b: Tensor["N", dt], R: Tensor["M", "N", dt]
    ):
        y = ops.matmul(A, W, transpose_b=transpose_b)
        if bias:
            y = y + b
        y = activation(y)
        if scale is not None:
            y = ops.scale(y, scale)
        if residual:
            y = y + R
        return y

    rng = np.random.default_rng(seed)
    w_shape = (n, k) if transpose_b else (k, n)
    check(
        linear,
        poison(rng, random_array(rng, (m, k), dt), special),
        random_array(rng, w_shape, dt, 1 / math.sqrt(k)),
        random_array(rng, (n,), dt),
        poison(rng, random_array(rng, (m, n), dt), special),
    )


@fuzz_settings(ci=4)
@given(
    dt=dtypes,
    batch=st.sampled_from([(1,), (2,), (3,), (2, 3)]),
    m=sizes(70),
    n=sizes(70),
    k=sizes(70),
    broadcast_b=st.booleans(),
    special=specials,
    seed=st.integers(0, 2**16),
)
def test_batched_matmul(dt, batch, m, n, k, broadcast_b, special, seed):
    count("cpu batched matmul")
    a_dims = (*[f"B{i}" for i in range(len(batch))], "M", "K")
    b_dims = ("K", "N") if broadcast_b else (*a_dims[:-2], "K", "N")

    @ts.kernel
    def bmm(A: Tensor[(*a_dims, dt)], B: Tensor[(*b_dims, dt)]):
        return ops.matmul(A, B)

    rng = np.random.default_rng(seed)
    b_shape = (k, n) if broadcast_b else (*batch, k, n)
    b = poison(rng, random_array(rng, b_shape, dt, 1 / math.sqrt(k)), special)
    check(bmm, random_array(rng, (*batch, m, k), dt), b)


# --------------------------------------------------------------------------- int8 GEMMs

#: Integer epilogue steps on an int32 GEMM result (exact, wrapping); "cast" switches between int32
#: and int8 (the next steps take int8 operands), then optionally a cast to a float and float steps.
INT_STEPS = {
    "bias": lambda y, t: y + t["bias"],
    "residual": lambda y, t: y + t["R"],
    "gate": lambda y, t: y * t["R"],
    "add_scalar": lambda y, t: y + t["number"],
    "mul_scalar": lambda y, t: y * -3,
}
FLOAT_STEPS = {
    "scale": lambda y, t: y * 0.001,
    "bias": lambda y, t: y + t["fbias"],
    "relu": lambda y, t: ops.relu(y),
    "gelu": lambda y, t: ops.gelu(y * 1e-4),
}


@fuzz_settings(ci=4)
@given(
    m=sizes(150),
    n=sizes(150),
    k=sizes(300),
    batch=st.sampled_from([(), (2,)]),
    shared_b=st.booleans(),
    transpose_a=st.booleans(),
    transpose_b=st.booleans(),
    int_steps=st.lists(st.sampled_from([*sorted(INT_STEPS), "cast"]), max_size=4),
    to_float=st.sampled_from([None, ts.f32, ts.bf16, ts.f16]),
    float_steps=st.lists(st.sampled_from(sorted(FLOAT_STEPS)), max_size=2),
    seed=st.integers(0, 2**16),
)
def test_int8_matmul_epilogues(
    m, n, k, batch, shared_b, transpose_a, transpose_b, int_steps, to_float, float_steps, seed
):
    """int8 x int8 GEMMs on the whole int8 range with integer epilogues, exact against numpy's int32
    arithmetic (wrapping included), then optionally cast to a float with float steps."""
    count("cpu int8 matmul+epilogue")
    i8, i32 = ts.int8, ts.int32
    lead = tuple(f"B{i}" for i in range(len(batch)))
    a_dims = (*lead, "K", "M") if transpose_a else (*lead, "M", "K")
    b_lead = () if shared_b else lead
    b_dims = (*b_lead, "N", "K") if transpose_b else (*b_lead, "K", "N")
    narrow_out = int_steps.count("cast") % 2 == 1
    out_dtype = to_float or (i8 if narrow_out else i32)
    fdt = to_float or ts.f32

    @ts.kernel
    def int8_linear(
        A: Tensor[(*a_dims, i8)],
        W: Tensor[(*b_dims, i8)],
        bias: Tensor["N", i32],
        R: Tensor[(*lead, "M", "N", i32)],
        bias8: Tensor["N", i8],
        R8: Tensor[(*lead, "M", "N", i8)],
        fbias: Tensor["N", fdt],
    ):
        wide = {"bias": bias, "R": R, "number": 123456789}
        narrow = {"bias": bias8, "R": R8, "number": 100}
        y = ops.matmul(A, W, transpose_a=transpose_a, transpose_b=transpose_b)
        held = wide
        for step in int_steps:
            if step == "cast":
                y = ops.cast(y, i8 if held is wide else i32)
                held = narrow if held is wide else wide
            else:
                y = INT_STEPS[step](y, held)
        if to_float is not None:
            y = ops.cast(y, to_float)
            for step in float_steps:
                y = FLOAT_STEPS[step](y, {"fbias": fbias})
        return y

    rng = np.random.default_rng(seed)

    def full(shape, dtype):
        info = np.iinfo(dtype.numpy)
        return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype.numpy)

    arrays = (
        full((*batch, *((k, m) if transpose_a else (m, k))), i8),
        full((*(() if shared_b else batch), *((n, k) if transpose_b else (k, n))), i8),
        full((n,), i32),
        full((*batch, m, n), i32),
        full((n,), i8),
        full((*batch, m, n), i8),
        random_array(rng, (n,), fdt),
    )
    out = ts.compile(int8_linear, target="cpu")(*arrays)
    ref = np.asarray(int8_linear.reference(*arrays))
    what = f"{int8_linear.name} {[a.shape for a in arrays]} {int_steps} {to_float} {float_steps}"
    assert out.dtype == ref.dtype == out_dtype.numpy and out.shape == ref.shape, what
    if to_float is None:
        np.testing.assert_array_equal(out, ref, err_msg=what)
    else:
        # The reference rounds at every op, the kernel at its casts only (f16 sums past 65504 are inf in both).
        rtol, _ = TOLERANCE[to_float]
        o, r = out.astype(np.float64), ref.astype(np.float64)
        finite = np.isfinite(r)
        top = np.abs(r[finite]).max() if finite.any() else 0.0
        np.testing.assert_allclose(o, r, rtol=2 * rtol, atol=2 * rtol * (top + 1e-3), err_msg=what)


# --------------------------------------------------------------------------- element-wise chains

UNARY = {
    "relu": ops.relu,
    "gelu": ops.gelu,
    "silu": ops.silu,
    "sigmoid": ops.sigmoid,
    "tanh": ops.tanh,
    "neg": lambda y: -y,
    "half": lambda y: ops.scale(y, 0.5),
    "exp_tanh": lambda y: ops.exp(ops.tanh(y)),
}
BINARY = {"add": ops.add, "sub": ops.sub, "mul": ops.mul, "div": ops.div}
step = st.one_of(
    st.tuples(st.just("unary"), st.sampled_from(sorted(UNARY))),
    st.tuples(st.sampled_from(sorted(BINARY)), st.sampled_from(["x", "row", "col", "scalar"])),
)


@fuzz_settings(ci=12)
@given(
    dt=dtypes,
    m=sizes(),
    n=sizes(600),
    chain=st.lists(step, min_size=1, max_size=5),
    special=specials,
    seed=st.integers(0, 2**16),
)
# Issue #37: relu turned a NaN into 0, and TVM folded x - x to 0 (NaN for NaN and inf).
@example(ts.f32, 4, 9, [("unary", "relu"), ("sub", "x")], "mixed", 2)
def test_elementwise_chains_with_broadcasting(dt, m, n, chain, special, seed):
    count("cpu element-wise chain")
    # Every parameter is used: row [N] and col [M, 1] broadcast against x [M, N].
    chain = [*chain, ("add", "row"), ("mul", "col")]

    @ts.kernel
    def chain_kernel(x: Tensor["M", "N", dt], row: Tensor["N", dt], col: Tensor["M", 1, dt]):
        operands = {"x": x, "row": row, "col": col, "scalar": 1.5}
        y = x
        for kind, arg in chain:
            y = UNARY[arg](y) if kind == "unary" else BINARY[kind](y, operands[arg])
        return y

    rng = np.random.default_rng(seed)
    # Divisors and multipliers in [0.5, 1.5]: no division by ~0, no growth along the chain.
    x = random_array(rng, (m, n), dt)
    row = (rng.uniform(0.5, 1.5, n)).astype(dt.numpy)
    col = (rng.uniform(0.5, 1.5, (m, 1))).astype(dt.numpy)
    if any(kind == "div" and arg == "x" for kind, arg in chain):
        x = (np.abs(x.astype(np.float32)) + 0.5).astype(dt.numpy)
    check(chain_kernel, poison(rng, x, special), row, col)


# --------------------------------------------------------------------------- softmax and norms


@fuzz_settings(ci=8)
@given(
    dt=dtypes,
    shape=st.one_of(st.tuples(sizes(), sizes(700)), st.tuples(sizes(5), sizes(40), sizes(90))),
    axis_pick=st.integers(0, 5),
    special=specials,
    seed=st.integers(0, 2**16),
)
def test_softmax_any_axis(dt, shape, axis_pick, special, seed):
    count("cpu softmax")
    axis = axis_pick % len(shape) - len(shape) if axis_pick % 2 else axis_pick % len(shape)
    names = ("A", "B", "C")[: len(shape)]

    @ts.kernel
    def softmax(x: Tensor[(*names, dt)]):
        return ops.softmax(x, axis=axis)

    rng = np.random.default_rng(seed)
    check(softmax, poison(rng, random_array(rng, shape, dt, 2.0), special))


@fuzz_settings(ci=8)
@given(
    dt=dtypes,
    m=sizes(),
    n=sizes(700),
    kind=st.sampled_from(["layer_norm", "rms_norm"]),
    weight=st.booleans(),
    bias=st.booleans(),
    then_linear=st.booleans(),
    special=specials,
    seed=st.integers(0, 2**16),
)
def test_norms(dt, m, n, kind, weight, bias, then_linear, special, seed):
    count("cpu norm")
    p = 17  # output width of the optional linear layer after the norm (a second fused kernel)

    @ts.kernel
    def norm(x: Tensor["M", "N", dt], w: Tensor["N", dt], b: Tensor["N", dt], W: Tensor["N", p, dt]):
        if kind == "layer_norm":
            y = ops.layer_norm(x, w if weight else None, b if bias else None)
        else:
            y = ops.rms_norm(x, w if weight else None)
        return ops.gelu(ops.matmul(y, W)) if then_linear else y  # unused parameters are allowed

    rng = np.random.default_rng(seed)
    check(
        norm,
        poison(rng, random_array(rng, (m, n), dt, 3.0), special),
        random_array(rng, (n,), dt),
        random_array(rng, (n,), dt),
        random_array(rng, (n, p), dt, 1 / math.sqrt(n)),
    )


# --------------------------------------------------------------------------- attention


@fuzz_settings(ci=6)
@given(
    dt=dtypes,
    b=st.integers(1, 2),
    h_kv=st.integers(1, 2),
    group=st.sampled_from([1, 2, 3]),
    s_q=sizes(130),
    s_kv=sizes(130),
    d=st.sampled_from([1, 8, 16, 24, 32, 64]),
    causal=st.booleans(),
    align=st.sampled_from(["top_left", "bottom_right"]),
    scale=st.sampled_from([None, 0.1]),
    bias=st.none() | st.tuples(*[st.booleans()] * 3),  # which of [B, H, S_q] the bias broadcasts (S_kv: never)
    special=specials,
    seed=st.integers(0, 2**16),
)
def test_flash_attention(dt, b, h_kv, group, s_q, s_kv, d, causal, align, scale, bias, special, seed):
    count("cpu attention")
    h = h_kv * group

    @ts.kernel
    def attention(
        q: Tensor["B", h, "S", "D", dt], k: Tensor["B", h_kv, "T", "D", dt], v: Tensor["B", h_kv, "T", "D", dt]
    ):
        return ops.flash_attention(q, k, v, causal=causal, scale=scale, causal_align=align)

    rng = np.random.default_rng(seed)
    # Non-finite values in Q and K only: a NaN in V at a key a causal query cannot see is NaN for
    # torch (0 * NaN) but skipped with its block by the kernels (see the report of issue #37).
    arrays = (
        poison(rng, random_array(rng, (b, h, s_q, d), dt), special),
        poison(rng, random_array(rng, (b, h_kv, s_kv, d), dt), special),
        random_array(rng, (b, h_kv, s_kv, d), dt),
    )
    if bias is not None:  # an additive bias broadcast over the dims where it has a 1
        full = ("B", h, "S")
        dims = (*(1 if broadcast else x for x, broadcast in zip(full, bias, strict=True)), "T")

        @ts.kernel
        def attention(
            q: Tensor["B", h, "S", "D", dt],
            k: Tensor["B", h_kv, "T", "D", dt],
            v: Tensor["B", h_kv, "T", "D", dt],
            m: Tensor[dims + (dt,)],
        ):
            return ops.flash_attention(q, k, v, causal=causal, scale=scale, causal_align=align, bias=m)

        sizes_of = {"B": b, "S": s_q, "T": s_kv}
        arrays = (*arrays, random_array(rng, tuple(sizes_of.get(x, x) for x in dims), dt))
    if causal and align == "bottom_right" and s_kv < s_q:
        # Queries that see no key: the result there is defined by the reference (or rejected); either
        # way the compile must not crash.
        try:
            check(attention, *arrays)
        except ts.TesseraError:
            pass
        return
    check(attention, *arrays)


# --------------------------------------------------------------------------- Tenstorrent emulator

TT_CASES = st.one_of(
    st.tuples(st.just("gemm"), st.tuples(sizes(130), sizes(130), sizes(130))),
    st.tuples(
        st.just("gemm_bias_act"),
        st.tuples(sizes(100), sizes(100), sizes(100), st.sampled_from(["relu", "gelu", "gelu_tanh"])),
    ),
    st.tuples(st.just("eltwise"), st.tuples(sizes(130), sizes(130), st.sampled_from(["add", "sub", "mul"]))),
    st.tuples(st.just("unary"), st.tuples(sizes(100), sizes(100), st.sampled_from(["exp", "relu", "gelu"]))),
)


@pytest.fixture(scope="module")
def tt_dirs():
    root = Path(tempfile.mkdtemp(prefix="tessera_fuzz_tt_"))
    yield root / "out", emu_cache()  # the run's emulator cache: its runner is built once per run
    shutil.rmtree(root, ignore_errors=True)


@fuzz_settings(ci=20)
@given(case=TT_CASES, seed=st.integers(0, 2**16))
def test_tenstorrent_emulator_matches_numpy(tt_dirs, case, seed):
    import tessera_tvm
    from tessera_tvm.target.tt import round_to_bf16
    from tessera_tvm.target.tt.emulate import run_plan
    from tests.target.tt import programs
    from tests.target.tt.test_codegen_emulator import gelu_erf
    from tests.target.tt.test_emulator import EPS32, U_BF16, assert_within, check_protocol, gelu_tanh, gemm_ref

    count("tenstorrent emulator")
    name, args = case
    out_root, emu_cache = tt_dirs
    out = out_root / f"{name}_{'_'.join(map(str, args))}"
    art = tessera_tvm.lower(getattr(programs, name)(*args), "tenstorrent", out_dir=out)
    plan_path = Path(art.artifacts["plan"])
    plan = json.loads(plan_path.read_text())
    rng = np.random.default_rng(seed)
    ins = {
        b["name"]: rng.standard_normal(b["shape"]).astype(np.float32) for b in plan["buffers"] if b["role"] == "input"
    }
    result = run_plan(plan, plan_path.parent, ins, cache_dir=emu_cache)
    check_protocol(result, plan)

    def bf16(x):
        return round_to_bf16(np.asarray(x, dtype=np.float32)).astype(np.float64)

    what = f"{name}{args}"
    if name == "gemm":
        ref, acc_err = gemm_ref(ins["A"], ins["B"])
        assert_within(result["C"], ref, U_BF16 * np.abs(ref) + 3 * acc_err + 1e-30, what)
    elif name == "gemm_bias_act":
        act = {"relu": lambda y: np.maximum(y, 0), "gelu": gelu_erf, "gelu_tanh": gelu_tanh}[args[3]]
        mm, acc_err = gemm_ref(ins["A"], ins["B"])
        ref = act(bf16(mm) + bf16(ins["bias"])[None, :])
        tol = U_BF16 * np.abs(ref) + 1.13 * (2**-7 * np.abs(mm) + 3 * acc_err) + 1e-6
        assert_within(result["C"], ref, tol, what)
    elif name == "eltwise":
        ref = {"add": np.add, "mul": np.multiply, "sub": np.subtract}[args[2]](bf16(ins["A"]), bf16(ins["B"]))
        assert_within(result["C"], ref, (U_BF16 + 2 * EPS32) * np.abs(ref) + 1e-30, what)
    else:
        x = bf16(ins["X"])
        ref = {"exp": np.exp, "relu": lambda y: np.maximum(y, 0), "gelu": gelu_erf}[args[2]](x)
        assert_within(result["Y"], ref, (U_BF16 + 8 * EPS32) * np.abs(ref) + 1e-6, what)


# --------------------------------------------------------------------------- frontend -> Tenstorrent

TT_EPILOGUE = {"none": lambda y: y, "relu": ops.relu, "gelu": ops.gelu, "exp": ops.exp, "silu": ops.silu}
TT_UNARY = {"relu": ops.relu, "gelu": ops.gelu, "exp": ops.exp, "sigmoid": ops.sigmoid}


@fuzz_settings(ci=8)
@given(
    kind=st.sampled_from(["gemm", "eltwise"]),
    m=sizes(100),
    n=sizes(100),
    k=sizes(100),
    transpose_b=st.booleans(),
    transpose_a=st.booleans(),
    bias=st.booleans(),
    act=st.sampled_from(sorted(TT_EPILOGUE)),
    binop=st.sampled_from(["add", "sub", "mul"]),
    unary=st.sampled_from([None, *sorted(TT_UNARY)]),
    scale=st.sampled_from([None, 0.5, -0.25]),  # small: exp after them must stay well conditioned in bf16
    residual=st.booleans(),
    batch=st.sampled_from([1, 2]),  # 2: a batched A over a shared weight (one GEMM over both entries' rows)
    seed=st.integers(0, 2**16),
)
def test_frontend_kernels_on_the_tenstorrent_emulator(
    tt_dirs, kind, m, n, k, transpose_b, transpose_a, bias, act, binop, unary, scale, residual, batch, seed
):
    """The same kind of kernels, compiled with ts.compile for Tenstorrent and run in the emulator."""
    from tessera_tvm.target.tt.emulate import run_plan

    count("tenstorrent via ts.compile")
    bf = ts.bf16
    rng = np.random.default_rng(seed)
    if kind == "gemm":
        w_dims = ("N", "K") if transpose_b else ("K", "N")
        a_dims = ("K", "M") if transpose_a else ("M", "K")
        lead = ("Z",) if batch > 1 and not (transpose_a and k % 32) else ()  # a batched A^T needs whole K tiles
        batch = batch if lead else 1

        @ts.kernel
        def tt_kernel(
            A: Tensor[(*lead, *a_dims, bf)],
            W: Tensor[w_dims[0], w_dims[1], bf],
            b: Tensor["N", bf],
            R: Tensor[(*lead, "M", "N", bf)],
        ):
            y = ops.matmul(A, W, transpose_a=transpose_a, transpose_b=transpose_b)
            y = y * scale if scale is not None else y  # the SFPU's binop with a scalar
            y = y + b if bias else y
            y = y + R if residual else y * 1.0  # a residual tile, else one more scalar op
            return TT_EPILOGUE[act](y)

        zb = (batch,) if batch > 1 else ()
        arrays = (
            random_array(rng, (*zb, *((k, m) if transpose_a else (m, k))), bf),
            random_array(rng, (n, k) if transpose_b else (k, n), bf, 1 / math.sqrt(k)),
            random_array(rng, (n,), bf),
            random_array(rng, (*zb, m, n), bf),
        )
        shapes = {"M": m, "N": n, "K": k, **({"Z": batch} if batch > 1 else {})}
    else:

        @ts.kernel
        def tt_kernel(A: Tensor["M", "N", bf], B: Tensor["M", "N", bf]):
            y = BINARY[binop](A, B)
            y = 1.0 - y * scale if scale is not None else y  # scalars on either side
            return TT_UNARY[unary](y) if unary else y

        arrays = (random_array(rng, (m, n), bf), random_array(rng, (m, n), bf))
        shapes = {"M": m, "N": n}
    out_root, emu_cache = tt_dirs
    dump = out_root / f"frontend_{kind}_{m}_{n}_{k}_{seed}"
    compiled = ts.compile(tt_kernel, target="tenstorrent", shapes=shapes, dump=["target"], dump_dir=dump)
    (fused,) = compiled.artifacts.values()
    plan_path = Path(fused["plan"])
    plan = json.loads(plan_path.read_text())
    names = [nm for nm, _ in tt_kernel.params]
    inputs = {  # each as the kernel's 2-D view of it (a batched tensor's rows one after the other)
        b["name"]: arrays[names.index(b["name"])].astype(np.float32).reshape(b["shape"])
        for b in plan["buffers"]
        if b["role"] == "input"
    }
    result = run_plan(plan, plan_path.parent, inputs, cache_dir=emu_cache)
    (out_buf,) = [b["name"] for b in plan["buffers"] if b["role"] == "output"]
    ref = np.asarray(tt_kernel.reference(*arrays)).astype(np.float64)
    got = np.asarray(result[out_buf], dtype=np.float64).reshape(ref.shape)
    rtol, atol = TOLERANCE[bf]
    bad = np.abs(got - ref) > atol + rtol * np.abs(ref)
    assert not bad.any(), f"{tt_kernel.name} {shapes}: {bad.sum()} of {bad.size} off, max {np.abs(got - ref).max()}"


# --------------------------------------------------------------------------- Tenstorrent row ops, attention

ROW_KINDS = ["softmax", "layer_norm", "rms_norm", "max", "mean"]


@fuzz_settings(ci=6)
@given(
    kind=st.sampled_from(ROW_KINDS),
    m=sizes(80),
    n=sizes(150),
    # all negative rows: a max that saw the zero padding would show; rows far from zero: a layer
    # norm whose bf16 mean were not corrected would be off by 2**-9 |mean| / std
    shift=st.sampled_from([0.0, -8.0, 100.0]),
    seed=st.integers(0, 2**16),
)
def test_row_ops_on_the_tenstorrent_emulator(tt_dirs, kind, m, n, shift, seed):
    """Softmax, the norms and row reductions at any row length (the max masks the padded columns)."""
    count("tenstorrent row ops")
    bf = ts.bf16
    rng = np.random.default_rng(seed)

    @ts.kernel
    def tt_kernel(x: Tensor["M", "N", bf], w: Tensor["N", bf], b: Tensor["N", bf]):
        if kind == "softmax":
            return ops.softmax(x, axis=-1)
        if kind == "layer_norm":
            return ops.layer_norm(x, w, b)
        if kind == "rms_norm":
            return ops.rms_norm(x, w)
        return getattr(ops, kind)(x, axis=-1)

    arrays = (
        (random_array(rng, (m, n), ts.f32) + shift).astype(bf.numpy),
        random_array(rng, (n,), bf),
        random_array(rng, (n,), bf),
    )
    compiled = ts.compile(tt_kernel, target="tenstorrent", shapes={"M": m, "N": n})
    got = np.asarray(compiled.emulate(*arrays, cache_dir=tt_dirs[1]), dtype=np.float64)
    ref = np.asarray(tt_kernel.reference(*arrays), dtype=np.float64)
    rtol, atol = TOLERANCE[bf]
    scale = np.abs(ref).max() if kind in ("softmax", "max", "mean") else 1.0  # row-wise values of one size
    tol = atol * scale + rtol * np.abs(ref)
    bad = np.abs(got - ref) > tol
    assert not bad.any(), f"{kind} {m}x{n}: {bad.sum()} of {bad.size} off, max {np.abs(got - ref).max()}"


@fuzz_settings(ci=4)
@given(
    b=st.integers(1, 2),
    h_kv=st.integers(1, 2),
    group=st.integers(1, 2),
    q_blocks=st.integers(1, 3),
    kv_blocks=st.integers(1, 3),
    d=st.sampled_from([32, 64]),
    causal=st.booleans(),
    align=st.sampled_from(["top_left", "bottom_right"]),
    scale=st.sampled_from([None, 0.05]),
    seed=st.integers(0, 2**16),
)
def test_flash_attention_on_the_tenstorrent_emulator(
    tt_dirs, b, h_kv, group, q_blocks, kv_blocks, d, causal, align, scale, seed
):
    """Flash attention (one kernel, running max and sum carried through CBs) at random head counts,
    sequence lengths of whole 32-row blocks, head dims, masks and scales."""
    count("tenstorrent attention")
    bf = ts.bf16
    s_q, s_kv = 32 * q_blocks, 32 * kv_blocks
    if causal and align == "bottom_right" and s_kv < s_q:
        s_kv = s_q  # every query sees a key: rows that see none are the CPU's case, not this one

    @ts.kernel
    def tt_kernel(
        Q: Tensor["B", "H", "Sq", "D", bf], K: Tensor["B", "Hk", "Skv", "D", bf], V: Tensor["B", "Hk", "Skv", "D", bf]
    ):
        return ops.flash_attention(Q, K, V, causal=causal, scale=scale, causal_align=align)

    rng = np.random.default_rng(seed)
    h = h_kv * group
    arrays = (
        random_array(rng, (b, h, s_q, d), bf),
        random_array(rng, (b, h_kv, s_kv, d), bf),
        random_array(rng, (b, h_kv, s_kv, d), bf),
    )
    shapes = {"B": b, "H": h, "Hk": h_kv, "Sq": s_q, "Skv": s_kv, "D": d}
    compiled = ts.compile(tt_kernel, target="tenstorrent", shapes=shapes)
    got = np.asarray(compiled.emulate(*arrays, cache_dir=tt_dirs[1]), dtype=np.float64)
    ref = np.asarray(tt_kernel.reference(*arrays), dtype=np.float64)
    tol = 2.0**-6 * np.abs(ref).max() + 2.0**-7 * np.abs(ref)  # P and the rescaled sums are packed to bf16
    bad = np.abs(got - ref) > tol
    assert not bad.any(), f"{shapes} causal={causal} {align}: {bad.sum()} off, max {np.abs(got - ref).max()}"
