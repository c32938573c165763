"""Tenstorrent GEMMs beyond the plain form: ``transpose_a`` (each A tile transposed on its way into
DST with ``transpose_wh_tile``, the products summed through a carried CB), run in the emulator."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops
from tessera_tvm.target.tt.transform.common import UnsupportedTTOperationError
from tessera_tvm.tile import GemmSpec, build_tile_program
from tests.conftest import emu_cache

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
U_BF16 = 2.0**-8


@ts.kernel
def at_b(A: Tensor["K", "M", ts.bf16], B: Tensor["K", "N", ts.bf16]) -> Tensor["M", "N", ts.bf16]:
    return ops.matmul(A, B, transpose_a=True)


@ts.kernel
def at_bt_relu(A: Tensor["K", "M", ts.f32], B: Tensor["N", "K", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.relu(ops.matmul(A, B, transpose_a=True, transpose_b=True))


@ts.kernel
def batched_at_b(
    A: Tensor["E", "K", "M", ts.bf16], B: Tensor["E", "K", "N", ts.bf16]
) -> Tensor["E", "M", "N", ts.bf16]:
    return ops.matmul(A, B, transpose_a=True)


@needs_gxx
@pytest.mark.parametrize(
    "kernel, shapes",
    [
        (at_b, {"M": 64, "N": 96, "K": 128}),
        (at_b, {"M": 50, "N": 40, "K": 70}),  # ragged: A's padding is transposed with it
        (at_bt_relu, {"M": 40, "N": 72, "K": 45}),
        (batched_at_b, {"E": 2, "M": 64, "N": 32, "K": 64}),
    ],
    ids=["bf16", "bf16_ragged", "f32_both_transposed_relu", "batched"],
)
def test_transposed_a_runs_in_the_emulator(kernel, shapes, tmp_path):
    compiled = ts.compile(kernel, target="tenstorrent", shapes=shapes)
    (files,) = compiled.artifacts.values()
    compute = files["compute"].read_text()
    assert "transpose_wh_tile(" in compute and "matmul_tiles(" in compute
    rng = np.random.default_rng(sum(shapes.values()))
    arrays = []
    for _, annotation in kernel.params:
        shape = tuple(shapes[d] for d in annotation.dims)
        arrays.append(rng.standard_normal(shape).astype(annotation.dtype.numpy))
    out = compiled.emulate(*arrays, cache_dir=emu_cache()).astype(np.float64)
    ref = kernel.reference(*arrays).astype(np.float64)
    u = U_BF16 if arrays[0].dtype != np.float32 else 2.0**-20
    # each K step's product is packed (rounded) once and added to the carried sum (rounded again)
    steps = -(-shapes["K"] // 32)
    a, b = (x.astype(np.float64) for x in arrays)
    bound = np.abs(np.swapaxes(a, -1, -2)) @ (np.abs(np.swapaxes(b, -1, -2)) if kernel is at_bt_relu else np.abs(b))
    assert np.all(np.abs(out - ref) <= (steps + 2) * u * bound + 1e-5), np.abs(out - ref).max()


def test_a_batched_transposed_a_with_ragged_k_is_refused_naming_it():
    spec = GemmSpec(64, 64, 40, batch=(2,), batch_b=(1,), dtype_a="bfloat16", transpose_a=True)  # a shared B
    with pytest.raises(UnsupportedTTOperationError, match=r"^batched matmul with transpose_a and a ragged K"):
        build_tile_program(spec, None, "tenstorrent")


@ts.kernel
def add_bf16(x: Tensor["M", "N", ts.bf16], y: Tensor["M", "N", ts.bf16]) -> Tensor["M", "N", ts.bf16]:
    return x + y


def test_fp32_dest_accumulation_is_on_for_kernels_that_hold_float32():
    """``fp32_dest_acc_en: auto`` (configs/tenstorrent.yaml): a bf16 GEMM accumulates in float32, so its
    DST holds fp32 (8 tiles); a bf16 element-wise kernel keeps 16-bit DST (16 tiles)."""
    shapes = {"M": 64, "N": 64, "K": 64}
    for kernel, on in ((at_b, True), (add_bf16, False)):
        compiled = ts.compile(kernel, target="tenstorrent", shapes={k: v for k, v in shapes.items() if k != "K" or on})
        (files,) = compiled.artifacts.values()
        plan = files["plan"].read_text()
        assert f'"fp32_dest_acc_en": {str(on).lower()}' in plan
        assert f".fp32_dest_acc_en = {str(on).lower()}," in files["host"].read_text()


# ---- blocks of several output tiles per core: accumulators in DST tiles 0..bm*bn-1 ----


@ts.kernel
def linear_gelu(
    A: Tensor["M", "K", ts.bf16], W: Tensor["K", "N", ts.bf16], b: Tensor["N", ts.bf16]
) -> Tensor["M", "N", ts.bf16]:
    return ops.gelu(ops.matmul(A, W) + b)


@ts.kernel
def f32_nt(A: Tensor["M", "K", ts.f32], W: Tensor["N", "K", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.matmul(A, W, transpose_b=True)


@ts.kernel
def batched_bmm(A: Tensor["E", "M", "K", ts.bf16], B: Tensor["E", "K", "N", ts.bf16]) -> Tensor["E", "M", "N", ts.bf16]:
    return ops.matmul(A, B)


@needs_gxx
@pytest.mark.parametrize(
    "kernel, shapes, block",
    [
        (linear_gelu, {"M": 64, "N": 128, "K": 96}, (64, 64)),
        (f32_nt, {"M": 96, "N": 64, "K": 50}, (32, 64)),  # ragged K: padded with zeros, one block row
        (batched_bmm, {"E": 2, "M": 64, "N": 32, "K": 64}, (64, 32)),
    ],
    ids=["2x2_bias_gelu", "1x2_f32_transposed_b", "2x1_batched"],
)
def test_gemm_blocks_of_several_tiles_run_in_the_emulator(kernel, shapes, block, tmp_path):
    compiled = ts.compile(
        kernel, target="tenstorrent", shapes=shapes, schedule={"block_m": block[0], "block_n": block[1]}
    )
    (files,) = compiled.artifacts.values()
    compute = files["compute"].read_text()
    tiles = (block[0] // 32) * (block[1] // 32)
    loop = compute[compute.index("tile_regs_acquire();") : compute.index("tile_regs_commit();")]
    assert "for (uint32_t k = 0;" in loop  # one DST phase around the whole K loop
    assert loop.count("matmul_tiles(") == tiles and f", {tiles - 1}, " in loop  # into DST tiles 0..tiles-1
    assert "cb_zeros" not in compute  # the clears are DST's zeros at tile_regs_acquire, not a constant tile
    rng = np.random.default_rng(7)
    arrays = [
        rng.standard_normal(tuple(shapes[d] for d in annotation.dims)).astype(annotation.dtype.numpy)
        for _, annotation in kernel.params
    ]
    out = compiled.emulate(*arrays, cache_dir=emu_cache()).astype(np.float64)
    ref = kernel.reference(*arrays).astype(np.float64)
    u = 2.0**-20 if arrays[0].dtype == np.float32 else U_BF16
    assert np.all(np.abs(out - ref) <= u * np.abs(ref) + 4 * u * np.abs(ref).max() + 1e-6), np.abs(out - ref).max()


@pytest.mark.parametrize(
    "spec, block, error, match",
    [
        (GemmSpec(96, 64, 64, dtype_a="bfloat16"), (96, 64), "SpecError", "6 tiles; a block keeps one fp32"),
        (GemmSpec(96, 64, 64, dtype_a="bfloat16"), (64, 32), "SpecError", "blocks must tile it exactly"),
        (
            GemmSpec(64, 64, 64, dtype_a="bfloat16", transpose_a=True),
            (64, 64),
            "Unsupported",
            "^matmul with transpose_a in blocks",
        ),
    ],
    ids=["too_many_tiles", "ragged_edge", "transpose_a"],
)
def test_gemm_blocks_the_target_cannot_run_are_refused(spec, block, error, match):
    from tessera_tvm.tile import SpecError
    from tessera_tvm.tile.schedule import TileSchedule

    schedule = TileSchedule(block_m=block[0], block_n=block[1], block_k=32, stages=1, threads=1)
    with pytest.raises(SpecError if error == "SpecError" else UnsupportedTTOperationError, match=match):
        build_tile_program(spec, schedule, "tenstorrent")


@needs_gxx
def test_a_16_bit_dst_accumulates_a_long_k_loop_in_bf16(tmp_path):
    """With ``fp32_dest_acc_en: false`` the emulator rounds every DST result to bf16, as 16-bit DST
    does: a K=1024 bf16 GEMM then drifts from fp32 accumulation (auto's choice for a GEMM)."""
    import tessera_tvm
    from tessera_tvm.target.tt.emulate import run_plan
    from tests.target.tt.transform.helpers import tt_config

    spec = GemmSpec(32, 32, 1024, dtype_a="bfloat16")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((32, 1024)).astype(ts.bf16.numpy)
    b = rng.standard_normal((1024, 32)).astype(ts.bf16.numpy)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    errors = {}
    for fp32 in ("auto", False):
        out = tmp_path / str(fp32)
        config = tt_config(tt={"fp32_dest_acc_en": fp32})
        lowered = tessera_tvm.lower(build_tile_program(spec, None, "tt"), config, out_dir=out)
        assert f'"fp32_dest_acc_en": {"true" if fp32 == "auto" else "false"}' in lowered.artifacts["plan"].read_text()
        names = [p.name for p in spec.params()]
        inputs = {names[0]: a.astype(np.float32), names[1]: b.astype(np.float32)}
        (got,) = run_plan(lowered.artifacts["plan"], out, inputs, cache_dir=emu_cache()).values()
        errors[fp32] = np.abs(got - ref).max() / np.abs(ref).max()
    assert errors["auto"] <= U_BF16  # one rounding, at the pack
    assert errors[False] > 2 * errors["auto"], errors  # 32 K steps, each rounded to bf16 in DST
