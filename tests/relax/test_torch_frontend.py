"""PyTorch code that TVM's torch frontend imported wrong, checked against torch after Tessera puts it
right (tessera_tvm/relax/torch_frontend.py), and the C host code TVM could not compile.

Each model is ordinary user code, imported at the frontend's defaults and built for the CPU. Before
the fixes, every one of these gave a wrong answer with no error (or stopped the build).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tessera_tvm.relax import build, partition_for_tessera

from .models import torch_models

from_exported_program = pytest.importorskip("tvm.relax.frontend.torch").from_exported_program


def _import(model: nn.Module, *args: torch.Tensor):
    exported = torch.export.export(model.eval(), args)
    return from_exported_program(exported, keep_params_as_input=False)


def _check(model: nn.Module, *args: torch.Tensor, atol: float = 1e-5):
    with torch.no_grad():
        expected = model.eval()(*args)
    built = build(_import(model, *args), "cpu")
    (got,) = built.run("main", *(a.numpy() for a in args))
    assert got.dtype == expected.numpy().dtype
    np.testing.assert_allclose(got, expected.numpy(), atol=atol)
    return built


class GruClassifier(nn.Module):
    """The classic sequence classifier: the GRU's last step through a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        y, _ = self.gru(x)
        return self.head(y[:, -1])


def test_a_gru_classifier_reading_the_last_step_matches_torch():
    # y[:, -1] imports as R.take(y, -1, mode="fast"), which read before the start of the axis
    # (errors of 1e20 and more, different on every run).
    torch.manual_seed(0)
    built = _check(GruClassifier(), torch.randn(3, 7, 16))
    assert built.report.fixed["take with a negative index"] >= 1
    assert "put right from what TVM's import got wrong" in str(built.report)


class LastTokenLogits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(24, 50, bias=False)

    def forward(self, h):
        return self.lm_head(h[:, -1, :]), h[..., [-1, 0]].sum(-1)


def test_negative_indices_by_int_and_by_list_match_torch():
    torch.manual_seed(0)
    model, h = LastTokenLogits(), torch.randn(2, 9, 24)
    with torch.no_grad():
        logits, picked = model(h)
    built = build(_import(model, h), "cpu")
    got_logits, got_picked = built.run("main", h.numpy())
    np.testing.assert_allclose(got_logits, logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(got_picked, picked.numpy(), atol=1e-5)
    assert built.report.fixed["take with a negative index"] == 2


class FullRotary(nn.Module):
    """Phi-3's rotary step under full rotary: the part of the head past the rotary dim is empty."""

    def forward(self, q, cos, sin):
        rotated, rest = q[..., :8], q[..., 8:]
        half = torch.cat((-rotated[..., 4:], rotated[..., :4]), dim=-1)
        return torch.cat(((rotated * cos) + (half * sin), rest), dim=-1)


def test_a_concat_with_an_empty_operand_builds_and_matches_torch():
    # TVM's build stopped with "Divide by zero" (RewriteDataflowReshape) on the empty slice: no
    # Hugging Face Phi-3 built on either route.
    torch.manual_seed(0)
    args = (torch.randn(2, 4, 6, 8), torch.randn(6, 8), torch.randn(6, 8))
    with torch.no_grad():
        expected = FullRotary()(*args).numpy()
    built = build(_import(FullRotary(), *args), "cpu")
    (got,) = built.run("main", *(a.numpy() for a in args))
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert built.report.fixed["empty tensor in a concat"] == 1, built.report


def test_an_out_of_range_constant_index_is_left_as_imported():
    # Only -n <= i < 0 has a meaning to restore; anything else is not rewritten into something valid.
    from tessera_tvm import tvm
    from tessera_tvm.relax.torch_frontend import fix_imported

    relax = tvm.relax
    x = relax.Var("x", relax.TensorStructInfo((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            inside = bb.emit(relax.op.take(x, relax.const(np.array([-3, -1, 1], "int64")), axis=1))
            outside = bb.emit(relax.op.take(x, relax.const(np.array([-4], "int64")), axis=1))
            out = bb.emit_output(relax.Tuple([inside, outside]))
        bb.emit_func_output(out)
    fixed, counts = fix_imported(bb.get())
    assert counts["take with a negative index"] == 1
    takes = [b.value for b in fixed["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    assert takes[0].args[1].data.numpy().tolist() == [0, 2, 1]
    assert takes[1].args[1].data.numpy().tolist() == [-4]


class Standardize(nn.Module):
    """Feature standardisation as people write it: torch's default (Bessel-corrected) std and var."""

    def forward(self, x):
        z = (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)
        return z + x.var(dim=(1, 2), keepdim=True) + x.var(-1, unbiased=False, keepdim=True)


def test_std_and_var_keep_torchs_correction():
    torch.manual_seed(0)
    _check(Standardize(), torch.randn(2, 5, 8))


class CountAndLoss(nn.Module):
    """A count of positives (a bool sum) and cross entropy (whose mean divides by a bool sum)."""

    def forward(self, logits, target):
        positives = (logits > 0).sum(-1).float()
        return F.cross_entropy(logits, target) + positives.mean() + logits.sum(dtype=torch.float64).float()


def test_bool_sums_count_in_int64_and_cross_entropy_matches_torch():
    torch.manual_seed(0)
    logits, target = torch.randn(6, 10), torch.tensor([0, 3, 9, 1, 1, 7])
    with torch.no_grad():
        expected = CountAndLoss()(logits, target)
    built = build(_import(CountAndLoss(), logits, target), "cpu")
    (got,) = built.run("main", logits.numpy(), target.numpy())
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-6)


class SeluMlp(nn.Module):
    """A self-normalising MLP: torch exports F.selu as elu with scale and input_scale."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.selu(self.fc1(x))) + F.elu(x[:, :4], alpha=0.5) + F.celu(x[:, 4:8], alpha=0.7)


def test_selu_elu_and_celu_match_torch():
    torch.manual_seed(0)
    _check(SeluMlp(), torch.randn(8, 12))


class ContrastiveScores(nn.Module):
    """An InfoNCE-style loss and pooled features: logsumexp (exported through amax), the diagonal,
    amax, amin and min over a dim (values and indices)."""

    def forward(self, a, b):
        logits = a @ b.T / 0.1
        loss = (torch.logsumexp(logits, dim=-1) - logits.diagonal()).mean()
        closest = b.min(dim=-1)
        return loss + a.amax(dim=-1).sum() - b.amin(dim=(0, 1)) + (closest.values * closest.indices).sum()


def test_logsumexp_diagonal_amax_amin_and_min_over_a_dim_import_and_match_torch():
    torch.manual_seed(0)
    _check(ContrastiveScores(), torch.randn(6, 8), torch.randn(6, 8))


class GroupNormed(nn.Module):
    """Group norms as diffusion U-Nets write them: with and without an affine weight and bias."""

    def __init__(self) -> None:
        super().__init__()
        self.affine, self.plain = nn.GroupNorm(2, 8), nn.GroupNorm(4, 8, affine=False)

    def forward(self, x):
        return self.affine(x) + self.plain(x) + F.group_norm(x, 1, eps=1e-3)


def test_group_norm_with_and_without_weight_and_bias_matches_torch():
    # Without weight and bias the frontend passed None to R.nn.group_norm and crashed on import.
    torch.manual_seed(0)
    _check(GroupNormed(), torch.randn(2, 8, 4, 4))


class Normalised(nn.Module):
    """abs, p-norms and cosine similarity: each lowers to tirx.fabs, which TVM's C target could not print."""

    def forward(self, x):
        unit = F.normalize(x, dim=-1)
        similarity = F.cosine_similarity(x, x.flip(0), dim=-1)
        return unit.abs().sum(-1) + similarity + x.norm(p=1, dim=-1) + torch.isfinite(x / x.abs().round()).sum(-1)


def test_abs_norms_and_isfinite_build_and_match_torch():
    torch.manual_seed(0)
    _check(Normalised(), torch.randn(4, 16))


class HalfBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return F.softmax(F.gelu(self.norm(x)), dim=-1) * 0.5 + x.abs().sum(-1, keepdim=True) / 16


def test_a_float16_model_builds_and_matches_torch():
    # TVM's C code for the ops it keeps spells float16 as `half`, which no C compiler defines:
    # export_options maps it to _Float16.
    torch.manual_seed(0)
    model = HalfBlock().half()
    x = torch.randn(4, 8, 16).half()
    built = _check(model, x, atol=2e-2)
    assert {row.family for row in built.report.offloaded} >= {"norm", "softmax"}


def test_float16_transformer_and_mlp_blocks_match_torch_in_float16():
    # The frontend returned every float16 matmul as float32: nn.Linear then failed on its float16
    # bias, and a LayerNorm after it met float32 data and a float16 weight. The TVM code left over
    # also needed float16 exp and tanh, which the C target had no rule for.
    models = torch_models()
    torch.manual_seed(0)
    for model, x in ((models.Gpt2Block(), torch.randn(2, 24, 48)), (models.Mlp(), torch.randn(32, 64))):
        model, x = model.half().eval(), x.half()
        with torch.no_grad():
            expected = model(x)
        built = build(_import(model, x), "cpu")
        (got,) = built.run("main", x.numpy())
        assert got.dtype == np.float16
        scale = float(expected.abs().max())
        np.testing.assert_allclose(got.astype(np.float32), expected.float().numpy(), atol=2e-3 * scale)
        assert "matmul" in " ".join(row.ops for row in built.report.offloaded)


class MaskedScores(nn.Module):
    """A padding mask applied with masked_fill and where, as attention code does by hand."""

    def forward(self, scores, keep):
        return torch.where(keep, scores, scores.exp()).masked_fill(~keep, -1.0)


@pytest.mark.parametrize("shape", [(8, 4), (64, 4), (8, 16), (100, 3)])
def test_where_on_a_bool_mask_matches_torch(shape):
    # GCC 12.2 at -O3 with AVX2 vectorises `out[i] = mask[i] ? a[i] : b[i]` over a byte mask wrongly
    # when the loop nest has these shapes (a third of the elements came out as 0); the CPU config
    # compiles with -fno-tree-loop-if-convert.
    torch.manual_seed(0)
    scores = torch.randn(*shape)
    _check(MaskedScores(), scores, scores > 0.3)


class EmptyReductions(nn.Module):
    """Reductions over an axis of size 0 (a batch of no items, a K of 0), and a NaN constant."""

    def forward(self, x, a, b):
        sums = torch.stack([x.sum(0), x.prod(0), x.mean(0), x.var(0), torch.logsumexp(x, 0)])
        return sums, a @ b, x.sum(0) + torch.full_like(x.sum(0), float("nan"))


def test_reductions_over_an_empty_axis_give_torchs_values_and_a_nan_constant_builds():
    # TVM's loops over the 0 elements never ran their init: sum, prod and a K=0 matmul returned the
    # output's uninitialised memory (1e+10, NaN...), mean stopped the build ("Divide by zero"). And TVM
    # prints a NaN constant as `nanf`, libm's function: g++ refused the C host code.
    args = (torch.randn(0, 5), torch.randn(3, 0), torch.randn(0, 4))
    with torch.no_grad():
        expected = [t.numpy() for t in EmptyReductions()(*args)]
    built = build(_import(EmptyReductions(), *args), "cpu")
    got = built.run("main", *(a.numpy() for a in args))
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)  # 0, 1, NaN, NaN, -inf; zeros; NaN
    assert built.report.fixed["reduction over an empty axis"] >= 7, built.report


class HalfPrecisionOps(nn.Module):
    """Operators left to TVM that it computed wrong in bfloat16 or could not build in float16."""

    def forward(self, b, h):
        b_ops = torch.stack([b.sort(-1).values, torch.fmod(b, 0.75), b**2, b.argmax(-1, True).expand_as(b).bfloat16()])
        h_ops = torch.stack([h.floor(), h.round(), h.atan(), torch.remainder(h, 0.75)])
        return b_ops.float(), b.topk(3, -1).values.float(), h_ops.float()


def test_half_precision_operators_left_to_tvm_compute_in_float32_as_torch():
    # bfloat16: sort and topk compared bit patterns (topk gave 0.40 for 1.54), fmod returned
    # denormals (1e-38 for 0.625), ** and argmax did not build; float16 floor, round, atan and
    # remainder did not build ("Unresolved call tirx.floor").
    torch.manual_seed(0)
    b, h = torch.randn(2, 6).bfloat16(), (torch.randn(2, 6) * 3).half()
    with torch.no_grad():
        expected = [t.float().numpy() for t in HalfPrecisionOps()(b, h)]
    built = build(_import(HalfPrecisionOps(), b, h), "cpu")
    got = built.run("main", b.float().numpy().astype(ml_dtypes.bfloat16), h.numpy())
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)  # exact: each computed in float32 and rounded once, as torch
    assert built.report.fixed["half-precision op computed in float32"] >= 8, built.report


class Extrema(nn.Module):
    """Maxima and minima TVM computes (Tessera offloads only the max reduction)."""

    def forward(self, x):
        indices = torch.stack([x.argmax(-1), x.argmin(0)[:3]])
        total = x.sum()  # NaN: clips of a 0-d tensor are left to TVM (a gradient norm's clamp)
        clips = torch.stack(
            [total.clamp(min=1e-6), total.clamp(-1, 1), F.relu(total), F.relu6(total), F.hardtanh(total)]
        )
        half = torch.maximum(x.bfloat16(), x.flip(0).bfloat16()).float()  # did not build: no bfloat16 isnan
        return torch.stack([x.amin(-1), x.min(-1).values]), indices, torch.maximum(x, x.flip(0)), x.min(), clips, half


def test_maxima_and_minima_left_to_tvm_keep_a_nan_as_torch():
    # TVM compares with `<`, which a NaN never wins: amin gave the row's least number, argmax the
    # index of its largest (torch: the NaN and its index), maximum dropped the NaN, and a clamp or
    # relu of a NaN gave its bound (x.sum().clamp(min=1e-6) was inf).
    x = torch.tensor([[1.0, float("nan"), 2.0], [3.0, -1.0, 5.0], [float("nan"), float("-inf"), 0.0]])
    with torch.no_grad():
        expected = [t.numpy() for t in Extrema()(x)]
    built = build(_import(Extrema(), x), "cpu")
    for g, e in zip(built.run("main", x.numpy()), expected, strict=True):
        np.testing.assert_array_equal(g, e)  # NaN where torch has NaN
    assert built.report.fixed["max or min that dropped a NaN"] >= 5, built.report


class Sorts(nn.Module):
    """The sorts TVM computes (Tessera has no sort kernel), each on float32, float64 and bfloat16."""

    def forward(self, x, d, b):
        outs = []
        for t in (x, d, b):
            values, indices = t.sort(-1)
            down, down_indices = t.sort(0, descending=True)
            top, top_indices = t.topk(2, -1)
            low, low_indices = t.topk(2, 0, largest=False)
            largest, largest_index = t.max(-1)  # imported as topk(k=1)
            middle, middle_index = t.median(-1)
            order = t.argsort(-1, descending=True)
            outs += [values, down, top, low, largest, middle, t.median()[None]]
            outs += [indices, down_indices, top_indices, low_indices, largest_index, middle_index, order]
        middle, middle_index = x.nanmedian(-1)  # no converter: the numbers' median, its sort NaN last
        outs += [middle, x[:, 1:2].nanmedian(), middle_index]
        return tuple(o.float() if o.is_floating_point() else o for o in outs)


def test_sorts_left_to_tvm_put_a_nan_where_torch_does():
    # TVM sorts with `<`, which a NaN never wins: sort left a NaN where it was and the numbers around
    # it out of order, topk and x.max(dim) skipped it ([1, nan, 2].max(-1) gave 2), median ignored it.
    # Torch orders NaN above +inf: last ascending, first descending and largest, median NaN.
    nan, inf = float("nan"), float("inf")
    x = torch.tensor(
        [[1.0, nan, -0.0, 2.0, nan, -inf], [3.0, 0.0, inf, -1.0, 3.0, nan], [0.5, 0.25, -2.0, 1.0, 4.0, 0.0]]
    )
    args = (x, x.double(), x.bfloat16())
    with torch.no_grad():
        expected = [t.numpy() for t in Sorts()(*args)]
    built = build(_import(Sorts(), *args), "cpu")
    got = built.run("main", x.numpy(), x.double().numpy(), x.float().numpy().astype(ml_dtypes.bfloat16))
    *got, nan_median, all_nan, nan_median_index = got
    np.testing.assert_array_equal(nan_median, expected[-3])  # -0.0, 3.0, 0.25
    np.testing.assert_array_equal(all_nan, expected[-2])  # NaN: no number
    np.testing.assert_array_equal(np.take_along_axis(x.numpy(), nan_median_index[:, None], 1)[:, 0], nan_median)
    for t, (g, e) in enumerate(zip(got, expected[:-3], strict=True)):
        source = args[t // 14].float().numpy()
        if t % 14 < 7:
            np.testing.assert_array_equal(g, e)  # values: NaN where torch has NaN
        elif t % 14 in (11, 12):
            np.testing.assert_array_equal(g, e)  # max and median: the first NaN's index, as torch
        else:  # torch leaves the order of equal values open (the NaNs, the two 3.0s): each picks its value
            axis = 0 if t % 14 in (8, 10) else -1
            np.testing.assert_array_equal(np.take_along_axis(source, g, axis), np.take_along_axis(source, e, axis))
    assert built.report.fixed["sort that misplaced a NaN"] == 26, built.report


def test_the_report_says_nothing_was_fixed_when_nothing_was():
    torch.manual_seed(0)
    model, x = nn.Linear(8, 8), torch.randn(2, 8)
    _, report = partition_for_tessera(_import(model, x), "cpu")
    assert report.fixed == {
        "take with a negative index": 0,
        "bitwise_not of a bool": 0,
        "empty tensor in a concat": 0,
        "reduction over an empty axis": 0,
        "half-precision op computed in float32": 0,
        "max or min that dropped a NaN": 0,
        "sort that misplaced a NaN": 0,
    }
    assert "put right" not in str(report)


class MaskedAttention(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)


@pytest.mark.parametrize("causal", [False, True], ids=["mask", "mask and is_causal"])
def test_sdpa_with_a_2d_mask_imports_without_decomposition_and_matches_torch(causal):
    # Without the decomposition the frontend passes attn_mask as R.nn.attention's bias, which must be
    # 4-D: a [S, S] mask stopped the import. (Eager torch takes a mask with is_causal=True and applies
    # both; torch.export's decomposition refuses it, so only this import has it.)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 24, 16) for _ in range(3))
    mask = torch.randn(24, 24)
    with torch.no_grad():
        expected = MaskedAttention(causal)(q, k, v, mask).numpy()
    exported = torch.export.export(MaskedAttention(causal), (q, k, v, mask))
    built = build(from_exported_program(exported, keep_params_as_input=False, run_ep_decomposition=False), "cpu")
    (got,) = built.run("main", *(t.numpy() for t in (q, k, v, mask)))
    np.testing.assert_allclose(got, expected, atol=1e-5)
    (kernel,) = built.report.offloaded
    assert kernel.family == "attention" and kernel.spec.bias == (1, 1, 24, 24) and kernel.spec.causal == causal


class ScaledByPythonNumbers(nn.Module):
    """A tensor times, plus and over plain Python numbers, as model code scales and shifts."""

    def forward(self, x):
        return x * 0.125, x + 1.0, x / 8.0, 3.0 - x, x * 0.1


def _run_on_cpu(model: nn.Module, *args: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """What the model built for the CPU returns and what torch returns (bfloat16 goes through dlpack:
    numpy has no bfloat16 that torch hands out)."""
    from tessera_tvm import tvm

    with torch.no_grad():
        expected = model.eval()(*args)
    built = build(_import(model, *args), "cpu")
    got = built.vm()["main"](*(tvm.runtime.from_dlpack(a.contiguous()) for a in args))  # always a tuple
    return [torch.from_dlpack(g) for g in got], list(expected) if isinstance(expected, tuple) else [expected]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_python_numbers_times_a_tensor_import_and_match_torch(dtype):
    # In bfloat16 every one stopped the import ("Invalid DataType bfloat16" making the constant).
    torch.manual_seed(0)
    x = (torch.randn(16, 32) * 4).to(dtype)
    got, expected = _run_on_cpu(ScaledByPythonNumbers(), x)
    for out, ref in zip(got[:4], expected[:4], strict=True):
        # 0.125, 1, 8 and 3 are exact in every dtype here: the same rounding of the same sum/product.
        assert out.dtype == dtype
        torch.testing.assert_close(out, ref, atol=0, rtol=0)
    # Torch multiplies by 0.1 held in float32; the import by 0.1 in the tensor's dtype (0.10009765625
    # in bfloat16): within one spacing of the dtype (2^-7 relative in bfloat16, 2^-10 in float16).
    spacing = {torch.bfloat16: 2**-7, torch.float16: 2**-10, torch.float32: 2**-23}[dtype]
    torch.testing.assert_close(got[4].float(), expected[4].float(), atol=0, rtol=spacing)


def test_a_bfloat16_scalar_constant_is_the_number_rounded_to_bfloat16():
    torch.manual_seed(0)
    mod = _import(ScaledByPythonNumbers(), torch.randn(4, 8).bfloat16())
    from tessera_tvm import tvm

    constants = [
        arg
        for binding in mod["main"].body.blocks[0].bindings
        if isinstance(binding.value, tvm.relax.Call)
        for arg in binding.value.args
        if isinstance(arg, tvm.relax.Constant)
    ]
    assert [str(c.struct_info.dtype) for c in constants] == ["bfloat16"] * 5
    values = [float(c.data.numpy()) for c in constants]
    assert values == [float(torch.tensor(v).bfloat16()) for v in (0.125, 1.0, 8.0, 3.0, 0.1)]
    assert values[-1] == 0.10009765625  # 0.1 to the nearest bfloat16


class HfEagerAttention(nn.Module):
    """Hugging Face's eager attention as its models write it: ``* head_dim ** -0.5``, the softmax in
    float32, the probabilities cast back to q's dtype."""

    def forward(self, q, k, v):
        w = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
        return torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)


@pytest.mark.parametrize("head_dim", [64, 96], ids=["scale 1/8", "scale 96^-0.5"])
def test_hf_eager_attention_in_bfloat16_scaled_by_a_python_float_imports_and_matches_torch(head_dim):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 32, head_dim).bfloat16() for _ in range(3))
    # Planned for Hopper it is one attention, scaled by the constant as imported (rounded to bf16).
    _, report = partition_for_tessera(_import(HfEagerAttention(), q, k, v), "hopper")
    (kernel,) = report.offloaded
    assert kernel.family == "attention" and kernel.spec.dtype_in == "bfloat16", report
    assert kernel.spec.scale == float(torch.tensor(head_dim**-0.5).bfloat16())
    # On the CPU TVM computes it as written. Outputs below 2, where bfloat16's spacing is 2^-7: torch
    # and TVM each round the scores, the probabilities and the output, and the scale differs by up to
    # half a spacing (float32 in torch, bfloat16 here), so within 2 spacings.
    (got,), (expected,) = _run_on_cpu(HfEagerAttention(), q, k, v)
    assert got.dtype == torch.bfloat16 and float(expected.abs().max()) < 2
    torch.testing.assert_close(got.float(), expected.float(), atol=2 * 2**-7, rtol=0)
