"""Generated kernels + plan of every core run in the tt-metal emulator and match numpy.

Numerics (as in test_emulator.py): inputs are random normals rounded to bfloat16 in DRAM; the
emulator computes in float32 and rounds once to bfloat16 when it packs a tile, so every check
allows ``2**-8 * |ref|`` plus, for a K accumulation, ``gamma_K * (|A| @ |B|)`` counted three times
(emulator and numpy sum in different orders). Each test states any extra term. Every run also
checks the protocol: CB pages pushed == popped on every core, every output tile written once,
L1 per core = the plan's circular buffers.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

from tessera_tvm.target.tt import round_to_bf16
from tessera_tvm.target.tt.emulate import run_plan

from .codegen_cases import kernel_dir, lowered, numpy_inputs, plan_of
from .test_emulator import EPS32, U_BF16, assert_within, check_protocol, gelu_tanh, gemm_ref

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

_erf = np.vectorize(math.erf)


def gelu_erf(x):
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def bf16(x):
    return round_to_bf16(np.asarray(x, dtype=np.float32)).astype(np.float64)


@pytest.fixture(scope="module")
def run(tt_cache):
    def _run(art, seed=0, scale=1.0):
        plan = plan_of(art)
        ins = numpy_inputs(plan, seed, scale)
        result = run_plan(plan, kernel_dir(art), ins, cache_dir=tt_cache)
        check_protocol(result, plan)
        return ins, result

    return _run


@pytest.mark.parametrize("M, N, K", [(64, 96, 128), (50, 70, 45), (1, 33, 31)], ids=["tiles", "padded", "tiny"])
def test_gemm_bf16(run, M, N, K):
    ins, result = run(lowered("gemm", M, N, K))
    ref, acc_err = gemm_ref(ins["A"], ins["B"])
    assert_within(result["C"], ref, U_BF16 * np.abs(ref) + 3 * acc_err + 1e-30, f"gemm {M}x{N}x{K}")


def test_gemm_with_transposed_b(run):
    ins, result = run(lowered("gemm", 64, 64, 96, "bfloat16", "float32", True))
    ref, acc_err = gemm_ref(ins["A"], ins["B"].T)
    assert_within(result["C"], ref, U_BF16 * np.abs(ref) + 3 * acc_err, "gemm A @ B^T")


@pytest.mark.parametrize("act, fn", [("gelu", gelu_erf), ("gelu_tanh", gelu_tanh)], ids=["erf", "tanh"])
def test_gemm_bias_gelu_epilogue(run, act, fn):
    ins, result = run(lowered("gemm_bias_act", 50, 70, 45, act), seed=11)
    mm, acc_err = gemm_ref(ins["A"], ins["B"])
    # A@B is packed to a bf16 CB before the epilogue (model that rounding; the emulator's float32 sum may
    # sit on the other side of a rounding boundary: one bf16 ulp, which gelu (|gelu'| <= 1.13) carries)
    ref = fn(bf16(mm) + bf16(ins["bias"])[None, :])
    tol = U_BF16 * np.abs(ref) + 1.13 * (2**-7 * np.abs(mm) + 3 * acc_err) + 1e-6
    assert_within(result["C"], ref, tol, f"gelu(A @ B + bias) [{act}]")


def test_gemm_relu_epilogue_in_dst(run):
    ins, result = run(lowered("gemm_relu", 64, 96, 64), seed=3)
    mm, acc_err = gemm_ref(ins["A"], ins["B"])
    ref = np.maximum(mm, 0.0)
    assert_within(result["C"], ref, U_BF16 * np.abs(ref) + 3 * acc_err + 1e-30, "relu(A @ B)")


@pytest.mark.parametrize("op, shape", [("add", (64, 128)), ("mul", (45, 70)), ("sub", (33, 64))])
def test_elementwise_binary(run, op, shape):
    ins, result = run(lowered("eltwise", *shape, op), seed=13)
    ref = {"add": np.add, "mul": np.multiply, "sub": np.subtract}[op](bf16(ins["A"]), bf16(ins["B"]))
    # one float32 rounding, then the bf16 rounding
    assert_within(result["C"], ref, (U_BF16 + 2 * EPS32) * np.abs(ref) + 1e-30, f"A {op} B")


def test_float32_buffers_are_not_rounded_to_bf16(run):
    ins, result = run(lowered("eltwise", 45, 70, "mul", "float32"), seed=41)
    ref = ins["A"].astype(np.float64) * ins["B"]
    assert_within(result["C"], ref, 2 * EPS32 * np.abs(ref) + 1e-30, "float32 A * B")  # one float32 rounding


def test_unary_exp(run):
    ins, result = run(lowered("unary", 64, 96, "exp"), seed=17)
    ref = np.exp(bf16(ins["X"]))
    assert_within(result["Y"], ref, (U_BF16 + 8 * EPS32) * ref, "exp")  # std::exp: a few float32 ulp


@pytest.mark.parametrize("act, fn", [("gelu", gelu_erf), ("gelu_tanh", gelu_tanh)], ids=["erf", "tanh"])
def test_unary_gelu_not_a_tile_multiple(run, act, fn):
    ins, result = run(lowered("unary", 33, 100, act), seed=19, scale=2.0)
    assert result["Y"].shape == (33, 100)
    ref = fn(bf16(ins["X"]))
    # float32 erf/tanh are ~1e-7 absolute (cancellation in 1 + erf for x << 0)
    assert_within(result["Y"], ref, U_BF16 * np.abs(ref) + 1e-6, act)


def test_binary_then_sfpu_and_a_chain_of_two_fpu_ops(run):
    ins, result = run(lowered("add_relu", 64, 64), seed=23)
    ref = np.maximum(bf16(ins["A"]) + bf16(ins["B"]), 0.0)
    assert_within(result["C"], ref, (U_BF16 + 2 * EPS32) * np.abs(ref) + 1e-30, "relu(A + B)")
    ins, result = run(lowered("mul_add", 64, 96), seed=29)
    # A*B is packed to a bf16 intermediate CB before the add: round it like the kernel does
    ref = bf16(bf16(ins["A"]) * bf16(ins["B"])) + bf16(ins["C"])
    prod = np.abs(bf16(ins["A"]) * bf16(ins["B"]))
    assert_within(result["D"], ref, U_BF16 * (np.abs(ref) + prod) + 1e-30, "A * B + C")


def test_two_sfpu_ops_and_a_plain_copy(run):
    art = lowered("exp_relu", 64, 96)
    compute = art.artifacts["compute"].read_text().split("for (uint32_t tile_id")[1]
    assert compute.index("relu_tile_init();") < compute.index("relu_tile(0);") < compute.index("exp_tile_init();")
    ins, result = run(art, seed=43)
    ref = np.exp(np.maximum(bf16(ins["X"]), 0.0))
    assert_within(result["Y"], ref, (U_BF16 + 8 * EPS32) * ref, "exp(relu(X))")
    ins, result = run(lowered("copy_through", 50, 70), seed=47)
    assert np.array_equal(result["C"], round_to_bf16(ins["A"]))


def test_multi_core_over_the_whole_wormhole_grid(run):
    art = lowered("gemm", 256, 288, 64)  # 8 x 9 = 72 output tiles over all 64 worker cores
    plan = plan_of(art)
    assert len(plan["cores"]) == 64 and plan["grid"] == [8, 8]
    assert sorted(tuple(c["core"]) for c in plan["cores"]) == [(x, y) for x in range(8) for y in range(8)]
    assert [c["tiles"][1] for c in plan["cores"]] == [2] * 8 + [1] * 56
    ins, result = run(art, seed=5)
    ref, acc_err = gemm_ref(ins["A"], ins["B"])
    assert_within(result["C"], ref, U_BF16 * np.abs(ref) + 3 * acc_err, "gemm on 64 cores")
    packed = {tuple(c["core"]): c["kernels"]["compute"]["packed_tiles"] for c in result.counters["cores"]}
    assert packed == {tuple(c["core"]): c["tiles"][1] for c in plan["cores"]}


def test_multi_core_elementwise_over_the_whole_grid(run):
    ins, result = run(lowered("eltwise", 256, 320, "add"), seed=31)  # 80 tiles on 64 cores
    ref = bf16(ins["A"]) + bf16(ins["B"])
    assert_within(result["C"], ref, (U_BF16 + 2 * EPS32) * np.abs(ref) + 1e-30, "A + B on 64 cores")


def test_blackhole_grid(run):
    art = lowered("gemm_bias_act", 96, 160, 64, "gelu", arch="blackhole")  # 15 tiles on a 14x10 grid's first row+
    plan = plan_of(art)
    assert plan["arch"] == "blackhole" and plan["grid"] == [14, 2] and len(plan["cores"]) == 15
    ins, result = run(art, seed=37)
    assert result.counters["program"]["dram_banks"] == 8
    mm, acc_err = gemm_ref(ins["A"], ins["B"])
    ref = gelu_erf(bf16(mm) + bf16(ins["bias"])[None, :])
    tol = U_BF16 * np.abs(ref) + 1.13 * (2**-7 * np.abs(mm) + 3 * acc_err) + 1e-6
    assert_within(result["C"], ref, tol, "blackhole gemm + bias + gelu")
