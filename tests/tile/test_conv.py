"""The CPU convolution tile program (implicit GEMM on the packed micro-kernel) against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_tvm import TesseraError
from tessera_tvm.tile import Conv2dSpec, EpilogueOp, SpecError, TileSchedule, build_tile_program

from .conftest import as64, assert_close, random_inputs, run_cpu


def conv2d_reference(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """float64 NCHW x OIHW convolution, one window offset (and group) at a time."""
    if groups > 1:
        xs, ws = np.split(as64(x), groups, axis=1), np.split(as64(w), groups, axis=0)
        return np.concatenate(
            [conv2d_reference(a, b, stride, padding, dilation) for a, b in zip(xs, ws, strict=True)], axis=1
        )
    x, w = as64(x), as64(w)
    n, c, h, width = x.shape
    o, _, r, s = w.shape
    top, left, bottom, right = padding
    padded = np.zeros((n, c, h + top + bottom, width + left + right))
    padded[:, :, top : top + h, left : left + width] = x
    oh = (h + top + bottom - dilation[0] * (r - 1) - 1) // stride[0] + 1
    ow = (width + left + right - dilation[1] * (s - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(r):
        for j in range(s):
            y0, x0 = i * dilation[0], j * dilation[1]
            window = padded[
                :, :, y0 : y0 + stride[0] * (oh - 1) + 1 : stride[0], x0 : x0 + stride[1] * (ow - 1) + 1 : stride[1]
            ]
            out += np.einsum("nchw,oc->nohw", window, w[:, :, i, j])
    return out


CASES = [
    # (N, C, H, W, O, R, S, stride, padding, dilation): ResNet's 3x3 and 1x1, a strided 7x7 stem,
    # asymmetric padding, dilation, odd sizes that leave ragged pixel/channel/depth blocks.
    (2, 16, 9, 9, 24, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 32, 7, 7, 40, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1)),
    (1, 3, 23, 23, 16, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1)),
    (3, 5, 11, 8, 7, 3, 2, (2, 1), (0, 1, 2, 0), (1, 1)),
    (1, 8, 12, 12, 9, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2)),
    # Rows wider than the micro-kernel's strip: whole strips in one output row take the packer's
    # straight-copy path (padding columns on either side, dilated windows).
    (2, 6, 17, 45, 10, 3, 3, (1, 1), (1, 2, 1, 0), (1, 1)),
    (1, 4, 9, 40, 8, 5, 3, (1, 1), (0, 3, 2, 3), (2, 3)),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[5]}x{c[6]}-s{c[7][0]}-{i}" for i, c in enumerate(CASES)])
def test_conv2d_matches_numpy(case, cpu_config, tmp_path):
    n, c, h, w, o, r, s, stride, padding, dilation = case
    spec = Conv2dSpec(n, c, h, w, o, r, s, stride=stride, padding=padding, dilation=dilation)
    inputs = random_inputs(spec)
    # Small blocks as well as the default: several pixel, channel and depth blocks with ragged edges.
    for schedule in (None, TileSchedule(block_m=28, block_n=32, block_k=16)):
        out = run_cpu(spec, inputs, cpu_config, tmp_path / str(schedule is None), schedule)["Y"]
        expected = conv2d_reference(inputs["X"], inputs["W"], stride, padding, dilation)
        assert out.shape == expected.shape == spec.shape_out
        assert_close(out, expected, "float32", atol_scale=c * r * s / 16)


GROUPED = [
    # (N, C, H, W, O, R, S, stride, padding, dilation, groups): ResNeXt-style groups, depthwise
    # (MobileNet's 3x3, ConvNeXt's 7x7, a channel multiplier of 2), strided and dilated depthwise.
    (2, 12, 9, 9, 18, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3),
    (2, 8, 11, 13, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 8),
    (1, 6, 14, 14, 6, 7, 7, (1, 1), (3, 3, 3, 3), (1, 1), 6),
    (1, 4, 10, 9, 8, 3, 3, (2, 2), (1, 0, 1, 2), (1, 1), 4),
    (1, 5, 12, 12, 5, 3, 3, (1, 2), (2, 2, 2, 2), (2, 1), 5),
    # Depthwise rows of several vectors (tessera_cpu_depthwise_f32): blocks of 4 output rows with 2
    # rows left, a last vector that overlaps the one before; a 7x7 and a 5x3 window; a dilated one
    # (a row at a time).
    (1, 4, 18, 37, 4, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 4),
    (2, 3, 21, 40, 6, 7, 7, (1, 1), (3, 3, 3, 3), (1, 1), 3),
    (1, 2, 13, 35, 2, 5, 3, (1, 1), (2, 1, 2, 1), (1, 1), 2),
    (1, 2, 16, 33, 2, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 2),
]


@pytest.mark.parametrize("case", GROUPED, ids=[f"g{c[10]}-{c[5]}x{c[6]}-{i}" for i, c in enumerate(GROUPED)])
def test_grouped_and_depthwise_conv2d_match_numpy(case, cpu_config, tmp_path):
    n, c, h, w, o, r, s, stride, padding, dilation, groups = case
    spec = Conv2dSpec(n, c, h, w, o, r, s, stride=stride, padding=padding, dilation=dilation, groups=groups)
    assert spec.depthwise == (c == groups)
    inputs = random_inputs(spec)
    assert inputs["W"].shape == (o, c // groups, r, s)
    out = run_cpu(spec, inputs, cpu_config, tmp_path)["Y"]
    expected = conv2d_reference(inputs["X"], inputs["W"], stride, padding, dilation, groups)
    assert out.shape == expected.shape
    assert_close(out, expected, "float32", atol_scale=c // groups * r * s / 16)


def test_conv2d_epilogue_bias_residual_and_relu_in_float16(cpu_config, tmp_path):
    epilogue = (EpilogueOp("bias", "b"), EpilogueOp("residual", "skip"), EpilogueOp("relu"))
    spec = Conv2dSpec(2, 8, 10, 10, 8, 3, 3, padding=(1, 1, 1, 1), dtype_in="float16", epilogue=epilogue)
    assert [p.shape for p in spec.inputs()] == [(2, 8, 10, 10), (8, 8, 3, 3), (1, 8, 1, 1), (2, 8, 10, 10)]
    inputs = random_inputs(spec, seed=1)
    out = run_cpu(spec, inputs, cpu_config, tmp_path)["Y"]
    conv = conv2d_reference(inputs["X"], inputs["W"], padding=(1, 1, 1, 1))
    expected = np.maximum(conv + as64(inputs["b"]) + as64(inputs["skip"]), 0)
    assert out.dtype == np.float16
    assert_close(out, expected, "float16", atol_scale=4)


RELU6 = (EpilogueOp("max_scalar", value=0.0), EpilogueOp("min_scalar", value=6.0))


@pytest.mark.parametrize("groups", [1, 6], ids=["implicit-gemm", "depthwise"])
def test_conv2d_with_a_bias_and_relu6_clips_both_ends(groups, cpu_config, tmp_path):
    # MobileNet's conv + bias + ReLU6: the clip's two bounds are two epilogue steps.
    spec = Conv2dSpec(
        1, 6, 9, 9, 6, 3, 3, padding=(1, 1, 1, 1), groups=groups, epilogue=(EpilogueOp("bias", "b"), *RELU6)
    )
    inputs = random_inputs(spec, seed=3)
    inputs["X"] *= 4  # outputs well past both bounds
    out = run_cpu(spec, inputs, cpu_config, tmp_path)["Y"]
    conv = conv2d_reference(inputs["X"], inputs["W"], padding=(1, 1, 1, 1), groups=groups) + as64(inputs["b"])
    assert (conv < 0).any() and (conv > 6).any()
    assert_close(out, np.clip(conv, 0, 6), "float32", atol_scale=54 / 16)


def test_bad_conv_specs_are_refused_by_name():
    with pytest.raises(SpecError, match="does not fit the 4x4 input"):
        Conv2dSpec(1, 3, 4, 4, 8, 7, 7)
    with pytest.raises(SpecError, match="stride is"):
        Conv2dSpec(1, 3, 8, 8, 8, 3, 3, stride=(0, 1))
    with pytest.raises(SpecError, match="padding is"):
        Conv2dSpec(1, 3, 8, 8, 8, 3, 3, padding=(1, 1))
    with pytest.raises(SpecError, match="groups=2 does not divide C=3"):
        Conv2dSpec(1, 3, 8, 8, 8, 3, 3, groups=2)
    with pytest.raises(SpecError, match="int8"):
        build_tile_program(Conv2dSpec(1, 3, 8, 8, 8, 3, 3, dtype_in="int8", dtype_acc="int32"), None, "c")
    with pytest.raises(TesseraError, match="no tile program for 'conv2d'"):
        build_tile_program(Conv2dSpec(1, 3, 8, 8, 8, 3, 3), None, "cuda")
