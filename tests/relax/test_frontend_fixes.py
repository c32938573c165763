"""What TVM's torch importer got wrong in both TVMs, put right by tessera_tvm/frontend_fixes.py, on
both import routes (``run_ep_decomposition`` True, the default, and False).

Every case here came out of the importer with a dtype torch does not give, or a wrong value, with
no error (or did not import): ``int / 2`` divided as integers, ``bool * 1.5`` stayed bool,
``i.clamp(min=1)`` clipped at a finite "infinity", ``torch.add(x, y, alpha=3)`` dropped alpha,
``zeros_like(x, dtype=...)`` ignored the dtype, an eval-mode batch norm ran in training mode.
The dtype checks import only (no compile); the value checks build one module per route.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tessera_tvm.relax import build

from ..torch_import_cases import exported_cases, wrong_types, wrong_values

from_exported_program = pytest.importorskip("tvm.relax.frontend.torch").from_exported_program

ROUTES = pytest.mark.parametrize("decompose", [True, False], ids=["decomposed", "not decomposed"])


@pytest.fixture(scope="module")
def exported():
    return exported_cases()


def _result_types(mod) -> list:
    func = mod["main"]
    info = getattr(func, "ret_struct_info", None)
    return list(info.fields)


@ROUTES
def test_every_result_has_torchs_dtype_and_shape(exported, decompose):
    program, _, expected = exported
    types = _result_types(from_exported_program(program, keep_params_as_input=False, run_ep_decomposition=decompose))
    wrong = wrong_types(types, expected)
    assert not wrong, wrong


@ROUTES
def test_every_result_has_torchs_value(exported, decompose):
    program, (x, i), expected = exported
    built = build(from_exported_program(program, keep_params_as_input=False, run_ep_decomposition=decompose), "cpu")
    wrong = wrong_values(built.run("main", x.numpy(), i.numpy()), expected)
    assert not wrong, wrong


class ConvBn(nn.Module):
    """conv -> batch norm -> relu, then a norm without affine parameters and one without running
    statistics (which torch normalises with the batch's own, in eval mode too)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.plain = nn.BatchNorm2d(8, affine=False)
        self.batch_stats = nn.BatchNorm2d(8, track_running_stats=False)
        with torch.no_grad():
            for norm in (self.bn, self.plain):
                norm.running_mean.uniform_(-1, 1)
                norm.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = F.relu(self.bn(self.conv(x)))
        return self.batch_stats(self.plain(y) * 2)


def test_an_eval_batch_norm_imported_without_decomposition_matches_torch():
    # aten.batch_norm was read as _native_batch_norm_legit: training for the momentum, the momentum
    # (0.1) for eps, and training mode always; ResNet-18 came out with a relative error of 0.7.
    torch.manual_seed(0)
    model, x = ConvBn().eval(), torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        expected = model(x).numpy()
    exported = torch.export.export(model, (x,))
    built = build(from_exported_program(exported, keep_params_as_input=False, run_ep_decomposition=False), "cpu")
    (got,) = built.run("main", x.numpy())
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert built.report.folded["batch_norm"] == 1, built.report  # the conv's norm folds into its kernel


class PaddedAttention(nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("rank", [4, 2], ids=["[B, 1, S, S] mask", "[S, S] mask"])
def test_sdpa_with_a_bool_mask_imports_without_decomposition_and_matches_torch(rank):
    # Refused before ("Only a float mask is supported"); BERT and ViT pass one. A query with every
    # key masked out gets zeros, as in torch.
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 12, 16, generator=gen) for _ in range(3))
    mask = torch.rand(2, 1, 12, 12, generator=gen) > 0.3
    mask[:, :, 5] = False  # a query that sees no key
    if rank == 2:
        mask = mask[0, 0]
    with torch.no_grad():
        expected = PaddedAttention()(q, k, v, mask).numpy()
    assert np.abs(expected[:, :, 5]).max() == 0
    exported = torch.export.export(PaddedAttention(), (q, k, v, mask))
    built = build(from_exported_program(exported, keep_params_as_input=False, run_ep_decomposition=False), "cpu")
    (got,) = built.run("main", *(t.numpy() for t in (q, k, v, mask)))
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert [row.family for row in built.report.offloaded].count("attention") == 1, built.report


class ScaledAttention(nn.Module):
    def __init__(self, **options) -> None:
        super().__init__()
        self.options = options

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **self.options)


@pytest.mark.parametrize(
    "shape, options",
    [
        ((2, 4, 6, 16), {"scale": 1.0}),
        ((2, 4, 6, 16), {"scale": 0.3, "is_causal": True}),
        ((6, 16), {}),
        ((3, 6, 16), {"scale": 1.0}),
    ],
    ids=["scale=1 (OPT, T5)", "scale, causal", "2-D", "3-D, scale"],
)
def test_sdpa_imported_without_decomposition_keeps_its_scale_and_rank(shape, options):
    # Both importers dropped `scale` (OPT and T5 attend with scale=1.0 and came out off by up to
    # 1.0), took a 2-D [S, D] query for one query per head (each attended only to its own key:
    # the output was v) and refused 3-D operands.
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=gen) for _ in range(3))
    model = ScaledAttention(**options)
    with torch.no_grad():
        expected = model(q, k, v).numpy()
    exported = torch.export.export(model, (q, k, v))
    built = build(from_exported_program(exported, keep_params_as_input=False, run_ep_decomposition=False), "cpu")
    (got,) = built.run("main", q.numpy(), k.numpy(), v.numpy())
    np.testing.assert_allclose(got, expected, atol=2e-6)
    assert [row.family for row in built.report.offloaded] == ["attention"], built.report


class InPlaceOnViews(nn.Module):
    def forward(self, x):
        y = x * 2
        row = y[1]
        y[0].add_(10)  # through a view: y changes
        y[:, 1:2].mul_(3)
        y[:, 0] = -1.0
        y.div_(x.abs().sum(-1, keepdim=True))
        return y, row * 1  # row is y's, read after every change


def test_in_place_ops_imported_without_decomposition_change_every_alias():
    # torch.export leaves in-place ops in its graph; the importer's converters made a new value and
    # left its aliases as they were: y[0].add_(10) left y unchanged, with no error (div_ and x[:, 0] =
    # value did not import). The graph is functionalized first now.
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = [t.numpy() for t in InPlaceOnViews()(x)]
    exported = torch.export.export(InPlaceOnViews(), (x,))
    built = build(from_exported_program(exported, keep_params_as_input=False, run_ep_decomposition=False), "cpu")
    for got, want in zip(built.run("main", x.numpy()), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_to_device_keeps_the_value_and_takes_the_dtype():
    class Rotary(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("inv_freq", torch.arange(4, dtype=torch.float64) / 8)

        def forward(self, x):  # as LLaMA's rotary embedding moves its frequencies
            return x * self.inv_freq.to(x.device, torch.float32)

    x = torch.randn(3, 4)
    exported = torch.export.export(Rotary(), (x,))
    assert any("to.device" in str(n.target) for n in exported.graph.nodes)
    mod = from_exported_program(exported, keep_params_as_input=False, run_ep_decomposition=False)
    (info,) = _result_types(mod)
    assert str(info.dtype) == "float32"


class MaskedRead(nn.Module):
    def forward(self, x):
        return x[x > 0].sum()  # a data-dependent shape: no Relax form


@ROUTES
def test_a_value_read_through_a_bool_mask_and_not_written_back_is_refused_by_name(decompose):
    from tessera_tvm import TesseraError

    exported = torch.export.export(MaskedRead(), (torch.randn(2, 3),))
    with pytest.raises(TesseraError) as info:
        from_exported_program(exported, keep_params_as_input=False, run_ep_decomposition=decompose)
    message = str(info.value)
    assert "aten.index.Tensor" in message and "test_frontend_fixes.py" in message  # the user's line
    assert "not only written back" in message and "torch.where(mask, new, y)" in message


class GroupedExperts(nn.Module):
    """transformers' grouped experts (Mixtral's default): rows sorted by expert, ``offs`` the running
    ends of each expert's rows (expert 1 has none; rows past the last end stay zero)."""

    def forward(self, x, weight, offs, stored):
        # ``stored`` [E, N, K] passed transposed, as transformers does with its expert weights
        grouped = torch.ops.transformers.grouped_mm_fallback
        return grouped(x, weight, offs) * 2 + grouped(x, stored.transpose(-2, -1), offs)


@ROUTES
def test_transformers_grouped_experts_match_torch(decompose):
    pytest.importorskip("transformers.integrations.moe")  # registers the custom op
    gen = torch.Generator().manual_seed(0)
    x, weight = torch.randn(7, 5, generator=gen), torch.randn(3, 5, 4, generator=gen)
    offs, stored = torch.tensor([2, 2, 6], dtype=torch.int32), torch.randn(3, 4, 5, generator=gen)
    with torch.no_grad():
        expected = GroupedExperts()(x, weight, offs, stored).numpy()
    assert not expected[6:].any() and expected[:6].all()
    exported = torch.export.export(GroupedExperts(), (x, weight, offs, stored))
    built = build(from_exported_program(exported, keep_params_as_input=False, run_ep_decomposition=decompose), "cpu")
    (got,) = built.run("main", x.numpy(), weight.numpy(), offs.numpy(), stored.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


class ExpertWeights(nn.Module):
    """Grouped experts whose weights are the module's own (constants once imported): each expert's
    GEMM reads its slice of the [E, K, N] weight."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1)))

    def forward(self, x, offs):
        return torch.ops.transformers.grouped_mm_fallback(x, self.weight, offs)


def test_each_experts_slice_of_a_constant_weight_is_a_constant_packed_ahead():
    # Imported, each expert reads strided_slice(weight) at every call; folded ahead
    # (relax_rewrites.fold_constant_slices), each expert's GEMM takes its weight packed once.
    pytest.importorskip("transformers.integrations.moe")
    x, offs = torch.randn(7, 5, generator=torch.Generator().manual_seed(0)), torch.tensor([2, 2, 6], dtype=torch.int32)
    model = ExpertWeights().eval()
    with torch.no_grad():
        expected = model(x, offs).numpy()
    built = build(from_exported_program(torch.export.export(model, (x, offs)), keep_params_as_input=False), "cpu")
    gemms = [o for o in built.report.offloaded if o.ops.startswith("matmul")]
    assert len(gemms) == 3 and all(o.packed_weight for o in gemms), str(built.report)
    (got,) = built.run("main", x.numpy(), offs.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


class RunningMax(nn.Module):
    def forward(self, x):
        return torch.cummax(x, -1).values


def test_a_running_maximum_over_a_dim_of_symbolic_size_is_refused_by_name_and_line():
    # The log-step scan needs the dim's size at import; the error says which op, where, and the fix.
    from tessera_tvm import TesseraError

    exported = torch.export.export(RunningMax(), (torch.randn(2, 5),), dynamic_shapes=({1: torch.export.Dim("n")},))
    with pytest.raises(TesseraError) as info:
        from_exported_program(exported, keep_params_as_input=False)
    message = str(info.value)
    assert "aten.cummax.default" in message and "test_frontend_fixes.py" in message
    assert "symbolic size" in message and "static size" in message
