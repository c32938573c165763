"""The CPU's Winograd F(4x4, 3x3) convolution program (tile/conv.py, tessera/cpu_winograd.h) against
numpy, the planner's choice of it, and the clear errors where it cannot run.

Tolerance: F(4x4)'s transforms (entries up to 8 and 1/24) scale fp32 rounding by about 15x the
direct program's (2e-5 against 1.3e-6 at most on outputs of rms 1.4, 64 channels, float64 reference),
so the absolute tolerance is WINOGRAD_ERROR times the direct program's."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_tvm import planner
from tessera_tvm.tile import Conv2dSpec, EpilogueOp, SpecError, TileSchedule, build_tile_program
from tessera_tvm.tile.conv import winograd_layout
from tessera_tvm.tile.resources import local_bytes

from .conftest import as64, assert_close, random_inputs, run_cpu
from .test_conv import conv2d_reference

WINOGRAD_ERROR = 16
EPILOGUE = (EpilogueOp("bias", "b"), EpilogueOp("residual", "skip"), EpilogueOp("relu"))


def _winograd(spec: Conv2dSpec, **blocks) -> TileSchedule:
    schedule = planner.schedule_for(spec, "cpu", {"conv_algorithm": "winograd", **blocks})
    assert schedule.conv_algorithm == "winograd"
    return schedule


def _check(spec: Conv2dSpec, schedule: TileSchedule, tmp_path, config="cpu", dtype="float32"):
    inputs = random_inputs(spec)
    out = run_cpu(spec, inputs, config, tmp_path, schedule)["Y"]
    expected = conv2d_reference(inputs["X"], inputs["W"], spec.stride, spec.padding, spec.dilation, spec.groups)
    if spec.epilogue:
        expected = np.maximum(expected + as64(inputs["b"]) + as64(inputs["skip"]), 0)
    assert out.shape == expected.shape == spec.shape_out
    assert_close(out, expected, dtype, atol_scale=WINOGRAD_ERROR * spec.C // spec.groups * 9 / 16)


CASES = {
    # name: (N, C, H, W, O, padding, groups, blocks); one compile each, several features per case.
    # batch 2, 2 groups of 3 -> 10 channels (under a vector), 11x13 outputs (ragged 4x4 tiles), epilogue
    "batch2-groups2-ragged-epilogue": (2, 6, 11, 13, 20, (1, 1, 1, 1), 2, {}),
    # no padding, 17 -> 33 channels in blocks of 16 (16, 16, 1), 12x7 outputs in blocks of 9 rows and
    # chunks of 5 (tile rows of 2 tiles: a strip of the micro-kernel spans several tile rows)
    "padding0-small-blocks": (1, 17, 14, 9, 33, (0, 0, 0, 0), 1, {"block_m": 16, "block_n": 9, "block_k": 5}),
}


@pytest.mark.parametrize("name", CASES)
def test_the_winograd_program_matches_numpy(name, tmp_path):
    n, c, h, w, o, padding, groups, blocks = CASES[name]
    epilogue = EPILOGUE if "epilogue" in name else ()
    spec = Conv2dSpec(n, c, h, w, o, 3, 3, padding=padding, groups=groups, epilogue=epilogue)
    schedule = _winograd(spec, **blocks)
    assert all(getattr(schedule, field) == value for field, value in blocks.items())
    _check(spec, schedule, tmp_path)


def test_bfloat16_inputs_are_widened_as_they_are_transformed(tmp_path):
    spec = Conv2dSpec(1, 6, 9, 10, 12, 3, 3, padding=(1, 1, 1, 1), dtype_in="bfloat16", dtype_out="float32")
    _check(spec, _winograd(spec), tmp_path, dtype="bfloat16")


def test_the_program_without_avx512(tmp_path):
    # The C routines' portable paths (AVX2: 8-float vectors, strips of 6 tiles and 16 channels): a
    # config that asks for x86-64-v3 builds the kernel as such a CPU would (see test_conv_direct.py).
    import platform
    import shutil
    import subprocess
    from pathlib import Path

    if platform.machine() not in ("x86_64", "AMD64") or shutil.which("objdump") is None:
        pytest.skip("an x86-64 ISA level, and objdump to show the registers the library uses")
    cpu = (Path(__file__).parents[2] / "configs" / "cpu.yaml").read_text()
    avx2 = tmp_path / "cpu_avx2.yaml"
    avx2.write_text(cpu.replace("-march=native", "-march=x86-64-v3"))
    # Asymmetric padding, 5 rows of 8 outputs (the last tile row mostly past the image), chunks of 4
    spec = Conv2dSpec(1, 5, 4, 7, 20, 3, 3, padding=(0, 2, 3, 1), epilogue=EPILOGUE)
    assert spec.shape_out == (1, 20, 5, 8)
    _check(spec, _winograd(spec, block_k=4), tmp_path, config=str(avx2))
    (library,) = tmp_path.glob("*.so")
    code = subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    assert "%ymm" in code and "%zmm" not in code


# ------------------------------------------------------------------------------------- planner


@pytest.mark.parametrize(
    "channels, size, algorithm",
    [(64, 56, "winograd"), (128, 28, "winograd"), (256, 14, "winograd"), (512, 7, "direct")],
    ids=["56x56", "28x28", "14x14", "7x7"],
)
def test_the_planner_runs_resnets_3x3_convolutions_as_winograd_above_7x7(channels, size, algorithm):
    # Measured at 1 and 2 threads (bench.py --only conv): 2.5x, 2.4x, 1.2x the direct program; at 7x7
    # 0.5x (37 MB of transformed weights for 4 tiles of 512 channels).
    spec = Conv2dSpec(1, channels, size, size, channels, 3, 3, padding=(1, 1, 1, 1))
    schedule = planner.schedule_for(spec, "cpu")
    assert schedule.conv_algorithm == algorithm
    if algorithm == "winograd":
        assert schedule.block_m == 64 and schedule.block_n % 4 == schedule.block_k % 4 == 0
        assert local_bytes(spec, schedule) <= 256 * 1024  # a chunk's accumulator: the resource check passed


def test_the_schedule_of_resnets_first_convolutions():
    spec = Conv2dSpec(1, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1))
    schedule = planner.schedule_for(spec, "cpu")
    # 2 blocks of 7 tile rows (every core busy), chunks of 3 tile rows (42 tiles: 3 strips of 14)
    assert (schedule.block_m, schedule.block_n, schedule.block_k) == (64, 28, 12)
    layout = winograd_layout(spec, schedule)
    assert (layout["tile_w"], layout["chunk_rows"], layout["row_stride"]) == (14, 3, 64)

    from tessera.schedule import choose_schedule

    text = choose_schedule("conv", "conv2d", spec, "cpu").text()
    assert "block_m=64 block_n=28 block_k=12  conv_algorithm=winograd" in text and "grid=[1, 2, 1]" in text


def test_small_planes_and_other_windows_keep_the_other_programs():
    small = Conv2dSpec(2, 16, 10, 10, 16, 3, 3, padding=(1, 1, 1, 1))  # 9 tiles per image
    assert planner.schedule_for(small, "cpu").conv_algorithm == "direct"
    strided = Conv2dSpec(1, 64, 56, 56, 64, 3, 3, stride=(2, 2), padding=(1, 1, 1, 1))
    assert planner.schedule_for(strided, "cpu").conv_algorithm == "direct"
    pointwise = Conv2dSpec(1, 64, 56, 56, 64, 1, 1)
    assert planner.schedule_for(pointwise, "cpu").conv_algorithm == "direct"


def test_a_user_may_refuse_it():
    spec = Conv2dSpec(1, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1))
    for algorithm in ("direct", "implicit_gemm"):
        assert planner.schedule_for(spec, "cpu", {"conv_algorithm": algorithm}).conv_algorithm == algorithm


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"stride": (2, 2)}, r"stride is \(2, 2\); Winograd F\(4x4, 3x3\) takes stride \(1, 1\)"),
        ({"R": 5, "S": 5}, r"the window is 5x5; Winograd F\(4x4, 3x3\) takes 3x3 windows"),
        ({"R": 3, "S": 1}, r"the window is 3x1"),
        ({"dilation": (2, 2)}, r"dilation is \(2, 2\); Winograd F\(4x4, 3x3\) takes dilation \(1, 1\)"),
        ({"groups": 8}, r"a depthwise convolution runs its own program"),
    ],
    ids=["stride", "5x5", "3x1", "dilation", "depthwise"],
)
def test_forcing_it_where_it_cannot_run_names_the_value_and_what_it_takes(kwargs, message):
    shape = {"N": 1, "C": 8, "H": 12, "W": 12, "O": 8, "R": 3, "S": 3}
    shape.update({k: kwargs.pop(k) for k in ("R", "S") if k in kwargs})
    spec = Conv2dSpec(**shape, padding=(1, 1, 1, 1), **kwargs)
    with pytest.raises(SpecError, match="conv_algorithm='winograd' cannot run this convolution: " + message):
        planner.schedule_for(spec, "cpu", {"conv_algorithm": "winograd"})
    # A schedule built by hand is refused by the tile program the same way.
    with pytest.raises(SpecError, match=message):
        build_tile_program(spec, TileSchedule(conv_algorithm="winograd"), "c")


def test_the_gpu_has_no_winograd_program():
    spec = Conv2dSpec(1, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1))
    with pytest.raises(SpecError, match="the GPU has no Winograd convolution"):
        planner.schedule_for(spec, "hopper", {"conv_algorithm": "winograd"})
