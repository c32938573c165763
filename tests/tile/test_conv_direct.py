"""The CPU's direct convolution program (tile/conv.py, tessera/cpu_conv.h) against numpy, and the
planner's choice between it and the implicit GEMM."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_tvm import planner
from tessera_tvm.tile import Conv2dSpec, EpilogueOp, SpecError, TileSchedule
from tessera_tvm.tile.conv import direct_layout

from .conftest import as64, assert_close, random_inputs, run_cpu
from .test_conv import conv2d_reference

EPILOGUE = (EpilogueOp("bias", "b"), EpilogueOp("residual", "skip"), EpilogueOp("relu"))

CASES = {
    # name: (N, C, H, W, O, R, S, stride, padding, dilation, groups); several features per kernel,
    # each case one compile.
    # batch 2, 2 groups of 10 output channels (a strip of 8 and one of 2), ResNet's 3x3 with its epilogue
    "3x3-batch2-groups2-O20-epilogue": (2, 6, 9, 9, 20, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),
    "1x1-7x7": (1, 16, 7, 7, 24, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "5x5-dilation2-asymmetric": (1, 5, 11, 13, 9, 5, 5, (1, 1), (4, 3, 5, 2), (2, 2), 1),
    "3x3-on-a-1x1-image": (1, 8, 1, 1, 12, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    # strides through the phase split: ResNet's stem and its downsampling convs
    "7x7-stride2": (1, 3, 30, 31, 16, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1),
    "3x3-stride2-odd": (2, 5, 13, 14, 9, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "1x1-stride2": (1, 8, 14, 14, 12, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1),
    "3x2-stride2x1-dilated": (1, 4, 12, 10, 7, 3, 2, (2, 1), (0, 1, 2, 0), (2, 3), 1),
}


def _direct(spec: Conv2dSpec, **blocks) -> TileSchedule:
    schedule = planner.schedule_for(spec, "cpu", {"conv_algorithm": "direct", **blocks})
    assert schedule.conv_algorithm == "direct"
    return schedule


def _check(spec: Conv2dSpec, schedule: TileSchedule, tmp_path, dtype="float32", seed=0):
    inputs = random_inputs(spec, seed=seed)
    out = run_cpu(spec, inputs, "cpu", tmp_path, schedule)["Y"]
    stride, padding, dilation, groups = spec.stride, spec.padding, spec.dilation, spec.groups
    expected = conv2d_reference(inputs["X"], inputs["W"], stride, padding, dilation, groups)
    if spec.epilogue:
        expected = np.maximum(expected + as64(inputs["b"]) + as64(inputs["skip"]), 0)
    assert out.shape == expected.shape == spec.shape_out
    assert_close(out, expected, dtype, atol_scale=spec.C // groups * spec.R * spec.S / 16)


@pytest.mark.parametrize("name", CASES)
def test_the_direct_program_matches_numpy(name, tmp_path):
    n, c, h, w, o, r, s, stride, padding, dilation, groups = CASES[name]
    epilogue = EPILOGUE if "epilogue" in name else ()
    spec = Conv2dSpec(
        n, c, h, w, o, r, s, stride=stride, padding=padding, dilation=dilation, groups=groups, epilogue=epilogue
    )
    _check(spec, _direct(spec), tmp_path)


def test_small_blocks_split_rows_channels_and_k_steps_anywhere(tmp_path):
    # 3 output rows per block (the last block 2), 16 channels of 20 (a block of 4), K steps of 20
    # (a step ends inside a channel's window): every edge of the block loops.
    spec = Conv2dSpec(1, 7, 11, 12, 20, 3, 3, padding=(1, 1, 1, 1))
    schedule = _direct(spec, block_m=16, block_n=3, block_k=20)
    assert (schedule.block_m, schedule.block_n, schedule.block_k) == (16, 3, 20)
    _check(spec, schedule, tmp_path)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_inputs_are_widened_as_they_are_copied(dtype, tmp_path):
    # fp16/bf16 weights are packed (converted) as A strips; the input converted into the fp32 buffer.
    spec = Conv2dSpec(1, 6, 10, 9, 10, 3, 3, padding=(1, 1, 1, 1), dtype_in=dtype, dtype_out="float32")
    _check(spec, _direct(spec), tmp_path, dtype)


# ------------------------------------------------------------------------------------- planner


@pytest.mark.parametrize(
    "channels, size, stride, kernel",
    [(64, 56, 1, 3), (128, 28, 1, 3), (256, 14, 1, 3), (512, 7, 1, 3), (3, 224, 2, 7), (64, 56, 2, 1)],
    ids=["56x56", "28x28", "14x14", "7x7", "stem-7x7-s2", "downsample-1x1-s2"],
)
def test_the_direct_program_fits_resnets_convolutions(channels, size, stride, kernel):
    # (The planner runs the 3x3 stride-1 ones above 7x7 as Winograd: test_conv_winograd.py.)
    out = max(channels, 64)
    spec = Conv2dSpec(1, channels, size, size, out, kernel, kernel, stride=(stride, stride), padding=(kernel // 2,) * 4)
    schedule = _direct(spec)
    assert schedule.block_m == 64  # 8 strips of the 8-channel register tile
    # The block's accumulator and the padded input's rows fit: the resource check passed.
    assert direct_layout(spec, schedule.block_n)["acc_stride"] * schedule.block_m <= 112 * 1024


def test_the_planner_keeps_the_implicit_gemm_where_the_padded_width_wastes_most():
    # A dilated window whose padding doubles the row: the direct program would compute 16 padded
    # columns per 8 outputs.
    spec = Conv2dSpec(1, 32, 8, 8, 64, 3, 3, padding=(4, 4, 4, 4), dilation=(4, 4))
    assert planner.schedule_for(spec, "cpu").conv_algorithm == "implicit_gemm"
    assert planner.schedule_for(spec, "cpu", {"conv_algorithm": "direct"}).conv_algorithm == "direct"


def test_an_override_refits_the_blocks_for_its_algorithm():
    spec = Conv2dSpec(1, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1))
    direct = planner.schedule_for(spec, "cpu")
    implicit = planner.schedule_for(spec, "cpu", {"conv_algorithm": "implicit_gemm"})
    assert implicit == TileSchedule.from_config("cpu", spec, conv_algorithm="implicit_gemm")
    assert (implicit.block_m, implicit.block_n) != (direct.block_m, direct.block_n)  # pixels x channels
    assert implicit.fingerprint() != direct.fingerprint()  # the kernels are cached apart
    with pytest.raises(SpecError, match="conv_algorithm is 'fft'"):
        planner.schedule_for(spec, "cpu", {"conv_algorithm": "fft"})


def test_depthwise_convolutions_keep_their_own_program():
    spec = Conv2dSpec(1, 8, 12, 12, 8, 3, 3, padding=(1, 1, 1, 1), groups=8)
    assert planner.schedule_for(spec, "cpu").conv_algorithm == ""
    with pytest.raises(SpecError, match="depthwise convolution runs its own program"):
        planner.schedule_for(spec, "cpu", {"conv_algorithm": "direct"})


def test_the_schedule_text_names_the_algorithm():
    from tessera.schedule import choose_schedule

    spec = Conv2dSpec(1, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1))
    text = choose_schedule("conv", "conv2d", spec, "cpu", {"conv_algorithm": "direct"}).text()
    assert "block_m=64 block_n=28 block_k=576  conv_algorithm=direct" in text
    assert "grid=[1, 2, 1]" in text
    gemm = choose_schedule("conv", "conv2d", spec, "cpu", {"conv_algorithm": "implicit_gemm"}).text()
    assert "conv_algorithm=implicit_gemm" in gemm


def test_a_config_may_pin_the_algorithm(tmp_path):
    from pathlib import Path

    from tessera_tvm import ConfigError, load_config

    cpu = (Path(__file__).parents[2] / "configs" / "cpu.yaml").read_text()
    assert "\nschedule:\n" in cpu
    spec = Conv2dSpec(1, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1))
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(cpu.replace("\nschedule:\n", "\nschedule:\n  conv2d: {conv_algorithm: implicit_gemm}\n"))
    assert planner.schedule_for(spec, load_config(pinned)).conv_algorithm == "implicit_gemm"
    assert planner.schedule_for(spec, load_config(pinned), {"conv_algorithm": "direct"}).conv_algorithm == "direct"
    bad = tmp_path / "bad.yaml"
    bad.write_text(cpu.replace("\nschedule:\n", "\nschedule:\n  conv2d: {conv_algorithm: fft}\n"))
    with pytest.raises(ConfigError, match="conv_algorithm"):
        load_config(bad)


def test_both_programs_without_avx512(tmp_path):
    # The register tiles of a CPU without AVX-512 (AVX2: 6 x 2 vectors of 8 floats for both programs;
    # its pixel tile, 16 floats, is narrower than the slack). This machine compiles with -march=native;
    # a config that asks for x86-64-v3 builds the kernels without AVX-512, as such a CPU would.
    import platform
    import shutil
    import subprocess
    from pathlib import Path

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("an x86-64 ISA level")
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) shows which registers the library uses")
    cpu = (Path(__file__).parents[2] / "configs" / "cpu.yaml").read_text()
    assert "-march=native" in cpu
    avx2 = tmp_path / "cpu_avx2.yaml"
    avx2.write_text(cpu.replace("-march=native", "-march=x86-64-v3"))
    spec = Conv2dSpec(1, 6, 9, 11, 20, 3, 3, stride=(2, 1), padding=(1, 1, 1, 1), epilogue=EPILOGUE)
    for algorithm in ("direct", "implicit_gemm"):
        schedule = planner.schedule_for(spec, "cpu", {"conv_algorithm": algorithm})
        inputs = random_inputs(spec)
        out = run_cpu(spec, inputs, str(avx2), tmp_path / algorithm, schedule)["Y"]
        # Built for the ISA level asked for: no AVX-512 register in the library's code.
        (library,) = (tmp_path / algorithm).glob("*.so")
        code = subprocess.run([objdump, "-d", str(library)], capture_output=True, text=True, check=True).stdout
        assert "%ymm" in code and "%zmm" not in code, algorithm
        expected = conv2d_reference(inputs["X"], inputs["W"], spec.stride, spec.padding, spec.dilation, 1)
        expected = np.maximum(expected + as64(inputs["b"]) + as64(inputs["skip"]), 0)
        assert_close(out, expected, "float32", atol_scale=spec.C * 9 / 16)
