"""bfloat16 PyTorch models on the CPU through Relax: imported at the frontend's defaults
(``.to(torch.bfloat16)``, torch.export, ``from_exported_program``), offloaded to Tessera's CPU kernels
(bf16 buffers held as uint16 storage, ``tirx.BF16StorageLegalize``), built and run.

Tolerances. bfloat16 keeps 8 significant bits: a step is 2^-7 of the value's binade (2^-7 just
above 1, 2^-6 just above 2). Each model is checked twice:
- against torch's own bf16 eager run: within two bf16 steps at the output's magnitude
  (``2^-6 * max|output|``). Tessera's kernels compute each fused group in float32 and round once
  where torch rounds after every op, so single elements differ by a rounding or two;
- against the same model in float32: no further from it than 1.5x torch bf16 eager's own
  distance from it, plus one step (Tessera is as accurate as torch's bf16, not less).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tessera_tvm import tvm
from tessera_tvm.relax import build, partition_for_tessera

from .models import torch_models

from_exported_program = pytest.importorskip("tvm.relax.frontend.torch").from_exported_program

models = torch_models()
relax = tvm.relax


def _run_bf16(model: nn.Module, x: torch.Tensor):
    """``model`` in float32 and in bfloat16 (torch eager) on ``x``, and the bf16 model imported,
    built for the CPU and run: (build, Tessera's output, torch bf16's, torch float32's), as float32."""
    model = model.eval()
    with torch.no_grad():
        f32 = model(x).float()
        model = model.to(torch.bfloat16)
        xb = x.bfloat16()
        eager = model(xb).float()
    exported = torch.export.export(model, (xb,))
    built = build(from_exported_program(exported, keep_params_as_input=False), "cpu")
    (got,) = built.vm()["main"](tvm.runtime.from_dlpack(xb))
    got = torch.from_dlpack(got)
    assert got.dtype == torch.bfloat16
    return built, got.float(), eager, f32


def _assert_bf16_close(got, eager, f32) -> None:
    scale = float(f32.abs().max())
    torch.testing.assert_close(got, eager, rtol=0, atol=2**-6 * scale)
    eager_error = float((eager - f32).abs().max())
    error = float((got - f32).abs().max())
    assert error <= 1.5 * eager_error + 2**-7 * scale, (error, eager_error, scale)


def _families(report) -> list[str]:
    return sorted(row.family for row in report.offloaded)


def _no_bf16_refusals(report) -> None:
    # Before: every bf16 op was left with "TileLang's C codegen (the CPU target) has no bfloat16 type".
    assert not [row for row in report.not_offloaded if "bfloat16" in row.reason], report


def test_a_bf16_gpt2_block_is_offloaded_and_matches_torch():
    torch.manual_seed(0)
    built, got, eager, f32 = _run_bf16(models.Gpt2Block(), torch.randn(2, 24, 48))
    report = built.report
    _no_bf16_refusals(report)
    # layer norms, the four linears (their f32 products + bias rounded to bf16 in the epilogue), the
    # decomposed SDPA as one attention kernel, GELU and the residual adds: no matmul, norm or softmax left.
    assert _families(report).count("gemm") == 4 and _families(report).count("attention") == 1, report
    # The GELU and the second residual take the bf16 rounding of the linear in the epilogue, as torch
    # rounds it: one kernel each, as in float32.
    ops = [row.ops for row in report.offloaded]
    assert "matmul + add + cast + gelu" in ops and "matmul + add + cast + add" in ops, report
    assert [row.ops for row in report.offloaded].count("layer_norm") == 2, report
    assert report.recovered_attention == 1
    left = {row.op for row in report.not_offloaded}
    assert not left & {"R.matmul", "R.nn.softmax", "R.nn.layer_norm", "R.nn.gelu", "R.add"}, report
    _assert_bf16_close(got, eager, f32)


def test_a_bf16_llama_block_is_offloaded_and_matches_torch():
    # RMSNorm by hand (rebuilt), RoPE, grouped-query causal attention and SwiGLU, in bf16.
    torch.manual_seed(0)
    built, got, eager, f32 = _run_bf16(models.LlamaBlock(), torch.randn(2, 16, 64))
    report = built.report
    _no_bf16_refusals(report)
    assert report.rebuilt["rms_norm"] == 2 and report.rebuilt["silu"] == 1, report
    families = _families(report)
    assert families.count("gemm") == 7 and families.count("attention") == 1 and families.count("norm") == 2
    # The SiLU, computed in float32 between two casts after the gate linear's reshape back to 3-D, is
    # that GEMM's epilogue (the casts sink through the reshape as the activation does), not a kernel.
    ops = [row.ops for row in report.offloaded]
    assert "matmul + cast + cast + silu + cast" in ops and not [o for o in ops if o.startswith("cast")], ops
    assert not {row.op for row in report.not_offloaded} & {"R.matmul", "R.power", "R.nn.softmax"}, report
    _assert_bf16_close(got, eager, f32)


class GeluNewMlp(nn.Module):
    """GPT-2's MLP with its ``gelu_new`` written out, as transformers' ``NewGELUActivation`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(48, 96), nn.Linear(96, 48)

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0)))))


def test_gpt2s_gelu_new_in_bf16_is_rebuilt_as_gelu_tanh():
    # In bf16 the import rounds the constants (0.044715 -> 0.044677734375, sqrt(2/pi) -> 0.796875),
    # which the rebuild did not recognise: TVM then kept `power` in bf16 and failed to build it
    # ("power only applies to float"), so a bf16 GPT-2 did not build at all.
    torch.manual_seed(0)
    built, got, eager, f32 = _run_bf16(GeluNewMlp(), torch.randn(2, 12, 48))
    assert built.report.rebuilt["gelu_tanh"] == 1, built.report
    assert "matmul + add + cast + gelu_tanh" in [row.ops for row in built.report.offloaded], built.report
    assert "R.power" not in {row.op for row in built.report.not_offloaded}
    _assert_bf16_close(got, eager, f32)


class MaxPool(nn.Module):
    def forward(self, x):
        return F.max_pool2d(x, 2)


def test_a_bf16_max_pool_builds_and_is_exact():
    # torch's max_pool2d imports with its indices as a bf16 zeros_like that TVM keeps. TVM's C code
    # rounded the constant 0.0f to bf16 through `&(0.000000e+00f)`, which g++ refuses ("lvalue
    # required as unary '&' operand"): no bf16 CNN with max pooling built.
    torch.manual_seed(0)
    built, got, eager, _ = _run_bf16(MaxPool(), torch.randn(1, 8, 10, 10))
    assert [row.ops for row in built.report.offloaded] == ["max_pool2d"]
    torch.testing.assert_close(got, eager, rtol=0, atol=0)  # a max of bf16 values is one of them


def test_bf16_constants_that_tvm_keeps_build_with_their_values():
    # The same constant rounding in TVM's own operators, with bit patterns above 2^31 (-3.5, -inf).
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorStructInfo((2, 3), "bfloat16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            fulls = [
                bb.emit(relax.op.full((2, 3), relax.const(value, "float32"), dtype="bfloat16"))
                for value in (-3.5, float("-inf"), 1.0)
            ]
            out = bb.emit_output(relax.Tuple([*fulls, bb.emit(relax.op.zeros((2, 3), "bfloat16"))]))
        bb.emit_func_output(out)
    built = build(bb.get(), "cpu")
    got = built.vm()["main"](tvm.runtime.tensor(np.ones((2, 3), ml_dtypes.bfloat16)))
    for out, value in zip(got, (-3.5, float("-inf"), 1.0, 0.0), strict=True):
        np.testing.assert_array_equal(out.numpy().astype(np.float32), np.full((2, 3), value, np.float32))


def test_fp8_stays_with_tvm_on_the_cpu_with_the_reason():
    # fp8 is what the CPU's C code still has no type for in a Relax kernel (ts.compile widens it).
    bb = relax.BlockBuilder()
    x, w = (relax.Var(n, relax.TensorStructInfo((16, 16), "float8_e4m3fn")) for n in "xw")
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w, out_dtype="float32"))
        bb.emit_func_output(out)
    _, report = partition_for_tessera(bb.get(), "cpu")
    (left,) = report.not_offloaded
    assert "float8_e4m3fn" in left.reason and "C codegen" in left.reason
