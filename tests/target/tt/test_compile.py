"""``ts.compile(kernel, target="tenstorrent")``: frontend GEMM+epilogue and element-wise kernels give
the five artifacts (reader/compute/writer/host/plan), which pass the syntax check and run in the
tt-metal emulator matching ``kernel.reference``; kernels the TT target cannot lower name the op."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops
from tessera.errors import NotRunnableError, ScheduleError
from tessera_tvm.target.tt import INCLUDE_DIR
from tessera_tvm.target.tt.emulate import TENSOR_ACCESSOR_INTERLEAVED_DRAM_ARGS, run_plan
from tessera_tvm.target.tt.transform.common import UnsupportedTTOperationError
from tessera_tvm.tile import (
    Binary,
    Const,
    ElementwiseSpec,
    EpilogueOp,
    GemmSpec,
    Input,
    ReduceSpec,
    Unary,
    build_tile_program,
)
from tests.conftest import emu_cache

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

FIVE = ("reader", "compute", "writer", "host", "plan")
FILES = ("reader.cpp", "compute.cpp", "writer.cpp", "main.cpp", "tt.plan.json")
U_BF16 = 2.0**-8  # unit roundoff of bfloat16
U_F16 = 2.0**-11  # unit roundoff of IEEE half


@ts.kernel
def linear(
    A: Tensor["M", "K", ts.bf16], W: Tensor["K", "N", ts.bf16], b: Tensor["N", ts.bf16]
) -> Tensor["M", "N", ts.bf16]:
    return ops.gelu(ops.matmul(A, W) + b)


@ts.kernel
def eltwise(x: Tensor["M", "N", ts.bf16], y: Tensor["M", "N", ts.bf16]) -> Tensor["M", "N", ts.bf16]:
    return ops.relu(ops.exp(x) * y - x)


@ts.kernel
def softmax(x: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.softmax(x, axis=-1)


@ts.kernel
def layer_norm(x: Tensor["M", "N", ts.f32], w: Tensor["N", ts.f32], b: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.layer_norm(x, w, b)


@ts.kernel
def attention(
    Q: Tensor[1, 2, 50, 32, ts.bf16], K: Tensor[1, 2, 50, 32, ts.bf16], V: Tensor[1, 2, 50, 32, ts.bf16]
) -> Tensor[1, 2, 50, 32, ts.bf16]:
    return ops.flash_attention(Q, K, V, causal=True)


@ts.kernel
def linear_f16(
    A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16], b: Tensor["N", ts.f16]
) -> Tensor["M", "N", ts.f16]:
    return ops.gelu(ops.matmul(A, W) + b)  # examples/linear.py


LINEAR_SHAPES = {"M": 50, "N": 70, "K": 45}  # not multiples of 32: padded edge tiles
ELTWISE_SHAPES = {"M": 33, "N": 100}
LINEAR_F16_SHAPES = {"M": 64, "N": 96, "K": 64}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = {}
    for name, kernel, shapes in (
        ("linear", linear, LINEAR_SHAPES),
        ("eltwise", eltwise, ELTWISE_SHAPES),
        ("linear_f16", linear_f16, LINEAR_F16_SHAPES),
    ):
        dump = tmp_path_factory.mktemp(name)
        out[name] = (ts.compile(kernel, target="tenstorrent", shapes=shapes, dump=True, dump_dir=dump), dump)
    return out


@pytest.mark.parametrize("name", ["linear", "eltwise"])
def test_five_artifacts_in_artifacts_dumps_and_target_ir(compiled, name):
    k, dump = compiled[name]
    (dk,) = k.device_kernels
    assert set(FIVE) <= set(k.artifacts[dk.name])
    assert [k.artifacts[dk.name][key].name for key in FIVE] == list(FILES)
    assert (dk.schedule.block_m, dk.schedule.block_n) == (32, 32)
    for sub in (dump / "target" / dk.name, dump / "artifacts" / dk.name):
        assert all((sub / f).is_file() for f in FILES), sorted(p.name for p in sub.iterdir())
    target = k.inspect_ir("target")
    assert all(f in target for f in FILES)
    assert "matmul_tiles" in target if name == "linear" else "exp_tile" in target
    assert target == (dump / "target.tt.cpp").read_text()
    assert {"graph.txt", "sched.txt", "tile.py"} <= {p.name for p in dump.iterdir()}
    with pytest.raises(NotRunnableError, match="tenstorrent"):
        k(*[np.zeros((1, 1), np.float32)] * 2)


def _ct_args(plan: dict, role: str) -> list[int]:
    args: list[int] = []
    for arg in plan["kernels"][role].get("compile_time_args", []):
        args.extend(TENSOR_ACCESSOR_INTERLEAVED_DRAM_ARGS if isinstance(arg, dict) else [int(arg)])
    return args


def _syntax(path: Path, ct_args: list[int] | None) -> subprocess.CompletedProcess:
    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", "-I", str(INCLUDE_DIR)]
    if ct_args:
        cmd.append("-DKERNEL_COMPILE_TIME_ARGS=" + ",".join(map(str, ct_args)))
    return subprocess.run([*cmd, str(path)], capture_output=True, text=True, check=False)


@needs_gxx
def test_generated_kernels_pass_the_syntax_check(compiled):
    jobs = []
    for k, _ in compiled.values():
        for files in k.artifacts.values():
            plan = json.loads(files["plan"].read_text())
            jobs += [
                (files["reader"], _ct_args(plan, "reader")),
                (files["compute"], None),
                (files["writer"], _ct_args(plan, "writer")),
                (files["host"], None),
            ]
    with ThreadPoolExecutor() as pool:
        results = list(pool.map(lambda job: _syntax(*job), jobs))
    failures = {str(p): r.stderr for (p, _), r in zip(jobs, results, strict=True) if r.returncode}
    assert not failures, failures


def _emulate(k, arrays: dict[str, np.ndarray], cache: Path) -> np.ndarray:
    (files,) = k.artifacts.values()
    plan = json.loads(files["plan"].read_text())
    ins = {b["name"]: arrays[b["name"]].astype(np.float32) for b in plan["buffers"] if b["role"] == "input"}
    result = run_plan(plan, files["plan"].parent, ins, cache_dir=cache)
    (out,) = [b["name"] for b in plan["buffers"] if b["role"] == "output"]
    return result[out].astype(np.float64)


@needs_gxx
def test_linear_runs_in_the_emulator_and_matches_the_reference(compiled, tmp_path_factory):
    k, _ = compiled["linear"]
    rng = np.random.default_rng(0)
    M, N, K = LINEAR_SHAPES["M"], LINEAR_SHAPES["N"], LINEAR_SHAPES["K"]
    bf16 = ts.bf16.numpy
    a, w, b = (rng.standard_normal(s).astype(bf16) for s in ((M, K), (K, N), (N,)))
    out = _emulate(k, {"A": a, "W": w, "b": b}, emu_cache())
    ref = linear.reference(a, w, b).astype(np.float64)
    pre = np.abs(a.astype(np.float64) @ w.astype(np.float64)) + np.abs(b.astype(np.float64))
    # bf16 tolerance: the reference rounds to bf16 after matmul, + and gelu; the kernel rounds A@B when
    # it packs the tile (fp32 sums in another order) and once at the store. Allow 4 bf16 roundings of
    # the pre-activation, carried through gelu (|gelu'| <= 1.13), plus 2 of the result.
    tol = 4 * 1.13 * U_BF16 * pre + 2 * U_BF16 * np.abs(ref) + 1e-6
    assert out.shape == ref.shape == (M, N)
    bad = np.abs(out - ref) > tol
    assert not bad.any(), f"{bad.sum()} elements off, max |diff| {np.abs(out - ref).max():.3g}"


@needs_gxx
def test_eltwise_runs_in_the_emulator_and_matches_the_reference(compiled, tmp_path_factory):
    k, _ = compiled["eltwise"]
    rng = np.random.default_rng(1)
    shape = (ELTWISE_SHAPES["M"], ELTWISE_SHAPES["N"])
    x, y = (rng.standard_normal(shape).astype(ts.bf16.numpy) for _ in range(2))
    out = _emulate(k, {"x": x, "y": y}, emu_cache())
    ref = eltwise.reference(x, y).astype(np.float64)
    xf, yf = x.astype(np.float64), y.astype(np.float64)
    # bf16 tolerance: both sides round exp(x), exp(x)*y and the result to bf16 (the kernel when it packs
    # a tile, in float32 arithmetic): 3 bf16 roundings of each intermediate, 2 of the largest.
    tol = 3 * U_BF16 * (np.exp(xf) * np.abs(yf) + np.abs(xf) + np.abs(ref)) + 1e-6
    bad = np.abs(out - ref) > tol
    assert not bad.any(), f"{bad.sum()} elements off, max |diff| {np.abs(out - ref).max():.3g}"


# ---- float16 buffers: IEEE half in Float16 circular buffers, float32 in DST ----


@ts.kernel
def eltwise_f16(x: Tensor["M", "N", ts.f16], y: Tensor["M", "N", ts.f16]) -> Tensor["M", "N", ts.f16]:
    return ops.relu(ops.exp(x) * y - x)


@ts.kernel
def softmax_f16(x: Tensor["M", "N", ts.f16]) -> Tensor["M", "N", ts.f16]:
    return ops.softmax(x, axis=-1)


@ts.kernel
def layer_norm_f16(
    x: Tensor["M", "N", ts.f16], w: Tensor["N", ts.f16], b: Tensor["N", ts.f16]
) -> Tensor["M", "N", ts.f16]:
    return ops.layer_norm(x, w, b, eps=1e-5)  # examples/layer_norm.py


def test_float16_buffers_are_float16_circular_buffers(compiled):
    """Every DRAM buffer and CB of an f16 kernel is IEEE half (tt::DataFormat::Float16, 2048-byte
    tiles); the GEMM still accumulates in float32 DST."""
    k, _ = compiled["linear_f16"]
    (files,) = k.artifacts.values()
    plan = json.loads(files["plan"].read_text())
    assert {(b["dtype"], b["page_size"]) for b in plan["buffers"]} == {("float16", 2048)}
    assert {(cb["data_format"], cb["page_size"]) for cb in plan["circular_buffers"]} == {("Float16", 2048)}
    host = files["host"].read_text()
    assert "tt::DataFormat::Float16)" in host and "Float16_b" not in host


@needs_gxx
@pytest.mark.parametrize("M, N, K", [(64, 96, 64), (50, 40, 70)], ids=["tiles", "ragged"])
def test_float16_linear_runs_in_the_emulator(M, N, K, tmp_path):
    """examples/linear.py (f16 A, W, b and out; matmul + cast + bias + gelu) in the emulator."""
    k = ts.compile(linear_f16, target="tenstorrent", shapes={"M": M, "N": N, "K": K})
    rng = np.random.default_rng(20)
    a, w, b = (rng.standard_normal(s).astype(np.float16) for s in ((M, K), (K, N), (N,)))
    out = k.emulate(a, w, b, cache_dir=emu_cache())
    ref = linear_f16.reference(a, w, b)
    assert out.shape == ref.shape == (M, N) and out.dtype == ref.dtype == np.float16
    out, ref = out.astype(np.float64), ref.astype(np.float64)
    pre = np.abs(a.astype(np.float64) @ w.astype(np.float64)) + np.abs(b.astype(np.float64))
    # f16 tolerance, as the bf16 linear test: 4 half roundings of the pre-activation carried through
    # gelu (|gelu'| <= 1.13) and 2 of the result; a bfloat16 rounding anywhere (2**-8) would not fit.
    tol = 4 * 1.13 * U_F16 * pre + 2 * U_F16 * np.abs(ref) + 1e-6
    bad = np.abs(out - ref) > tol
    assert not bad.any(), f"{bad.sum()} elements off, max |diff| {np.abs(out - ref).max():.3g}"


@needs_gxx
def test_float16_eltwise_runs_in_the_emulator(tmp_path):
    k = ts.compile(eltwise_f16, target="tenstorrent", shapes=ELTWISE_SHAPES)
    rng = np.random.default_rng(21)
    x, y = (rng.standard_normal((ELTWISE_SHAPES["M"], ELTWISE_SHAPES["N"])).astype(np.float16) for _ in range(2))
    out = k.emulate(x, y, cache_dir=emu_cache()).astype(np.float64)
    ref = eltwise_f16.reference(x, y).astype(np.float64)
    xf, yf = x.astype(np.float64), y.astype(np.float64)
    # as the bf16 element-wise test: 3 half roundings of each intermediate, 2 of the largest
    tol = 3 * U_F16 * (np.exp(xf) * np.abs(yf) + np.abs(xf) + np.abs(ref)) + 1e-6
    bad = np.abs(out - ref) > tol
    assert not bad.any(), f"{bad.sum()} elements off, max |diff| {np.abs(out - ref).max():.3g}"


F16_ROW_OPS = [
    (softmax_f16, lambda r: [3 * r.standard_normal((40, 64))]),
    (layer_norm_f16, lambda r: [r.standard_normal(s) + 1 for s in ((40, 100), (100,), (100,))]),
]


@needs_gxx
@pytest.mark.parametrize("kernel, make", F16_ROW_OPS, ids=["softmax", "layer_norm"])
def test_float16_softmax_and_layer_norm_run_in_the_emulator(kernel, make, tmp_path):
    """Row reductions and broadcast element-wise kernels over f16 buffers (the reduce's scaler tile
    is an IEEE half 1.0), against the f16 reference."""
    arrays = [a.astype(np.float16) for a in make(np.random.default_rng(22))]
    k = ts.compile(kernel, target="tenstorrent", shapes={"M": arrays[0].shape[0], "N": arrays[0].shape[1]})
    out = k.emulate(*arrays, cache_dir=emu_cache())
    ref = kernel.reference(*arrays)
    assert out.shape == ref.shape and out.dtype == ref.dtype == np.float16
    ref = ref.astype(np.float64)
    err = np.abs(out.astype(np.float64) - ref).max()
    # a few half roundings of the largest value (bf16's 2**-8 would not fit)
    assert err <= 4 * U_F16 * np.abs(ref).max() + 1e-6, err


@ts.kernel
def widen_scale(x: Tensor["M", "N", ts.bf16], w: Tensor["N", ts.bf16]) -> Tensor["M", "N", ts.f32]:
    return ops.cast(x * w + 1.0, ts.f32)  # bf16 in, float32 out: one kernel


@ts.kernel
def narrow_rows(x: Tensor["M", "N", ts.f32]) -> Tensor["M", ts.bf16]:
    return ops.cast(ops.sum(x, axis=-1), ts.bf16)  # float32 in, bfloat16 out: the reduce packs bf16


@ts.kernel
def narrow_softmax(x: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.bf16]:
    return ops.cast(ops.softmax(x, axis=-1), ts.bf16)


@needs_gxx
@pytest.mark.parametrize("kernel", [widen_scale, narrow_rows, narrow_softmax], ids=["widen", "reduce", "softmax"])
def test_a_kernel_that_changes_the_format_reads_one_and_packs_the_other(kernel, tmp_path):
    # the unpacker reads the inputs' format and the packer writes the output's: a cast needs no
    # kernel of its own (the emulator checks that every pack goes to a CB of the packer's format)
    rng = np.random.default_rng(24)
    arrays = [
        rng.standard_normal([40 if d == "M" else 70 for d in t.dims]).astype(t.dtype.numpy) for _, t in kernel.params
    ]
    k = ts.compile(kernel, target="tenstorrent", shapes={"M": 40, "N": 70})
    out = k.emulate(*arrays, cache_dir=emu_cache())
    ref = kernel.reference(*arrays)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    ref = ref.astype(np.float64)
    assert np.abs(out.astype(np.float64) - ref).max() <= 2 * U_BF16 * np.abs(ref).max()


@ts.kernel
def layer_norm_bf16(
    x: Tensor["M", "N", ts.bf16], w: Tensor["N", ts.bf16], b: Tensor["N", ts.bf16]
) -> Tensor["M", "N", ts.bf16]:
    return ops.layer_norm(x, w, b)


@needs_gxx
def test_a_bf16_layer_norm_of_rows_far_from_zero_keeps_its_precision(tmp_path):
    # rows of mean 100 and spread 1: the bf16 row mean is off by up to 2**-9 * 100 = 0.2, which one
    # centring passes on to every normalised value (0.74 here before); centring twice leaves the
    # output's own rounding
    rng = np.random.default_rng(23)
    x = (rng.standard_normal((64, 96)) + 100).astype(ts.bf16.numpy)
    w, b = (rng.standard_normal(96).astype(ts.bf16.numpy) for _ in range(2))
    k = ts.compile(layer_norm_bf16, target="tenstorrent", shapes={"M": 64, "N": 96})
    families = [dk.binding.spec.family for dk in k.device_kernels]
    assert families == ["reduce", "elementwise", "reduce", "elementwise", "elementwise", "reduce", "elementwise"]
    out = k.emulate(x, w, b, cache_dir=emu_cache()).astype(np.float64)
    ref = layer_norm_bf16.reference(x, w, b).astype(np.float64)
    assert np.abs(out - ref).max() <= 4 * U_BF16 * np.abs(ref).max()


@pytest.mark.parametrize(
    "kernel, shapes, op",
    [(attention, {}, "attention with ragged sequence lengths")],
    ids=["attention_ragged"],
)
def test_unsupported_kernels_name_the_op(kernel, shapes, op):
    with pytest.raises(UnsupportedTTOperationError, match=rf"{op}: the Tenstorrent target does not support"):
        ts.compile(kernel, target="tenstorrent", shapes=shapes)


@ts.kernel
def rms_norm(x: Tensor["M", "N", ts.bf16], w: Tensor["N", ts.bf16]) -> Tensor["M", "N", ts.bf16]:
    return ops.rms_norm(x, w)


ROW_OPS = [
    # (kernel, inputs, kernels it decomposes into, tolerance relative to max |ref|)
    (softmax, lambda r: [3 * r.standard_normal((40, 64)).astype(np.float32)], ["reduce", "elementwise"] * 2, 1e-5),
    # 70 columns, all negative: the row max masks the last tile's padding to -inf
    (softmax, lambda r: [3 * r.standard_normal((40, 70)).astype(np.float32) - 9], ["reduce", "elementwise"] * 2, 1e-5),
    (
        layer_norm,
        lambda r: [r.standard_normal(s).astype(np.float32) + 1 for s in ((40, 100), (100,), (100,))],
        ["reduce", "elementwise", "elementwise", "reduce", "elementwise"],
        1e-5,
    ),
    (
        rms_norm,
        lambda r: [r.standard_normal(s).astype(ts.bf16.numpy) for s in ((40, 64), (64,))],
        ["elementwise", "reduce", "elementwise"],
        4 * U_BF16,
    ),
]


@needs_gxx
@pytest.mark.parametrize(
    "kernel, make, families, rtol", ROW_OPS, ids=["softmax", "softmax_ragged", "layer_norm", "rms_norm"]
)
def test_softmax_and_norms_run_in_the_emulator(kernel, make, families, rtol, tmp_path):
    """tessera.DecomposeRowOps (the tenstorrent graph list) makes row reductions and broadcast
    element-wise kernels of them; k.emulate runs the kernels in order in the tt-metal emulator."""
    arrays = make(np.random.default_rng(14))
    k = ts.compile(kernel, target="tenstorrent", shapes={"M": arrays[0].shape[0], "N": arrays[0].shape[1]})
    assert [dk.binding.spec.family for dk in k.device_kernels] == families
    out = k.emulate(*arrays, cache_dir=emu_cache())
    ref = kernel.reference(*arrays)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    ref = ref.astype(np.float64)
    err = np.abs(out.astype(np.float64) - ref).max()
    assert err <= rtol * np.abs(ref).max() + 1e-6, err
    with pytest.raises(NotRunnableError, match="emulate"):
        ts.compile(kernel, target="cpu").emulate(*arrays)


def test_unsupported_element_wise_op_and_non_tile_schedule():
    @ts.kernel
    def th(x: Tensor["M", "N", ts.bf16]) -> Tensor["M", "N", ts.bf16]:
        return ops.tanh(x)

    with pytest.raises(UnsupportedTTOperationError, match="tanh: the Tenstorrent target does not support"):
        ts.compile(th, target="tenstorrent", shapes={"M": 32, "N": 32})
    with pytest.raises(ScheduleError, match="32x32 tile"):  # blocks of several tiles are fine; K steps are 32
        ts.compile(linear, target="tenstorrent", shapes={"M": 64, "N": 64, "K": 64}, schedule={"block_k": 64})


# ---- the generator on its own (tessera_tvm.tile.build_tile_program(spec, None, "tenstorrent")) ----

GEMM_CASES = [
    GemmSpec(64, 64, 96, dtype_a="bfloat16", transpose_b=True, epilogue=(EpilogueOp("exp"),)),
    GemmSpec(40, 64, 64, dtype_a="float32", epilogue=(EpilogueOp("relu"),)),
    GemmSpec(64, 33, 32, dtype_a="bfloat16", epilogue=(EpilogueOp("bias", operand="b"), EpilogueOp("gelu_tanh"))),
    ElementwiseSpec((2, 33, 40), (("x", (2, 33, 40), "float32"),), Unary("gelu_tanh", Input("x")), "float32"),
    ElementwiseSpec(
        (64, 64),
        (("x", (64, 64), "bfloat16"), ("y", (64, 64), "bfloat16")),
        Binary("add", Input("x"), Input("y")),
        "bfloat16",
    ),
]


@pytest.mark.parametrize("spec", GEMM_CASES, ids=lambda s: f"{s.family}-{s.fingerprint()[:6]}")
def test_generator_specs_lower_to_the_five_files(spec, tmp_path):
    lowered = tessera_tvm.lower(build_tile_program(spec, None, "tenstorrent"), "tenstorrent", out_dir=tmp_path)
    assert set(FIVE) <= set(lowered.artifacts)


@needs_gxx
def test_float32_gemm_with_transposed_b_and_gelu_tanh_in_the_emulator(tmp_path):
    spec = GemmSpec(40, 64, 96, dtype_a="float32", transpose_b=True, epilogue=(EpilogueOp("gelu_tanh"),))
    lowered = tessera_tvm.lower(build_tile_program(spec, None, "tt"), "tenstorrent", out_dir=tmp_path / "k")
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((40, 96)), rng.standard_normal((64, 96))
    result = run_plan(
        lowered.artifacts["plan"],
        tmp_path / "k",
        {"A": a.astype(np.float32), "B": b.astype(np.float32)},
        cache_dir=emu_cache(),
    )
    mm = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64).T
    ref = 0.5 * mm * (1 + np.tanh(np.sqrt(2 / np.pi) * (mm + 0.044715 * mm**3)))
    # float32 buffers, but the emulated DST holds bf16 without fp32_dest_acc_en (configs/tenstorrent.yaml):
    # allow 4 bf16 roundings of |A| @ |B|^T through gelu (|gelu'| <= 1.13)
    tol = 4 * 1.13 * U_BF16 * (np.abs(a) @ np.abs(b).T) + 1e-6
    assert np.all(np.abs(result["C"] - ref) <= tol), np.abs(result["C"] - ref).max()


@ts.kernel
def residual_block(
    A: Tensor["M", "K", ts.bf16], W: Tensor["K", "N", ts.bf16], R: Tensor["M", "N", ts.bf16]
) -> Tensor["M", "N", ts.bf16]:
    return ops.relu(ops.matmul(A, W) + R)


@needs_gxx
def test_gemm_with_a_residual_epilogue_runs_in_the_emulator(tmp_path):
    """matmul + residual, relu from the frontend: one fused GEMM whose epilogue adds a tile of the
    [M, N] operand on the FPU (edge tiles padded)."""
    shapes = {"M": 50, "N": 70, "K": 45}
    k = ts.compile(residual_block, target="tenstorrent", shapes=shapes)
    (dk,) = k.device_kernels
    assert [op.kind for op in dk.binding.spec.epilogue if op.kind != "cast"] == ["residual", "relu"]
    assert "add_tiles(" in k.source and "relu_tile(" in k.source
    rng = np.random.default_rng(3)
    M, N, K = shapes["M"], shapes["N"], shapes["K"]
    bf16 = ts.bf16.numpy
    a, w, r = (rng.standard_normal(s).astype(bf16) for s in ((M, K), (K, N), (M, N)))
    out = _emulate(k, {"A": a, "W": w, "R": r}, tmp_path / "emu")
    ref = residual_block.reference(a, w, r).astype(np.float64)
    af, wf, rf = (x.astype(np.float64) for x in (a, w, r))
    # bf16: A@W rounded when packed (and by the reference's cast), the sum at the store.
    tol = 4 * U_BF16 * (np.abs(af) @ np.abs(wf) + np.abs(rf)) + 1e-6
    bad = np.abs(out - ref) > tol
    assert not bad.any(), f"{bad.sum()} elements off, max |diff| {np.abs(out - ref).max():.3g}"


@needs_gxx
def test_float32_gemm_with_residual_relu_gate_in_the_emulator(tmp_path):
    spec = GemmSpec(
        50,
        70,
        45,
        dtype_a="float32",
        epilogue=(EpilogueOp("residual", operand="r"), EpilogueOp("relu"), EpilogueOp("gate", operand="g")),
    )
    lowered = tessera_tvm.lower(build_tile_program(spec, None, "tt"), "tenstorrent", out_dir=tmp_path / "k")
    rng = np.random.default_rng(4)
    a, b, r, g = (rng.standard_normal(s) for s in ((50, 45), (45, 70), (50, 70), (50, 70)))
    inputs = {"A": a, "B": b, "r": r, "g": g}
    result = run_plan(
        lowered.artifacts["plan"],
        tmp_path / "k",
        {n: v.astype(np.float32) for n, v in inputs.items()},
        cache_dir=emu_cache(),
    )
    ref = np.maximum(a @ b + r, 0) * g
    # float32 buffers, DST in bf16 without fp32_dest_acc_en: 4 bf16 roundings of the pre-activation
    tol = 4 * U_BF16 * (np.abs(a) @ np.abs(b) + np.abs(r)) * np.abs(g) + 1e-6
    assert np.all(np.abs(result["C"] - ref) <= tol), np.abs(result["C"] - ref).max()
    wrong = np.maximum(a @ b + r, 0) * (g + 0.5)  # the check can fail: another gate does not match
    assert not np.all(np.abs(result["C"] - wrong) <= tol)


@needs_gxx
def test_scalar_operands_run_on_the_sfpu_in_the_emulator(tmp_path):
    """Scale and add_scalar epilogues, and scalars on either side of + - * / in element-wise
    kernels: binop_with_scalar on the SFPU, the scalar as its fp32 bits."""
    rng = np.random.default_rng(5)
    gemm = GemmSpec(
        50,
        70,
        45,
        dtype_a="float32",
        epilogue=(EpilogueOp("scale", value=0.25), EpilogueOp("add_scalar", value=1.5), EpilogueOp("relu")),
    )
    lowered = tessera_tvm.lower(build_tile_program(gemm, None, "tt"), "tenstorrent", out_dir=tmp_path / "g")
    assert "mul_unary_tile(0, 0x3e800000u);  // x * 0.25" in lowered.source
    assert "binop_with_scalar_tile_init();" in lowered.source
    a, b = rng.standard_normal((50, 45)), rng.standard_normal((45, 70))
    inputs = {"A": a.astype(np.float32), "B": b.astype(np.float32)}
    out = run_plan(lowered.artifacts["plan"], tmp_path / "g", inputs, cache_dir=emu_cache())["C"]
    ref = np.maximum(a @ b * 0.25 + 1.5, 0)
    tol = 4 * U_BF16 * (np.abs(a) @ np.abs(b) * 0.25 + 1.5) + 1e-6
    assert np.all(np.abs(out - ref) <= tol), np.abs(out - ref).max()

    expr = Binary("sub", Const(2.0), Binary("div", Unary("exp", Input("x")), Const(4.0)))  # 2 - exp(x) / 4
    elt = ElementwiseSpec((33, 40), (("x", (33, 40), "float32"),), expr, "float32")
    lowered = tessera_tvm.lower(build_tile_program(elt, None, "tt"), "tenstorrent", out_dir=tmp_path / "e")
    assert "rsub_unary_tile(0, 0x40000000u);  // 2.0 - x" in lowered.source
    x = rng.standard_normal((33, 40)).astype(np.float32)
    (out,) = run_plan(lowered.artifacts["plan"], tmp_path / "e", {"x": x}, cache_dir=emu_cache()).values()
    ref = 2.0 - np.exp(x.astype(np.float64)) / 4
    assert np.all(np.abs(out - ref) <= 2 * U_BF16 * (np.abs(ref) + 1) + 1e-6), np.abs(out - ref).max()


RECIP_SQRT = [  # (expression of x and y, numpy reference, inputs kept positive)
    (Unary("sigmoid", Input("x")), lambda x, y: 1 / (1 + np.exp(-x)), False),
    (Unary("silu", Input("x")), lambda x, y: x / (1 + np.exp(-x)), False),
    (Unary("rsqrt", Input("x")), lambda x, y: 1 / np.sqrt(x), True),
    (Unary("sqrt", Input("x")), lambda x, y: np.sqrt(x), True),
    (Binary("div", Input("x"), Input("y")), lambda x, y: x / y, True),
    (Binary("div", Const(3.0), Input("y")), lambda x, y: 3 / y, True),
    (Unary("neg", Input("x")), lambda x, y: -x, False),
]


@needs_gxx
@pytest.mark.parametrize(
    "expr, ref, positive", RECIP_SQRT, ids=["sigmoid", "silu", "rsqrt", "sqrt", "div", "scalar_div", "neg"]
)
def test_reciprocal_and_sqrt_ops_run_in_the_emulator(expr, ref, positive, tmp_path):
    """sqrt_tile and recip_tile on the SFPU, and what composes them: rsqrt, sigmoid, silu, tile / tile."""
    spec = ElementwiseSpec((33, 40), (("x", (33, 40), "float32"), ("y", (33, 40), "float32")), expr, "float32")
    lowered = tessera_tvm.lower(build_tile_program(spec, None, "tt"), "tenstorrent", out_dir=tmp_path / "k")
    rng = np.random.default_rng(10)
    x, y = (rng.standard_normal((33, 40)).astype(np.float32) for _ in range(2))
    if positive:
        x, y = np.abs(x) + 0.5, np.abs(y) + 0.5
    (out,) = run_plan(lowered.artifacts["plan"], tmp_path / "k", {"x": x, "y": y}, cache_dir=emu_cache()).values()
    want = ref(x.astype(np.float64), y.astype(np.float64))
    assert np.all(np.abs(out - want) <= 4 * U_BF16 * np.abs(want) + 1e-6), np.abs(out - want).max()


@needs_gxx
@pytest.mark.parametrize("act", ["gelu_erf", "silu"])
def test_an_activation_of_a_scaled_accumulator_runs_in_the_emulator(act, tmp_path):
    """Found by the fuzz test: gelu(0.5 * acc), whose constants the simplifier folds into the erf
    pattern, and silu(0.5 * acc), which reads the accumulator again after the SFPU changed it in DST."""
    spec = GemmSpec(40, 64, 64, dtype_a="float32", epilogue=(EpilogueOp("scale", value=0.5), EpilogueOp(act)))
    lowered = tessera_tvm.lower(build_tile_program(spec, None, "tt"), "tenstorrent", out_dir=tmp_path / "k")
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((40, 64)), rng.standard_normal((64, 64))
    inputs = {"A": a.astype(np.float32), "B": b.astype(np.float32)}
    out = run_plan(lowered.artifacts["plan"], tmp_path / "k", inputs, cache_dir=emu_cache())["C"]
    y = 0.5 * (a @ b)
    ref = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2))) if act == "gelu_erf" else y / (1 + np.exp(-y))
    tol = 4 * 1.13 * U_BF16 * 0.5 * (np.abs(a) @ np.abs(b)) + 1e-6
    assert np.all(np.abs(out - ref) <= tol), np.abs(out - ref).max()


# max over 70 and 20 columns: the padding of the last tile is masked to -inf, not the zeros in DRAM
REDUCTIONS = [("sum", (50, 70)), ("max", (50, 64)), ("max", (50, 70)), ("max", (40, 20)), ("mean", (2, 33, 100))]


@needs_gxx
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("kind, shape", REDUCTIONS, ids=[f"{k}{s[-1]}" for k, s in REDUCTIONS])
def test_row_reductions_run_in_the_emulator(kind, shape, dtype, tmp_path):
    """reduce_tile<SUM|MAX, REDUCE_ROW> over every 32x32 tile of a row block into column 0 of one DST
    tile, with a scaler tile of 1.0 the reader fills once; a mean multiplies the sums by 1/N. Rows
    are mostly negative, so a maximum that started from DST's zeros would show."""
    spec = ReduceSpec(shape, axis=-1, kind=kind, dtype_in=dtype)
    lowered = tessera_tvm.lower(build_tile_program(spec, None, "tt"), "tenstorrent", out_dir=tmp_path / "k")
    assert f"reduce_tile<PoolType::{'MAX' if kind == 'max' else 'SUM'}, ReduceDim::REDUCE_ROW>" in lowered.source
    plan = json.loads(lowered.artifacts["plan"].read_text())
    for role, args in (("reader", _ct_args(plan, "reader")), ("compute", None), ("writer", _ct_args(plan, "writer"))):
        check = _syntax(lowered.artifacts[role], args)  # against the v0.62.2 API headers
        assert check.returncode == 0, check.stderr
    rng = np.random.default_rng(12)
    x = (rng.standard_normal(shape) - (6 if kind == "max" else 2)).astype(ts.dtype(dtype).numpy)
    rows = math.prod(shape[:-1])
    inputs = {"x": x.astype(np.float32).reshape(rows, shape[-1])}
    (out,) = run_plan(lowered.artifacts["plan"], tmp_path / "k", inputs, cache_dir=emu_cache()).values()
    xf = x.astype(np.float64)
    ref = {"sum": np.sum, "max": np.max, "mean": np.mean}[kind](xf, axis=-1)
    assert out.shape == (rows, 1)
    assert np.all(ref < 0) or kind != "max"
    # bf16: the tile sums are rounded to bf16 in DST (no fp32_dest_acc_en), one rounding per tile
    tiles = -(-shape[-1] // 32)
    u = {"bfloat16": U_BF16, "float16": U_F16, "float32": 2.0**-23}[dtype]
    tol = (tiles + 1) * u * np.abs(xf).sum(axis=-1) / (shape[-1] if kind == "mean" else 1) + 1e-6
    assert np.all(np.abs(out.reshape(ref.shape) - ref) <= tol), np.abs(out.reshape(ref.shape) - ref).max()


@ts.kernel
def row_stats(x: Tensor["M", "N", ts.f32]) -> Tensor["M", ts.f32]:
    return ops.mean(x, axis=-1)


@needs_gxx
def test_a_row_mean_from_the_frontend_runs_in_the_emulator(tmp_path):
    k = ts.compile(row_stats, target="tenstorrent", shapes={"M": 40, "N": 96})
    (files,) = k.artifacts.values()
    plan = json.loads(files["plan"].read_text())
    x = np.random.default_rng(13).standard_normal((40, 96)).astype(np.float32)
    (out,) = run_plan(plan, files["plan"].parent, {"x": x}, cache_dir=emu_cache()).values()
    ref = row_stats.reference(x).astype(np.float64)
    assert np.abs(out.reshape(ref.shape) - ref).max() < 1e-5


@ts.kernel
def swiglu(
    x: Tensor["M", "K", ts.bf16], wg: Tensor["K", "N", ts.bf16], wu: Tensor["K", "N", ts.bf16]
) -> Tensor["M", "N", ts.bf16]:
    return ops.silu(ops.matmul(x, wg)) * ops.matmul(x, wu)


def test_a_swiglu_mlp_gate_compiles_for_tenstorrent():
    """LLaMA's gated MLP: two GEMMs (one with a silu epilogue) and the product, each a TT kernel."""
    k = ts.compile(swiglu, target="tenstorrent", shapes={"M": 64, "K": 64, "N": 96})
    assert len(k.device_kernels) >= 2
    assert "recip_tile(" in k.source and "matmul_tiles(" in k.source


@ts.kernel
def center_rows(x: Tensor["M", "N", ts.bf16], m: Tensor["M", 1, ts.bf16]) -> Tensor["M", "N", ts.bf16]:
    return ops.exp(x - m)


@needs_gxx
def test_subtracting_a_column_runs_in_the_emulator(tmp_path):
    """exp(x - m[M, 1]), softmax's shifted exponent: sub_tiles_bcast_cols, then exp on the SFPU."""
    k = ts.compile(center_rows, target="tenstorrent", shapes={"M": 40, "N": 70})
    assert "sub_tiles_bcast_cols(" in k.source and "sub_bcast_cols_init_short(" in k.source
    (files,) = k.artifacts.values()
    plan = json.loads(files["plan"].read_text())
    rng = np.random.default_rng(9)
    x = rng.standard_normal((40, 70)).astype(ts.bf16.numpy)
    m = x.astype(np.float32).max(axis=1, keepdims=True).astype(ts.bf16.numpy)
    ins = {"x": x.astype(np.float32), "m": m.astype(np.float32)}
    (out,) = run_plan(plan, files["plan"].parent, ins, cache_dir=emu_cache()).values()
    ref = center_rows.reference(x, m).astype(np.float64)
    assert np.all(out <= 1 + 4 * U_BF16)  # every row's max maps to exp(0)
    # bf16 rounds x - m (and the reference rounds it again): exp's relative error grows with |x - m|
    d = np.abs(x.astype(np.float64) - m.astype(np.float64))
    assert np.all(np.abs(out - ref) <= 2 * U_BF16 * (d + 2) * np.abs(ref) + 1e-6), np.abs(out - ref).max()


def test_subtracting_a_row_names_the_missing_api():
    @ts.kernel
    def minus_row(x: Tensor["M", "N", ts.bf16], r: Tensor["N", ts.bf16]) -> Tensor["M", "N", ts.bf16]:
        return x - r

    with pytest.raises(UnsupportedTTOperationError, match="subtracting a broadcast row"):
        ts.compile(minus_row, target="tenstorrent", shapes={"M": 32, "N": 64})


@ts.kernel
def scale_rows_add_bias(
    x: Tensor["M", "N", ts.bf16], s: Tensor["M", 1, ts.bf16], b: Tensor["N", ts.bf16]
) -> Tensor["M", "N", ts.bf16]:
    return ops.relu(x * s + b)


@needs_gxx
def test_row_and_column_broadcasts_run_in_the_emulator(tmp_path):
    """x * s[M, 1] + b[N]: a column broadcast (mul_tiles_bcast_cols) and a row broadcast
    (add_tiles_bcast_rows), edge tiles padded."""
    shapes = {"M": 50, "N": 70}
    k = ts.compile(scale_rows_add_bias, target="tenstorrent", shapes=shapes)
    assert "mul_tiles_bcast_cols(" in k.source and "add_tiles_bcast_rows(" in k.source
    (files,) = k.artifacts.values()
    plan = json.loads(files["plan"].read_text())
    rng = np.random.default_rng(8)
    bf16 = ts.bf16.numpy
    x, sc, b = (rng.standard_normal(s).astype(bf16) for s in ((50, 70), (50, 1), (70,)))
    arrays = {"x": x, "s": sc, "b": b}
    ins = {buf["name"]: arrays[buf["name"]].astype(np.float32) for buf in plan["buffers"] if buf["role"] == "input"}
    result = run_plan(plan, files["plan"].parent, ins, cache_dir=emu_cache())
    (out,) = [result[buf["name"]] for buf in plan["buffers"] if buf["role"] == "output"]
    ref = scale_rows_add_bias.reference(x, sc, b).astype(np.float64)
    xf, sf, bf = (a.astype(np.float64) for a in (x, sc, b))
    tol = 3 * U_BF16 * (np.abs(xf * sf) + np.abs(bf)) + 1e-6
    assert np.all(np.abs(out - ref) <= tol), np.abs(out - ref).max()
    swapped = np.maximum(xf * sf[::-1] + bf, 0)
    assert not np.all(np.abs(out - swapped) <= tol)  # the check can fail: other rows' scales do not match


BATCHED = [
    # a shared weight: one GEMM over every entry's rows (M ragged is fine)
    GemmSpec(50, 70, 45, batch=(3,), batch_b=(), dtype_a="float32", epilogue=(EpilogueOp("bias", operand="bias"),)),
    # both batched, with a residual per entry
    GemmSpec(64, 70, 96, batch=(2, 2), dtype_a="float32", epilogue=(EpilogueOp("residual", operand="r"),)),
    # a shared A, a batched transposed B
    GemmSpec(32, 64, 64, batch=(3,), batch_a=(), transpose_b=True, dtype_a="float32"),
]


@needs_gxx
@pytest.mark.parametrize("spec", BATCHED, ids=["shared_b", "both_batched_residual", "shared_a_transposed_b"])
def test_batched_gemms_run_in_the_emulator(spec, tmp_path):
    """A batched GEMM is one 2-D GEMM over the entries' rows; a batched B is read at each entry's offset."""
    lowered = tessera_tvm.lower(build_tile_program(spec, None, "tt"), "tenstorrent", out_dir=tmp_path / "k")
    rng = np.random.default_rng(6)
    ins = {p.name: rng.standard_normal(p.shape).astype(np.float32) for p in spec.inputs()}
    views = {n: v if v.ndim == 1 else v.reshape(-1, v.shape[-1]) for n, v in ins.items()}  # the 2-D views
    out = run_plan(lowered.artifacts["plan"], tmp_path / "k", views, cache_dir=emu_cache())["C"]
    b = np.swapaxes(ins["B"], -1, -2) if spec.transpose_b else ins["B"]
    ref = (ins["A"].astype(np.float64) @ b) + (ins["bias"] if "bias" in ins else 0) + (ins["r"] if "r" in ins else 0)
    assert out.shape == (math.prod(spec.batch) * spec.M, spec.N)
    size = np.abs(ins["A"]) @ np.abs(b) + 1
    tol = 4 * U_BF16 * size + 1e-6  # float32 buffers, DST in bf16 without fp32_dest_acc_en
    assert np.all(np.abs(out.reshape(ref.shape) - ref) <= tol), np.abs(out.reshape(ref.shape) - ref).max()


@ts.kernel
def batched_linear(
    X: Tensor["B", "S", "D", ts.bf16], W: Tensor["D", "F", ts.bf16], b: Tensor["F", ts.bf16]
) -> Tensor["B", "S", "F", ts.bf16]:
    return ops.relu(ops.matmul(X, W) + b)


@needs_gxx
def test_a_batched_linear_from_the_frontend_runs_in_the_emulator(tmp_path):
    shapes = {"B": 2, "S": 40, "D": 64, "F": 48}
    k = ts.compile(batched_linear, target="tenstorrent", shapes=shapes)
    (files,) = k.artifacts.values()
    plan = json.loads(files["plan"].read_text())
    rng = np.random.default_rng(7)
    bf16 = ts.bf16.numpy
    x, w, b = (rng.standard_normal(s).astype(bf16) for s in ((2, 40, 64), (64, 48), (48,)))
    arrays = {"X": x.reshape(80, 64), "W": w, "b": b}
    ins = {n: arrays[n].astype(np.float32) for n in (buf["name"] for buf in plan["buffers"] if buf["role"] == "input")}
    result = run_plan(plan, files["plan"].parent, ins, cache_dir=emu_cache())
    (out,) = [result[buf["name"]] for buf in plan["buffers"] if buf["role"] == "output"]
    ref = batched_linear.reference(x, w, b).astype(np.float64)
    pre = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)) + np.abs(b.astype(np.float64))
    tol = 4 * U_BF16 * pre + 2 * U_BF16 * np.abs(ref) + 1e-6
    assert np.all(np.abs(out.reshape(ref.shape) - ref) <= tol), np.abs(out.reshape(ref.shape) - ref).max()


@pytest.mark.parametrize(
    "spec, op",
    [
        (GemmSpec(64, 64, 64, batch=(2, 3), batch_a=(1, 3), dtype_a="bfloat16"), "batched matmul with a partly"),
        (GemmSpec(50, 64, 64, batch=(2,), dtype_a="bfloat16"), "batched matmul with a batched B and ragged"),
        (GemmSpec(64, 64, 64, dtype_a="float8_e4m3fn"), "matmul with dtype_a=float8_e4m3fn"),
        (GemmSpec(64, 64, 64, dtype_a="bfloat16", dtype_out="float32"), "matmul with mixed buffer dtypes"),
        (GemmSpec(64, 64, 64, dtype_a="float16", dtype_out="bfloat16"), "matmul with mixed buffer dtypes"),
        (ElementwiseSpec((32, 32), (("x", (32, 32), "float32"),), Binary("max", Input("x"), Input("x"))), "max"),
        (ElementwiseSpec((32, 32), (("x", (32, 32), "float32"),), Unary("abs", Input("x"))), "abs"),
        (
            ElementwiseSpec(
                (2, 32, 32),
                (("x", (32, 32), "float32"), ("y", (2, 32, 32), "float32")),
                Binary("add", Input("x"), Input("y")),
            ),
            "broadcast of x",
        ),
        (ReduceSpec((64, 64), axis=0), "reduce_sum over axes"),
        (
            ElementwiseSpec(
                (32, 32),
                (("x", (32, 32), "bfloat16"), ("y", (32, 32), "float32")),
                Binary("add", Input("x"), Input("y")),
                dtype_out="float32",
            ),
            "element-wise with mixed buffer dtypes",
        ),
    ],
    ids=[
        "partly_broadcast_batch",
        "ragged_batched_b",
        "fp8",
        "mixed",
        "mixed_f16_bf16",
        "max",
        "abs",
        "broadcast",
        "reduce_axis0",
        "mixed_inputs",
    ],
)
def test_generator_rejects_what_tt_cannot_lower_naming_the_op(spec, op):
    with pytest.raises(UnsupportedTTOperationError, match=rf"^{op}.*the Tenstorrent target does not support"):
        build_tile_program(spec, None, "tenstorrent")


def test_tenstorrent_schedule_text_says_how_blocks_run():
    @ts.kernel
    def add_relu(x: Tensor["M", "N", ts.bf16], y: Tensor["M", "N", ts.bf16]) -> Tensor["M", "N", ts.bf16]:
        return ops.relu(x + y)

    text = ts.compile(add_relu, target="tenstorrent", shapes={"M": 64, "N": 96}).inspect_ir("sched")
    assert "Tenstorrent: each core loops over its 32x32 output tiles" in text and "CPU" not in text
