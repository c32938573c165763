"""Convolutions offloaded from PyTorch CNNs imported at the frontend's defaults: conv2d as Tessera's
CPU implicit-GEMM kernel with its epilogue (bias, a folded inference batch norm, a residual, the
activation), checked against torch; conv1d as the same kernel of height 1; and what stays with TVM,
with the reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tessera_tvm.relax import build, partition_for_tessera

from .models import torch_models

from_exported_program = pytest.importorskip("tvm.relax.frontend.torch").from_exported_program
BasicBlock = torch_models().BasicBlock  # examples/torch_models.py: conv-bn-relu, conv-bn, + input, relu


class SmallCnn(nn.Module):
    """A strided stem with bias, a pooled second conv, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 5, stride=2, padding=2)
        self.conv = nn.Conv2d(8, 12, 3, dilation=2)
        self.head = nn.Linear(12, 10)

    def forward(self, x):
        y = F.gelu(self.conv(F.relu(self.stem(x))))
        return self.head(F.adaptive_avg_pool2d(y, 1).flatten(1))


def _import(model: nn.Module, *args: torch.Tensor, dynamic_batch: bool = False):
    shapes = ({0: torch.export.Dim("batch", min=1, max=64)},) if dynamic_batch else None
    exported = torch.export.export(model.eval(), args, dynamic_shapes=shapes)
    return from_exported_program(exported, keep_params_as_input=False)


def _check(built, model, x, atol=1e-4):
    with torch.no_grad():
        expected = model(x).numpy()
    (got,) = built.run("main", x.numpy())
    np.testing.assert_allclose(got, expected, atol=atol, rtol=1e-4)


def test_a_resnet_basic_block_runs_as_two_convolution_kernels_with_the_norms_folded():
    torch.manual_seed(0)
    model, x = BasicBlock(32).eval(), torch.randn(2, 32, 12, 12)
    built = build(_import(model, x), "cpu")
    # Each batch norm is folded into its convolution's weights and bias; the residual add and the
    # ReLUs are the kernels' epilogues: nothing is left to TVM.
    assert built.report.folded == {"batch_norm": 2}
    assert sorted(r.ops for r in built.report.offloaded) == ["conv2d + add + add + relu", "conv2d + add + relu"]
    assert built.report.not_offloaded == []
    assert "folded into the convolution before them: 2 batch_norm" in str(built.report)
    # Both 3x3 convolutions (2 images of 9 4x4 tiles each) run as Winograd F(4x4, 3x3), the epilogues
    # on its output tiles.
    sources = built.kernel_sources()
    assert len(sources) == 2 and all("tessera_cpu_winograd_m4_f32" in source for source in sources.values())
    _check(built, model, x)


@pytest.mark.slow
def test_resnet18_offloads_every_convolution_with_its_norm_folded_and_matches_torch():
    torch.manual_seed(5)
    model, x = torch_models().ResNet18(width=8, classes=10).eval(), torch.randn(2, 3, 40, 40)
    built = build(_import(model, x), "cpu")
    convs = [r for r in built.report.offloaded if r.family == "conv2d"]
    # The stem, 16 block convolutions and 3 strided 1x1 shortcuts, each with its batch norm folded.
    assert len(convs) == 20 and built.report.folded == {"batch_norm": 20}, built.report
    assert "R.nn.conv2d" not in {r.op for r in built.report.not_offloaded}, built.report
    _check(built, model, x)


def test_a_small_cnn_with_stride_padding_dilation_and_bias_matches_torch():
    torch.manual_seed(1)
    model, x = SmallCnn().eval(), torch.randn(3, 3, 21, 19)
    built = build(_import(model, x), "cpu")
    ops = sorted(r.ops for r in built.report.offloaded if r.family == "conv2d")
    assert ops == ["conv2d + add + gelu", "conv2d + add + relu"], built.report
    _check(built, model, x)


def test_a_cnn_exported_with_a_dynamic_batch_runs_at_any_batch():
    torch.manual_seed(2)
    model = BasicBlock(8).eval()
    built = build(_import(model, torch.randn(2, 8, 6, 6), dynamic_batch=True), "cpu")
    assert {r.family for r in built.report.offloaded} == {"conv2d"}
    assert all(r.dynamic for r in built.report.offloaded), built.report
    for batch in (1, 5):
        _check(built, model, torch.randn(batch, 8, 6, 6))


def test_a_cnn_exported_with_a_dynamic_image_size_leaves_its_convolutions_to_tvm_with_the_reason():
    torch.manual_seed(4)
    model, x = BasicBlock(8).eval(), torch.randn(1, 8, 6, 6)
    side = torch.export.Dim("side", min=4, max=64)
    exported = torch.export.export(model, (x,), dynamic_shapes=({2: side, 3: side},))
    built = build(from_exported_program(exported, keep_params_as_input=False), "cpu")
    reasons = [r.reason for r in built.report.not_offloaded if r.op == "R.nn.conv2d"]
    assert len(reasons) == 2 and all("a convolution takes a symbolic batch N only" in r for r in reasons), reasons
    _check(built, model, torch.randn(1, 8, 9, 9))


def test_depthwise_and_grouped_convolutions_are_offloaded_and_a_norm_after_a_relu_stays():
    class Mixed(nn.Module):  # MobileNet's depthwise 3x3, then a ResNeXt-style grouped 3x3
        def __init__(self) -> None:
            super().__init__()
            self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.norm = nn.BatchNorm2d(8)
            self.grouped = nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=4)

        def forward(self, x):
            return self.grouped(self.norm(F.relu(self.depthwise(x))))  # a norm after a ReLU is not folded

    torch.manual_seed(3)
    model, x = Mixed().eval(), torch.randn(2, 8, 7, 7)
    model.norm.running_var.uniform_(0.5, 2.0)
    built = build(_import(model, x), "cpu")
    assert built.report.folded == {"batch_norm": 0}
    assert sorted(r.ops for r in built.report.offloaded) == ["conv2d + add", "conv2d + add + relu"], built.report
    assert "R.nn.batch_norm" in {r.op for r in built.report.not_offloaded}, built.report
    _check(built, model, x)


def test_a_mobilenet_v2_block_runs_relu6_as_its_convolutions_epilogue():
    torch.manual_seed(6)
    model, x = torch_models().InvertedResidual(8).eval(), torch.randn(2, 8, 9, 9)
    built = build(_import(model, x), "cpu")
    # ReLU6 imports as R.clip(x, 0, 6): the expansion's and the depthwise conv's last epilogue step.
    assert built.report.folded == {"batch_norm": 3}
    ops = sorted(r.ops for r in built.report.offloaded)
    assert ops == ["conv2d + add + add", "conv2d + add + clip", "conv2d + add + clip"], built.report
    assert built.report.not_offloaded == [], built.report
    _check(built, model, x)


def test_hardswish_and_one_sided_clamps_run_as_tessera_kernels():
    class Clamps(nn.Module):  # MobileNetV3's hardswish (x * relu6(x + 3) / 6), clamp with one bound
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return F.hardswish(y), torch.clamp(self.conv(x * 2), min=-0.5)

    torch.manual_seed(7)
    model, x = Clamps().eval(), torch.randn(1, 4, 6, 6)
    built = build(_import(model, x), "cpu")
    ops = sorted(r.ops for r in built.report.offloaded)
    # hardswish reads the conv's output twice, so it is an element-wise kernel of its own (its two
    # clips: clamp(min=0) and clamp(max=6)); the one-sided clamp is the second conv's epilogue.
    assert ops == ["add + clip + clip + mul + div", "conv2d + add", "conv2d + add + clip", "mul"], built.report
    assert {r.op for r in built.report.not_offloaded} == {"R.reshape"}, built.report  # the biases to [1, O, 1, 1]
    with torch.no_grad():
        expected = [t.numpy() for t in model(x)]
    got = built.run("main", x.numpy())
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5)


def test_max_and_average_pools_run_as_tessera_kernels_and_match_torch():
    class Pools(nn.Module):  # ResNet's stem pool, a ceil-mode max, an average without the padding
        def forward(self, x):
            a = F.max_pool2d(x, 3, stride=2, padding=1)
            b = F.max_pool2d(x, 2, stride=2, ceil_mode=True)
            c = F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False)
            return a, b, c, F.adaptive_avg_pool2d(x, 1)

    torch.manual_seed(8)
    model, x = Pools().eval(), torch.randn(2, 3, 9, 11)
    built = build(_import(model, x), "cpu")
    ops = sorted(r.ops for r in built.report.offloaded)
    # adaptive_avg_pool2d(x, 1) imports as R.mean over H and W: a Tessera reduction.
    assert ops == ["avg_pool2d", "max_pool2d", "max_pool2d", "mean"], built.report
    # The frontend pairs each max_pool2d with R.zeros_like as its (unused) indices, cast to torch's
    # int64 (tessera_tvm/frontend_fixes.py).
    assert {r.op for r in built.report.not_offloaded} == {"R.zeros_like", "R.astype"}, built.report
    with torch.no_grad():
        expected = [t.numpy() for t in model(x)]
    for got, want in zip(built.run("main", x.numpy()), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # A dynamic batch: the pools' grids run over it.
    dynamic = build(_import(model, x, dynamic_batch=True), "cpu")
    assert {r.ops for r in dynamic.report.offloaded if r.dynamic} >= {"max_pool2d", "avg_pool2d"}, dynamic.report
    for batch in (1, 3):
        xb = torch.randn(batch, 3, 9, 11)
        with torch.no_grad():
            want = model(xb)[2].numpy()
        np.testing.assert_allclose(dynamic.run("main", xb.numpy())[2], want, rtol=1e-6, atol=1e-6)
    # GPU configs have no pooling kernel yet: the report says so.
    _, report = partition_for_tessera(_import(model, x), "hopper")
    reasons = {r.op: r.reason for r in report.not_offloaded}
    assert "Tessera has no CUDA pool2d kernel yet (config 'hopper')" in reasons["R.nn.max_pool2d"], reasons


def test_gpu_configs_leave_convolutions_to_tvm_with_the_reason():
    # GPU configs have no convolution kernel yet: the report says so, by config.
    _, report = partition_for_tessera(_import(BasicBlock(8).eval(), torch.randn(1, 8, 6, 6)), "hopper")
    reasons = [r.reason for r in report.not_offloaded if r.op == "R.nn.conv2d"]
    assert reasons and all("no CUDA conv2d kernel yet (config 'hopper')" in r for r in reasons), reasons


class Conv1dStack(nn.Module):
    """Audio-style 1-D convolutions: plain, strided and padded, dilated, grouped, a causal depthwise one
    (padded by K - 1, its tail sliced off) and padding="same" with an even kernel (the frontend pads
    the input by one more on the right, then convolves with symmetric padding)."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = nn.Conv1d(4, 8, 3)
        self.strided = nn.Conv1d(8, 8, 5, stride=2, padding=2)
        self.dilated = nn.Conv1d(8, 6, 3, dilation=2, padding=2)
        self.grouped = nn.Conv1d(6, 8, 3, groups=2, padding=1)
        self.causal = nn.Conv1d(8, 8, 4, groups=8, padding=3)
        self.same = nn.Conv1d(8, 8, 4, padding="same")

    def forward(self, x):
        y = F.gelu(self.strided(F.relu(self.plain(x))))
        y = F.relu(self.grouped(self.dilated(y)))
        return self.same(self.causal(y)[..., : -self.causal.padding[0]])


def test_conv1d_layers_run_as_tessera_convolution_kernels_and_match_torch():
    torch.manual_seed(8)
    model, x = Conv1dStack().eval(), torch.randn(2, 4, 33)
    built = build(_import(model, x), "cpu")
    convs = [r for r in built.report.offloaded if r.family == "conv2d"]
    assert [r.ops for r in convs] == [
        "conv1d + add + relu",
        "conv1d + add + gelu",
        "conv1d + add",
        "conv1d + add + relu",
        "conv1d + add",
        "conv1d + add",
    ], built.report
    assert "R.nn.conv1d" not in {r.op for r in built.report.not_offloaded}, built.report
    # Each runs as the conv2d kernel of height 1 (its tensors viewed as [N, C, 1, W]).
    assert all(r.spec.H == 1 and r.spec.R == 1 for r in convs)
    strided, causal = convs[1].spec, convs[4].spec
    assert (strided.stride, strided.padding) == ((1, 2), (0, 2, 0, 2))
    assert causal.depthwise and causal.padding == (0, 3, 0, 3)
    assert (convs[2].spec.dilation, convs[3].spec.groups) == ((1, 2), 2)
    _check(built, model, x)


def test_a_conv1d_exported_with_a_dynamic_batch_runs_at_any_batch():
    torch.manual_seed(9)
    model = nn.Sequential(nn.Conv1d(3, 5, 3, padding=1), nn.ReLU()).eval()
    built = build(_import(model, torch.randn(2, 3, 12), dynamic_batch=True), "cpu")
    assert [(r.ops, bool(r.dynamic)) for r in built.report.offloaded] == [("conv1d + add + relu", True)], built.report
    for batch in (1, 3):
        _check(built, model, torch.randn(batch, 3, 12))


def test_gpu_configs_leave_conv1d_to_tvm_with_the_reason():
    _, report = partition_for_tessera(_import(Conv1dStack().eval(), torch.randn(1, 4, 33)), "hopper")
    reasons = [r.reason for r in report.not_offloaded if r.op == "R.nn.conv1d"]
    assert len(reasons) == 6, report
    assert all("conv1d: Tessera has no CUDA conv2d kernel yet (config 'hopper')" in r for r in reasons), reasons


def test_a_conv_bias_is_folded_with_the_norm_but_a_vector_added_along_the_rows_is_not():
    class Biased(nn.Module):
        def __init__(self, along_rows: bool) -> None:
            super().__init__()
            self.conv, self.norm = nn.Conv2d(4, 6, 3, padding=1, bias=not along_rows), nn.BatchNorm2d(6)
            self.rows = nn.Parameter(torch.randn(6)) if along_rows else None  # [W]: broadcasts along W
            with torch.no_grad():
                self.norm.running_var.uniform_(0.5, 2.0)
                self.norm.running_mean.uniform_(-1.0, 1.0)

        def forward(self, x):
            y = self.conv(x)
            return F.silu(self.norm(y if self.rows is None else y + self.rows))

    torch.manual_seed(6)
    x = torch.randn(2, 4, 6, 6)  # W = O = 6: a [6] vector would pass for a per-channel bias
    biased = Biased(along_rows=False).eval()
    built = build(_import(biased, x), "cpu")
    assert built.report.folded == {"batch_norm": 1}
    assert [r.ops for r in built.report.offloaded] == ["conv2d + add + silu"], built.report
    _check(built, biased, x)
    rows = Biased(along_rows=True).eval()
    built = build(_import(rows, x), "cpu")
    assert built.report.folded == {"batch_norm": 0}, built.report
    _check(built, rows, x)


def test_a_float16_cnn_imports_and_runs():
    # TileLang's torch frontend accumulated a float16 conv2d in float32 and added the float16 bias
    # to it: no float16 CNN imported. The conv now returns the inputs' dtype, as torch.
    class Small(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.head = nn.Conv2d(8, 16, 3, padding=1), nn.Linear(16, 4)

        def forward(self, x):
            return self.head(F.relu(self.conv(x)).mean((2, 3)))

    torch.manual_seed(7)
    model, x = Small().half().eval(), torch.randn(2, 8, 10, 10).half()
    built = build(_import(model, x), "cpu")
    assert [r.family for r in built.report.offloaded].count("conv2d") == 1, built.report
    with torch.no_grad():
        expected = model(x).float().numpy()
    (got,) = built.run("main", x.numpy())
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), expected, atol=2e-3, rtol=2e-3)
