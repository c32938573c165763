"""The tt-metal emulator runs the reference plans and matches numpy; it enforces the CB/DST
protocol, detects deadlocks and stalls, and the plan validator rejects broken plans.

Numerics. Inputs are random normals rounded to bfloat16 (the DRAM format); the reference is
computed in float32/float64 from those bf16 values. The emulator computes in float32 and rounds
each result once to bf16 when packing (round to nearest even), so every comparison allows
``2**-8 * |ref|`` (bf16 unit roundoff: 8 significand bits) plus, where an op accumulates, the
float32 summation error bound ``gamma_K * (|A| @ |B|)`` with ``gamma_K = K * 2**-24`` counted twice
(emulator and numpy sum in different orders). Each test states any extra term.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from tessera_tvm.errors import TesseraError
from tessera_tvm.target.tt import (
    bf16_bits_to_float,
    f16_bits_to_float,
    float_to_bf16_bits,
    float_to_f16_bits,
    round_to_bf16,
    round_to_f16,
    tilize,
    untilize,
)
from tessera_tvm.target.tt.emulate import (
    EmulatorError,
    EmulatorResult,
    KernelCompileError,
    PlanError,
    load_plan,
    plan_schema,
    run_plan,
    validate_plan,
)

from . import plan_builders as pb

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

U_BF16 = 2.0**-8  # unit roundoff of bfloat16
U_F16 = 2.0**-11  # unit roundoff of IEEE half
EPS32 = 2.0**-24  # unit roundoff of float32


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def bf16_inputs(plan: dict, seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        b["name"]: (scale * rng.standard_normal(b["shape"])).astype(np.float32)
        for b in plan["buffers"]
        if b["role"] == "input"
    }


def assert_within(out: np.ndarray, ref: np.ndarray, tol: np.ndarray | float, what: str) -> None:
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    err = np.abs(out - ref)
    bad = err > tol
    if bad.any():
        i = np.unravel_index(np.argmax(err - tol), err.shape)
        t = tol[i] if np.ndim(tol) else tol
        pytest.fail(
            f"{what}: {bad.sum()} element(s) out of tolerance; worst at {i}: got {out[i]}, want {ref[i]} (tol {t})"
        )


def gemm_ref(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reference product of the bf16-rounded inputs and its float32 accumulation error bound."""
    a16, b16 = round_to_bf16(a).astype(np.float64), round_to_bf16(b).astype(np.float64)
    k = a.shape[1]
    return a16 @ b16, 2 * k * EPS32 * (np.abs(a16) @ np.abs(b16))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def check_protocol(result: EmulatorResult, plan: dict) -> None:
    """CB pushes == pops on every core, every output tile written once, L1 = sum of CB sizes."""
    for row in result.cb_balance():
        assert row["pushed"] == row["popped"], row
        assert row["pushed"] > 0 or row["cb"] not in (0, 16), row
    for buf in plan["buffers"]:
        if buf["role"] == "output":
            writes = result.page_writes(buf["name"])
            assert writes == [1] * len(writes), (buf["name"], writes)
    l1 = sum(cb["page_size"] * cb["num_pages"] for cb in plan["circular_buffers"])
    assert set(result.l1_bytes().values()) == {l1}
    assert sorted(result.l1_bytes()) == sorted(tuple(c["core"]) for c in plan["cores"])


@pytest.fixture(scope="module")
def run(kernels_dir, tt_cache):
    def _run(plan, inputs, **kw):
        return run_plan(plan, kernels_dir, inputs, cache_dir=tt_cache, **kw)

    return _run


# ---------------------------------------------------------------------------------------------
# formats and layout
# ---------------------------------------------------------------------------------------------


def test_bf16_round_to_nearest_even():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-9, -2.5, np.inf, 3.0e38], dtype=np.float32)
    # halfway cases go to the even neighbour; just-above-half rounds up
    want = np.array([1.0, 1.0, 1.0 + 4 * 2**-8, 1.0, -2.5, np.inf, np.float32(3.0e38)], dtype=np.float32)
    assert np.array_equal(round_to_bf16(x)[:6], want[:6])
    assert abs(round_to_bf16(x)[6] - 3.0e38) / 3.0e38 < 2**-8
    assert np.isnan(round_to_bf16(np.array([np.nan], dtype=np.float32)))[0]
    assert bf16_bits_to_float(float_to_bf16_bits(np.array([0.15625], np.float32)))[0] == 0.15625


def test_f16_round_to_nearest_even():
    x = np.array(
        [1.0 + 2**-10, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 65504.0, 65519.99, 65520.0, 2**-24, 2**-25, 3 * 2**-25, -0.0],
        dtype=np.float32,
    )
    # 1 + 2**-10 is a half but not a bfloat16; ties go to the even neighbour, 65520 (halfway from the
    # largest half to 2**16) to inf, subnormals hold multiples of 2**-24
    want = [1.0 + 2**-10, 1.0, 1.0 + 2**-9, 65504.0, 65504.0, np.inf, 2**-24, 0.0, 2**-23, -0.0]
    assert np.array_equal(round_to_f16(x), np.array(want, dtype=np.float32))
    assert round_to_bf16(x[:1])[0] == 1.0 != round_to_f16(x[:1])[0]
    assert float_to_f16_bits(x)[[0, 5, 6, 9]].tolist() == [0x3C01, 0x7C00, 0x0001, 0x8000]
    assert np.isnan(round_to_f16(np.array([np.nan], dtype=np.float32)))[0]
    assert f16_bits_to_float(np.array([0x3555, 0xFBFF], np.uint16)).tolist() == [0.333251953125, -65504.0]


def test_tilize_face_layout_and_round_trip():
    x = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)
    t = tilize(x)
    assert np.array_equal(t[:16], x[0, :16])  # face 0 row 0
    assert np.array_equal(t[16:32], x[1, :16])  # face 0 row 1
    assert np.array_equal(t[256:272], x[0, 16:])  # face 1 row 0
    assert np.array_equal(t[512:528], x[16, :16])  # face 2 row 0
    y = np.random.default_rng(1).standard_normal((45, 70)).astype(np.float32)
    ty = tilize(y)
    assert ty.size == 64 * 96
    assert np.array_equal(untilize(ty, (45, 70)), y)
    v = np.arange(40, dtype=np.float32)
    assert np.array_equal(untilize(tilize(v), (40,)), v)


# ---------------------------------------------------------------------------------------------
# reference plans: results match numpy
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gemm_single_core", "gemm_single_core_padded", "gemm_multi_core", "gemm_full_grid"])
def test_gemm(run, plans_dir, name):
    plan = load_plan(plans_dir / f"{name}.json")
    ins = bf16_inputs(plan)
    result = run(plans_dir / f"{name}.json", ins)
    ref, acc_err = gemm_ref(ins["A"], ins["B"])
    assert_within(result["C"], ref, U_BF16 * np.abs(ref) + 3 * acc_err + 1e-30, name)
    check_protocol(result, plan)
    kt = -(-ins["A"].shape[1] // 32)
    for core, spec in zip(result.counters["cores"], plan["cores"], strict=True):
        compute = core["kernels"]["compute"]
        assert compute["packed_tiles"] == spec["tiles"][1]
        assert compute["matmul_tiles"] == spec["tiles"][1] * kt


def test_gemm_padding_is_masked_out(run, plans_dir):
    """Shapes that are not multiples of 32: K padding contributes zeros, M/N padding is dropped."""
    plan = load_plan(plans_dir / "gemm_single_core_padded.json")
    assert plan["buffers"][0]["shape"] == [50, 70] and plan["buffers"][0]["padded_shape"] == [64, 96]
    ins = bf16_inputs(plan, seed=3)
    ins["A"] += 100.0  # large values: any padding leaking into K would be visible
    result = run(plan, ins)
    assert result["C"].shape == (50, 45)
    ref, acc_err = gemm_ref(ins["A"], ins["B"])
    assert_within(result["C"], ref, U_BF16 * np.abs(ref) + 3 * acc_err, "padded gemm")


def test_gemm_multi_core_assigns_every_tile_once(run, plans_dir):
    plan = load_plan(plans_dir / "gemm_multi_core.json")
    assert len(plan["cores"]) == 8
    result = run(plan, bf16_inputs(plan, seed=5))
    writes = result.page_writes("C")
    assert len(writes) == 5 * 6 and all(w == 1 for w in writes)
    # contiguous row-major split: 30 tiles over 8 cores -> 4,4,4,4,4,4,3,3
    assert [c["tiles"][1] for c in plan["cores"]] == [4, 4, 4, 4, 4, 4, 3, 3]
    packed = {tuple(c["core"]): c["kernels"]["compute"]["packed_tiles"] for c in result.counters["cores"]}
    assert packed == {tuple(c["core"]): c["tiles"][1] for c in plan["cores"]}


def test_gemm_on_blackhole(run, tmp_path):
    """Same kernels on the other arch row: 8 DRAM banks instead of 12, a 3x2 corner of 14x10."""
    plan = pb.gemm_plan("gemm_blackhole", 96, 64, 160, grid=(3, 2), arch="blackhole")
    ins = bf16_inputs(plan, seed=7)
    result = run(plan, ins)
    assert result.counters["program"]["dram_banks"] == 8
    ref, acc_err = gemm_ref(ins["A"], ins["B"])
    assert_within(result["C"], ref, U_BF16 * np.abs(ref) + 3 * acc_err, "blackhole gemm")
    check_protocol(result, plan)


@pytest.mark.parametrize("name", ["gemm_bias_gelu", "gemm_bias_gelu_multi_core"])
def test_gemm_bias_gelu(run, plans_dir, name):
    plan = load_plan(plans_dir / f"{name}.json")
    ins = bf16_inputs(plan, seed=11)
    result = run(plan, ins)
    mm, acc_err = gemm_ref(ins["A"], ins["B"])
    # The kernel packs A@B to a bf16 CB before the epilogue: model that rounding in the reference;
    # the emulator's float32 A@B may sit on the other side of a bf16 rounding boundary (one bf16
    # ulp, 2**-7 relative), which gelu (|gelu'| <= 1.13) carries to the output.
    acc16 = round_to_bf16(mm.astype(np.float32)).astype(np.float64)
    bias16 = round_to_bf16(ins["bias"]).astype(np.float64)
    ref = gelu_tanh(acc16 + bias16[None, :])
    tol = U_BF16 * np.abs(ref) + 1.13 * (2**-7 * np.abs(mm) + 3 * acc_err) + 1e-6
    assert_within(result["C"], ref, tol, name)
    check_protocol(result, plan)


@pytest.mark.parametrize("name, op", [("eltwise_add", np.add), ("eltwise_mul", np.multiply)])
def test_eltwise_binary(run, plans_dir, name, op):
    plan = load_plan(plans_dir / f"{name}.json")
    ins = bf16_inputs(plan, seed=13)
    result = run(plan, ins)
    ref = op(round_to_bf16(ins["A"]).astype(np.float64), round_to_bf16(ins["B"]).astype(np.float64))
    # one float32 rounding (2**-24) then the bf16 rounding
    assert_within(result["C"], ref, (U_BF16 + 2 * EPS32) * np.abs(ref) + 1e-30, name)
    check_protocol(result, plan)


def test_unary_exp(run, plans_dir):
    plan = load_plan(plans_dir / "unary_exp.json")
    ins = bf16_inputs(plan, seed=17)
    result = run(plan, ins)
    ref = np.exp(round_to_bf16(ins["X"]).astype(np.float64))
    # std::exp in float32 is within a few float32 ulp; then the bf16 rounding
    assert_within(result["Y"], ref, (U_BF16 + 8 * EPS32) * ref, "exp")
    check_protocol(result, plan)


def test_unary_gelu_not_tile_multiple(run, plans_dir):
    plan = load_plan(plans_dir / "unary_gelu.json")
    assert plan["buffers"][0]["shape"] == [33, 100]
    ins = bf16_inputs(plan, seed=19, scale=2.0)
    result = run(plan, ins)
    assert result["Y"].shape == (33, 100)
    ref = gelu_tanh(round_to_bf16(ins["X"]))
    # float32 tanh/poly error is ~1e-7 absolute (cancellation in 1 + tanh for x << 0)
    assert_within(result["Y"], ref, U_BF16 * np.abs(ref) + 1e-6, "gelu")
    check_protocol(result, plan)


def test_unary_relu_exact(run, plans_dir):
    plan = load_plan(plans_dir / "unary_relu.json")
    ins = bf16_inputs(plan, seed=23)
    result = run(plan, ins)
    assert np.array_equal(result["Y"], np.maximum(round_to_bf16(ins["X"]), 0.0))
    check_protocol(result, plan)


def _fp32_unary_plan() -> dict:
    plan = pb.unary_plan("unary_exp_fp32", "exp", [40, 64])
    for buf in plan["buffers"]:
        buf.update(dtype="float32", page_size=4096)
    for cb in plan["circular_buffers"]:
        cb.update(data_format="Float32", page_size=4096)
    plan["kernels"]["compute"]["fp32_dest_acc_en"] = True
    return plan


def test_float32_path_and_fp32_dst_capacity(run, kernels_dir, tt_cache, tmp_path):
    """Float32 DRAM/CB data and fp32_dest_acc_en: no bf16 rounding anywhere; DST holds 8 tiles."""
    plan = _fp32_unary_plan()
    ins = bf16_inputs(plan, seed=29)
    result = run(plan, ins)
    ref = np.exp(ins["X"].astype(np.float64))
    assert_within(result["Y"], ref, 8 * EPS32 * ref, "fp32 exp")  # std::exp: a few float32 ulp
    check_protocol(result, plan)
    kdir = _mutated_kernel_dir(
        kernels_dir, tmp_path, "compute_exp.cpp", "copy_tile(cb_in, 0, 0)", "copy_tile(cb_in, 0, 8)"
    )
    with pytest.raises(
        EmulatorError, match=r"copy_tile: DST index 8 is out of range: DST holds 8 tiles \(fp32_dest_acc_en\)"
    ):
        run_plan(plan, kdir, ins, cache_dir=tt_cache)
    with pytest.raises(EmulatorError, match=r"DST holds 4 tiles"):
        run_plan(plan, kdir, ins, cache_dir=tt_cache, dst_tiles=4)


def _half_rounding_probes() -> np.ndarray:
    """float32 values at every finite half, at every tie between neighbours, one float32 ulp either
    side of each tie (both signs), at the overflow and subnormal edges, plus random float32 bit patterns
    (NaN and inf among them)."""
    halves = f16_bits_to_float(np.arange(0x7C00, dtype=np.uint16)).astype(np.float64)  # 0 .. 65504
    ulp = np.diff(np.append(halves, 65536.0))  # the step above each half (65504 -> 2**16 past the top)
    ties = (halves + ulp / 2).astype(np.float32)  # 12 significant bits: exact in float32
    below, above = np.nextafter(ties, np.float32(0)), np.nextafter(ties, np.float32(np.inf))
    magnitudes = np.concatenate(
        [halves.astype(np.float32), ties, below, above, np.array([np.inf, np.nan, 1e30, 1e-30], np.float32)]
    )
    noise = np.random.default_rng(31).integers(0, 2**32, 2**15, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([magnitudes, -magnitudes, noise]).astype(np.float32)
    return np.concatenate([values, np.zeros(-values.size % 1024, np.float32)]).reshape(-1, 1024)


def test_packing_to_float16_rounds_to_nearest_even(run):
    """Float32 CB -> DST -> Float16 CB: every pack is one IEEE round to nearest even (numpy's float16
    conversion), bit for bit: ties, the subnormals, overflow to inf, signed zeros, NaN."""
    x = _half_rounding_probes()
    plan = pb.convert_plan("pack_f16", list(x.shape), "float32", "float16", grid=(4, 1))
    result = run(plan, {"X": x})
    got, want = float_to_f16_bits(result["Y"]), float_to_f16_bits(x)
    nan = np.isnan(x)
    assert np.isnan(result["Y"][nan]).all()
    wrong = np.flatnonzero((got != want) & ~nan)
    assert wrong.size == 0, [f"{x.flat[i]!r}: got 0x{got.flat[i]:04x}, want 0x{want.flat[i]:04x}" for i in wrong[:8]]
    check_protocol(result, plan)


def test_unpacking_float16_is_exact(run):
    """Float16 CB -> DST -> Float32 CB: every one of the 65536 half bit patterns arrives as its exact value."""
    x = np.arange(2**16, dtype=np.uint16).view(np.float16).reshape(64, 1024)
    plan = pb.convert_plan("unpack_f16", [64, 1024], "float16", "float32", grid=(2, 1))
    y = run(plan, {"X": x})["Y"]
    nan = np.isnan(x)
    assert np.isnan(y[nan]).all()
    assert np.array_equal(y[~nan].view(np.uint32), x[~nan].astype(np.float32).view(np.uint32))


def test_float16_eltwise_mul_is_one_rounding(run):
    """Float16 DRAM and CBs end to end: a product of two halves is exact in float32, so each output
    is that product rounded once to half, bit for bit, from subnormal results to overflow."""
    halves = {"A": "float16", "B": "float16", "C": "float16"}
    plan = pb.retyped(pb.eltwise_plan("mul_f16", "mul", [45, 70]), halves, {0: "Float16", 1: "Float16", 16: "Float16"})
    rng = np.random.default_rng(37)
    a, b = (rng.choice([-1, 1], (45, 70)) * 2.0 ** rng.uniform(-14, 9, (45, 70)) for _ in range(2))
    result = run(plan, {"A": a, "B": b})
    a16, b16 = (round_to_f16(v).astype(np.float64) for v in (a, b))
    want = round_to_f16(a16 * b16)
    assert (np.abs(want) < 2**-14).any() and np.isinf(want).any()  # the probes reach both edges
    assert np.array_equal(float_to_f16_bits(result["C"]), float_to_f16_bits(want))
    check_protocol(result, plan)


# ---------------------------------------------------------------------------------------------
# failures: deadlock, stall, L1 budget, kernel bugs the emulator catches
# ---------------------------------------------------------------------------------------------


def test_deadlock_is_reported_not_hung(run, plans_dir):
    plan_path = plans_dir / "deadlock.json"
    t0 = time.monotonic()
    with pytest.raises(EmulatorError) as info:
        run(plan_path, bf16_inputs(load_plan(plan_path)), timeout_s=30)
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert elapsed < 10, f"deadlock took {elapsed:.1f} s to report"
    assert "deadlock on core (0,0)" in msg
    assert "compute kernel 'compute_deadlock.cpp' waits in cb_wait_front(cb 5" in msg
    assert "deadlock.json" in msg


def test_l1_over_budget_is_rejected(run, plans_dir):
    with pytest.raises(PlanError) as info:
        run(plans_dir / "l1_over_budget.json", bf16_inputs(load_plan(plans_dir / "l1_over_budget.json")))
    msg = str(info.value)
    assert "L1 over budget" in msg and "1499136" in msg and "CB 0: 800 x 2048 B" in msg


def _mutated_kernel_dir(kernels_dir: Path, tmp_path: Path, source: str, old: str, new: str) -> Path:
    for f in kernels_dir.glob("*.cpp"):
        shutil.copy(f, tmp_path / f.name)
    text = (tmp_path / source).read_text()
    assert old in text, (source, old)
    (tmp_path / source).write_text(text.replace(old, new, 1))
    return tmp_path


MUTATIONS = [
    # (plan, kernel, old, new, expected fragment of the error)
    (
        "gemm_single_core",
        "compute_gemm.cpp",
        "        tile_regs_commit();\n\n        tile_regs_wait();\n",
        "",
        "pack_tile: DST is acquired by math; packing needs tile_regs_commit then tile_regs_wait",
    ),
    (
        "gemm_single_core",
        "compute_gemm.cpp",
        "matmul_tiles(cb_a, cb_b, 0, 0, 0, false)",
        "matmul_tiles(cb_a, cb_b, 0, 0, 16, false)",
        "matmul_tiles: DST index 16 is out of range: DST holds 8 tiles (fp32_dest_acc_en)",
    ),
    (
        "gemm_single_core",
        "compute_gemm.cpp",
        "    mm_init(cb_a, cb_b, cb_out);\n",
        "",
        "matmul_tiles: no hardware init before the first math call",
    ),
    (
        "eltwise_add",
        "compute_eltwise_add.cpp",
        "    add_tiles_init(cb_a, cb_b);\n",
        "",
        "add_tiles: the FPU is configured for nothing",
    ),
    ("unary_exp", "compute_exp.cpp", "    exp_tile_init();\n", "", "exp_tile: the SFPU is initialised for nothing"),
    (
        "convert_f32_to_f16",
        "compute_copy.cpp",
        "    init_sfpu(cb_in, cb_out);\n",
        "    init_sfpu(cb_in, cb_in);\n",
        "pack_tile: packs into CB 16 (Float16) but the packer was configured by unary_op_init_common for CB 0 (Float32)",
    ),
    (
        "unary_exp",
        "reader_unary.cpp",
        "        noc_async_read_barrier();\n",
        "",
        "call noc_async_read_barrier() before cb_push_back",
    ),
    (
        "unary_exp",
        "writer_tiles.cpp",
        "        noc_async_write_barrier();\n",
        "",
        "call noc_async_write_barrier() before cb_pop_front",
    ),
    (
        "unary_exp",
        "reader_unary.cpp",
        "        cb_reserve_back(cb_in, 1);\n",
        "",
        "outside the 0 page(s) reserved at its back",
    ),
    ("unary_exp", "compute_exp.cpp", "        cb_pop_front(cb_in, 1);\n", "", "deadlock on core (0,0)"),
    (
        "gemm_single_core",
        "writer_tiles.cpp",
        "noc_async_write_tile(t, dst,",
        "noc_async_write_tile(t + 1, dst,",
        "is page 4 of buffer 'C', which has only 4 pages",
    ),
]


@pytest.mark.parametrize(
    "plan_name, kernel, old, new, expected", MUTATIONS, ids=[f"{m[1]}:{m[4][:30]}" for m in MUTATIONS]
)
def test_kernel_bugs_are_caught_with_clear_errors(
    plan_name, kernel, old, new, expected, plans_dir, kernels_dir, tt_cache, tmp_path
):
    kdir = _mutated_kernel_dir(kernels_dir, tmp_path, kernel, old, new)
    plan_path = plans_dir / f"{plan_name}.json"
    with pytest.raises(EmulatorError) as info:
        run_plan(plan_path, kdir, bf16_inputs(load_plan(plan_path)), cache_dir=tt_cache, timeout_s=30)
    msg = str(info.value)
    assert expected in msg, msg
    assert re.search(r"core \(\d+,\d+\)", msg) and plan_name in msg and kernel in msg or "deadlock" in msg


def test_pack_reconfig_data_format_sets_the_packer_for_another_cb(plans_dir, kernels_dir, tt_cache, tmp_path):
    # the packer configured for the Float32 input CB, then reconfigured for the Float16 output
    kdir = _mutated_kernel_dir(
        kernels_dir,
        tmp_path,
        "compute_copy.cpp",
        "    init_sfpu(cb_in, cb_out);\n",
        "    init_sfpu(cb_in, cb_in);\n    pack_reconfig_data_format(cb_out);\n",
    )
    plan_path = plans_dir / "convert_f32_to_f16.json"
    inputs = bf16_inputs(load_plan(plan_path))
    result = run_plan(plan_path, kdir, inputs, cache_dir=tt_cache, timeout_s=30)
    (x,) = inputs.values()
    assert np.array_equal(np.asarray(result["Y"], np.float16), x.astype(np.float16))


def test_spinning_kernel_hits_the_stall_watchdog(kernels_dir, plans_dir, tt_cache, tmp_path):
    kdir = _mutated_kernel_dir(
        kernels_dir,
        tmp_path,
        "compute_exp.cpp",
        "    exp_tile_init();\n",
        "    exp_tile_init();\n    volatile int spin = 1;\n    while (spin) {\n    }\n",
    )
    t0 = time.monotonic()
    with pytest.raises(EmulatorError) as info:
        run_plan(
            plans_dir / "unary_exp.json",
            kdir,
            bf16_inputs(load_plan(plans_dir / "unary_exp.json")),
            cache_dir=tt_cache,
            stall_timeout_s=0.5,
            timeout_s=30,
        )
    assert time.monotonic() - t0 < 10
    msg = str(info.value)
    assert "stalled" in msg and "compute kernel 'compute_exp.cpp' is running (last API call: exp_tile_init)" in msg


def test_crashing_kernel_names_core_and_kernel(kernels_dir, plans_dir, tt_cache, tmp_path):
    kdir = _mutated_kernel_dir(
        kernels_dir,
        tmp_path,
        "writer_tiles.cpp",
        "    for (uint32_t t",
        "    *reinterpret_cast<volatile uint32_t*>(static_cast<uintptr_t>(dst_addr) * 0) = 1;\n    for (uint32_t t",
    )
    with pytest.raises(EmulatorError) as info:
        run_plan(
            plans_dir / "unary_exp.json",
            kdir,
            bf16_inputs(load_plan(plans_dir / "unary_exp.json")),
            cache_dir=tt_cache,
            timeout_s=30,
        )
    msg = str(info.value)
    assert "crashed" in msg and "core (0,0) writer kernel 'writer_tiles.cpp'" in msg


def test_kernel_compile_error_names_plan_and_kernel(kernels_dir, plans_dir, tt_cache, tmp_path):
    kdir = _mutated_kernel_dir(kernels_dir, tmp_path, "compute_exp.cpp", "exp_tile(0);", "exp_tile(0, 1, 2, 3);")
    with pytest.raises(KernelCompileError) as info:
        run_plan(
            plans_dir / "unary_exp.json", kdir, bf16_inputs(load_plan(plans_dir / "unary_exp.json")), cache_dir=tt_cache
        )
    msg = str(info.value)
    assert "unary_exp" in msg and "compute kernel 'compute_exp.cpp'" in msg and "error" in msg


def test_strict_invariants_catch_unbalanced_cbs(kernels_dir, plans_dir, tt_cache):
    """A plan whose compute runs one tile short: CB 0 ends with an unpopped page, a tile unwritten."""
    plan = load_plan(plans_dir / "unary_exp.json")
    plan["cores"][0]["runtime_args"]["compute"] = [plan["cores"][0]["tiles"][1] - 1]
    plan["cores"][0]["runtime_args"]["writer"][2] -= 1
    with pytest.raises(EmulatorError) as info:
        run_plan(plan, kernels_dir, bf16_inputs(plan), cache_dir=tt_cache)
    msg = str(info.value)
    assert "CB 0: 6 page(s) pushed but 5 popped" in msg and "tiles 5 were never written" in msg
    result = run_plan(plan, kernels_dir, bf16_inputs(plan), cache_dir=tt_cache, strict=False)
    assert result.page_writes("Y")[-1] == 0


# ---------------------------------------------------------------------------------------------
# plan format
# ---------------------------------------------------------------------------------------------


def test_reference_plans_match_their_builders(plans_dir):
    for name, plan in pb.reference_plans().items():
        assert (plans_dir / f"{name}.json").read_text() == pb.dumps(plan), f"{name}.json is stale: run plan_builders.py"


def test_reference_plans_validate(plans_dir, kernels_dir):
    for path in sorted(plans_dir.glob("*.json")):
        if path.stem == "l1_over_budget":
            continue
        arch = validate_plan(load_plan(path), source=path, kernel_dir=kernels_dir)
        assert arch.name == load_plan(path)["arch"]


def _gemm() -> dict:
    return pb.gemm_plan("p", 64, 64, 64, grid=(2, 1))


def _edit(fn):
    plan = _gemm()
    fn(plan)
    return plan


BAD_PLANS = [
    (lambda p: p.pop("kernels"), "missing required key 'kernels'"),
    (lambda p: p.update(arch="grayskull"), "$.arch: expected one of"),
    (lambda p: p.update(tt_metal_version="v0.59.0"), '$.tt_metal_version: expected "v0.62.2"'),
    (lambda p: p["circular_buffers"].append(pb.cb(16, 2, "dup")), "duplicate CB id 16"),
    (lambda p: p["circular_buffers"].append(pb.cb(40, 2, "big")), "40 is above the maximum 31"),
    (lambda p: p["circular_buffers"][0].update(page_size=4096), "expected 2048 (one Float16_b tile), got 4096"),
    (
        lambda p: p["circular_buffers"][1].update(data_format="Float16", page_size=4096),
        "expected 2048 (one Float16 tile), got 4096",
    ),
    (lambda p: p["buffers"][1].update(dtype="float16", page_size=4096), "expected 2048 (one float16 tile), got 4096"),
    (lambda p: p["circular_buffers"][0].update(data_format="Bfp8_b"), 'one of ["Float16", "Float16_b", "Float32"]'),
    (lambda p: p["buffers"][0].update(padded_shape=[64, 32]), "padded_shape: expected [64, 64]"),
    (lambda p: p["cores"][0]["runtime_args"]["reader"].__setitem__(0, {"buffer_address": "Z"}), "unknown buffer 'Z'"),
    (lambda p: p["kernels"]["reader"]["compile_time_args"].append({"tensor_accessor": "Q"}), "unknown buffer 'Q'"),
    (lambda p: p["cores"][1].update(core=[5, 0]), "outside the plan grid [2, 1]"),
    (lambda p: p.update(grid=[9, 1]), "does not fit arch 'wormhole_b0''s 8x8 worker grid"),
    (lambda p: p["cores"][1].update(core=[0, 0]), "core listed twice"),
    (lambda p: p["cores"][1]["runtime_args"].pop("compute"), "no 'compute' args"),
    (lambda p: p["cores"][1].update(tiles=[0, 2]), "tile 0 is also assigned to core (0, 0)"),
    (lambda p: p["cores"][1].update(tiles=[2, 1]), "tiles 3 are assigned to no core"),
    (lambda p: p["cores"][0]["runtime_args"]["reader"].append(-1), "-1 matches none of the allowed forms"),
    (lambda p: p["kernels"]["compute"].update(source="../evil.cpp"), "does not match"),
    (lambda p: p["kernels"]["compute"].update(source="missing_kernel.cpp"), "'missing_kernel.cpp' not found"),
    (lambda p: p["kernels"].update(extra={"source": "x.cpp"}), "unexpected key 'extra'"),
    (lambda p: p["cores"][0]["runtime_args"].update(reader=list(range(400))), "400 runtime args, arch allows 341"),
]


@pytest.mark.parametrize("edit, expected", BAD_PLANS, ids=[e[1][:40] for e in BAD_PLANS])
def test_invalid_plans_are_rejected(edit, expected, kernels_dir):
    plan = _edit(edit)
    with pytest.raises(PlanError) as info:
        validate_plan(plan, source="bad.json", kernel_dir=kernels_dir)
    msg = str(info.value)
    assert expected in msg, msg
    assert "bad.json" in msg
    assert isinstance(info.value, TesseraError) and isinstance(info.value, ValueError)


def test_inputs_are_checked(run, plans_dir):
    plan = load_plan(plans_dir / "gemm_single_core.json")
    ins = bf16_inputs(plan)
    with pytest.raises(PlanError, match=r"no value given for input buffer 'B'"):
        run(plan, {"A": ins["A"]})
    with pytest.raises(PlanError, match=r"input 'A': expected shape \(64, 96\), got \(96, 64\)"):
        run(plan, {"A": ins["A"].T, "B": ins["B"]})
    with pytest.raises(PlanError, match=r"'C' is not an input buffer"):
        run(plan, {**ins, "C": ins["A"]})


def test_bad_plan_file_names_the_file(tmp_path, kernels_dir):
    bad = tmp_path / "broken.json"
    bad.write_text('{"name": "x",\n "arch": }')
    with pytest.raises(PlanError, match=r"(?s)broken.json.*line 2"):
        run_plan(bad, kernels_dir, {})


def test_the_schema_is_valid_and_the_shipped_plans_meet_it(plans_dir):
    import jsonschema

    schema = plan_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in sorted(plans_dir.glob("*.json")):
        assert not list(validator.iter_errors(json.loads(path.read_text()))), path
