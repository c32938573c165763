"""Torch expressions that TVM's torch importer got wrong in both TVMs (a dtype torch does not give,
or a wrong value, with no error), for tests/relax/test_frontend_fixes.py (TileLang's TVM) and
tests/upstream/apache_tvm (apache-tvm 0.27). No TVM here: the upstream venv imports it too."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _masked_writes(x, i):
    """Writes through bool masks (``aten.index_put``, which TVM refused: "IndexPut requires each index
    tensor to have integer dtype")."""
    y = x * 2
    y[y > 0] = 0.5  # a number
    y[x < 0] += 1  # read and written back through the mask (functionalized: index, add, index_put)
    y[x[:, 0] > 0] = x[1] * 10  # a mask over the rows, a row for each
    y[x > 0.5] = x[x > 0.5].exp() * x[0, 0]  # element-wise on a read through the same mask, written twice
    return y


def _masked_int_write(x, i):
    j = i.clone()
    j[i > 1] = 7
    return j


def _nans(x, i):
    """x with NaN at (0, 1) and (0, 2) (where i is 4 and 3)."""
    return x.masked_fill(i >= 3, float("nan"))


def _cube(x):
    """x [2, 3] as a [2, 2, 3] tensor to write into (a copy: the writes do not reach x)."""
    return torch.stack([x, x * -2])


def _sliced_writes(x, i):
    """Writes with fewer index tensors than axes (``aten.index_put`` with None for a sliced axis), which
    both TVMs refused ("IndexPut requires the number of index tensors (2) to match the data tensor
    dimensions (3)") or, with a slice between the index tensors, wrote the wrong elements."""
    y = _cube(x)
    rows, cols = x[:, 0].argsort(), x[0].argsort()[:2]  # distinct rows, distinct columns
    y[:, rows] = x[:, None, :1] * 10  # [None, rows]: the last axis left out
    y[:, :, cols - 3] = y[:, :, :2] + 1  # [None, None, pos] (a KV-cache write), negative positions
    y[i[0, :2].clamp(0, 1), i[1, :2].clamp(-2, 1)] += 1  # two index tensors on a 3-D tensor
    y[rows, :, cols] = x[1, :2, None] * 3  # a slice between: the broadcast axis first
    return y


def _static_cache(x, i):
    """transformers' StaticCache: ``k_out.index_copy_(2, cache_position, k)`` (no converter without
    the decomposition; a failed build with it) and ``cache[:, :, pos] = k``."""
    k_out = x.new_zeros(2, 2, 4)
    position = x[0].argsort()[:2] + 1
    k_out.index_copy_(2, position, _cube(x)[..., :2])
    v_out = x.new_zeros(2, 2, 4)
    v_out[:, :, position] = _cube(x)[..., 1:]
    return k_out + v_out * 10


def _by_infinity(x, i):
    """x // b and x % b for b of +-inf, computed: TileLang's TVM build gave a 0-d constant inf the
    value of float32's lowest (the nan_to_num case's constant), which hashes the same."""
    inf = (x - x).reciprocal()
    b = torch.where(i > 0, inf, -inf)
    return torch.stack([x // b, torch.remainder(x, b), torch.div(x, -math.inf, rounding_mode="floor")])


def _floored(x, i):
    """Float // and % where floor(a / b) is not torch's: 1 // 0.1 is 9 (0.1 is a little more than a
    tenth), 1e10 % 1.5 is 1 (exact), inf // 1.5 and inf % 1.5 are NaN."""
    a = x[0, :1] * 0 + torch.tensor([1.0, 1e10, math.inf, -1.0])
    b = x[0, :1] * 0 + torch.tensor([0.1, 1.5, 1.5, 0.3])
    return torch.stack([a // b, a % b, torch.div(a, -b, rounding_mode="floor")])


def _cross_entropies(x, i):
    t = i[0, :2].clamp(0, 2)
    losses = (
        F.cross_entropy(x, t, reduction="sum"),
        F.cross_entropy(x, t, reduction="none", ignore_index=1),
        F.cross_entropy(x, t, x[0].abs() + 1, label_smoothing=0.2),
    )
    return torch.cat([loss.reshape(-1) for loss in losses])


def _self_unequal(y):
    return y != y


# (x float32 [2, 3], i int64 [2, 3] in [-3, 4]) -> a tensor
CASES = {
    "zeros_like(dtype=int32)": lambda x, i: torch.zeros_like(x, dtype=torch.int32),
    "ones_like(dtype=bool)": lambda x, i: torch.ones_like(x, dtype=torch.bool),
    "full_like(dtype=int64)": lambda x, i: torch.full_like(x, 2, dtype=torch.int64),
    "full of True": lambda x, i: torch.full((2, 2), True),
    "full of an int": lambda x, i: torch.full((2,), 7),
    "new_ones(dtype=bool) & mask": lambda x, i: i.new_ones((), dtype=torch.bool) & (i[:, :, None] <= i[:, None, :]),
    "new_zeros(dtype=int32)": lambda x, i: x.new_zeros((2,), dtype=torch.int32) + 1,
    "new_full(dtype=int8)": lambda x, i: x.new_full((2,), 3, dtype=torch.int8),
    "new_full": lambda x, i: x.new_full((3,), 2.5),
    "bool cumsum counts in int64": lambda x, i: (x > 0).cumsum(-1),
    "int32 cumsum counts in int64": lambda x, i: i.int().cumsum(-1),
    "int / 2 is float": lambda x, i: i / 2,
    "int / int is float": lambda x, i: i / i.clamp(min=1),
    "bool * 1.5 is float": lambda x, i: (x > 0) * 1.5,
    "int + 0.5 is float": lambda x, i: i + 0.5,
    "1 - long(bool)": lambda x, i: 1 - (x > 0).long(),
    "int < 1.5 compares as float": lambda x, i: i < 1.5,
    "int // 2": lambda x, i: i // 2,
    "trunc division of ints": lambda x, i: torch.div(i * 3 - 2, -2, rounding_mode="trunc"),
    "trunc division by a tensor": lambda x, i: torch.div(i - 5, i.clamp(min=1) + 1, rounding_mode="trunc"),
    "floor division of ints": lambda x, i: torch.div(i - 5, 2, rounding_mode="floor"),
    "trunc division of floats": lambda x, i: torch.div(x * 5, 2, rounding_mode="trunc"),
    "int clamp(min=1)": lambda x, i: i.clamp(min=1),
    "int clamp(max=1)": lambda x, i: i.clamp(max=1),
    "int clamp by tensors": lambda x, i: i.clamp(i * 0, i * 0 + 2),
    "add with alpha": lambda x, i: torch.add(x, x * 2, alpha=3),
    "sub with alpha": lambda x, i: torch.sub(x, 1.0, alpha=2),
    "int add with alpha": lambda x, i: torch.add(i, i, alpha=2),
    "rsub with alpha": lambda x, i: torch.rsub(x, 2.0, alpha=3),
    "sort indices are int64": lambda x, i: x.sort(-1)[1],
    "softmax(dtype=float64)": lambda x, i: F.softmax(x, -1, dtype=torch.float64),
    "logical_and of ints": lambda x, i: torch.logical_and(x > 0, i),
    "logical_or, logical_xor": lambda x, i: torch.logical_or(i, x > 1) ^ torch.logical_xor(i, x > 0),
    "logical_not of an int": lambda x, i: torch.logical_not(i),
    "any of ints": lambda x, i: (i - 4).any(-1),
    "all": lambda x, i: (x > -5).all(),
    "zeros_like(i) float + 1": lambda x, i: torch.zeros_like(i, dtype=torch.float32) + 1,
    "where with a number": lambda x, i: torch.where(x > 0, x, 0.0),
    "where with an int": lambda x, i: torch.where(x > 0, i, 0),
    # refused: "Binary operators must have the same datatype" (torch promotes: float32, float16)
    "where of a float and an int": lambda x, i: torch.where(x > 0, x, i) + torch.where(i > 0, i.int(), x.half()),
    "prod over a dim": lambda x, i: (i + 5).prod(-1),
    "diff, n=2, prepend and append": lambda x, i: torch.diff(x, n=2, dim=-1, prepend=x[..., :1] - 1, append=x),
    "diff of bools": lambda x, i: torch.diff(x > 0),
    "diff of position ids": lambda x, i: torch.diff(i, prepend=i[..., :1] - 1),
    "std over a dim": lambda x, i: x.std(-1),
    "biased var over a dim": lambda x, i: x.var(0, unbiased=False),
    "sum to a scalar": lambda x, i: x[..., 0:2].sum(),
    "mean to a scalar": lambda x, i: (x * 2).mean(),
    # a -1 in expand lines up with the input's axes from the right (CLIP's class embedding)
    "[3] expanded to (2, 1, -1)": lambda x, i: x[0].expand(2, 1, -1) * 2,
    "[1, 3] expanded to (4, -1, 3)": lambda x, i: x[:1].expand(4, -1, 3) + 1,
    "x.T, x.t(), x.mT (Falcon's linear)": lambda x, i: x.T * 2 + x.t() + x[None].mT[0],
    "repeat_interleave over a dim and flat": lambda x, i: (
        x.repeat_interleave(2, dim=-1).sum(0) + x.repeat_interleave(2)[:6]
    ),
    # divisor_override was dropped: each window's mean, not its sum over 3
    "avg_pool2d(divisor_override=3)": lambda x, i: F.avg_pool2d(x[None, None], 2, 1, 1, True, divisor_override=3),
    # did not import: "The struct_info is not populated" (the converter's squeeze, not normalized)
    "avg_pool of an unbatched image": lambda x, i: F.avg_pool2d(x[None], 2, 1, 1),
    "avg_pool1d of an unbatched row": lambda x, i: F.avg_pool1d(x, 2, 1, 1),
    # TileLang's TVM took the two indices one after the other: [3, 3] for [3]
    "x[rows, cols] pairs them": lambda x, i: x[i[0].clamp(-2, 1), i[1].clamp(-3, 2)],
    "x[rows[:, None], cols] broadcasts": lambda x, i: x[i[0, :2].clamp(-2, 1)[:, None], i[1].clamp(-3, 2)],
    # a slice between two indices: their broadcast axes come first ([2, 2] here; both TVMs gave [2, 2, 2])
    "x[i, :, j]": lambda x, i: x[None].expand(2, 2, 3)[i[0, :2].clamp(0, 1), :, i[1, :2].clamp(-3, 2)],
    # indices of different ranks broadcast right-aligned, as F.unfold's (both TVMs: "cannot broadcast")
    "x[:, i[..., None], j]": lambda x, i: x[None].expand(2, 2, 3)[
        :, i[:, :1].clamp(0, 1)[..., None], i[0].clamp(-3, 2)
    ],
    "index_put(accumulate=True) through a mask": lambda x, i: x.index_put((x > 0,), x[0, 0], accumulate=True),
    # Mixtral's tokens per expert; values outside [min, max] are not counted, max is in the last bin
    "histc of expert ids": lambda x, i: torch.histc(i.float(), bins=4, min=0, max=3),
    "histc of floats": lambda x, i: torch.histc(x * 2, bins=3, min=-1.5, max=1),
    # no converter ("Unsupported function types"); fmax/fmin take the number where the other is NaN
    "atan2 of floats and ints": lambda x, i: torch.atan2(x, x.flip(0)) + torch.atan2(i, i.flip(-1)),
    "exp2 of floats and ints": lambda x, i: torch.exp2(x) + torch.exp2(i),
    "fmax, fmin ignore a NaN": lambda x, i: torch.stack(
        [torch.fmax(_nans(x, i), x.flip(0)), torch.fmin(x, _nans(x, i))]
    ),
    # running extrema: a NaN from the first NaN on (its index the latest NaN's), ties the later index
    "cummax after a NaN, and indices": lambda x, i: torch.cat([t.float() for t in torch.cummax(_nans(x, i), -1)]),
    "cummin of ints with ties, over dim 0": lambda x, i: torch.cummin(i, -1).values * 10 + torch.cummin(i, 0).indices,
    # windows [floor(k n / out), ceil((k + 1) n / out)); a window's first maximum, or its last NaN
    "adaptive_max_pool2d with a NaN, and indices": lambda x, i: torch.cat(
        [t.float() for t in F.adaptive_max_pool2d(_nans(x, i)[None, None], (2, 2), True)]
    ),
    "adaptive_max_pool1d indices": lambda x, i: F.adaptive_max_pool1d(x, 2, True)[1],
    "sort(stable=True) of ties": lambda x, i: torch.sort(i, stable=True, dim=-1, descending=True)[1],
    "msort": lambda x, i: torch.msort(x),
    "kthvalue": lambda x, i: torch.kthvalue(x, 2, -1).values[:, None] + torch.kthvalue(x, 2, 0, keepdim=True).indices,
    # no converter without the decomposition (nan_to_num in neither TVM)
    "nan_to_num": lambda x, i: torch.stack(
        [torch.nan_to_num(_nans(x, i) / (i - 1)), torch.nan_to_num(_nans(x, i) / (i - 1), 0.5, 9.0, -9.0)]
    ),
    "nansum, nanmean (of none: NaN)": lambda x, i: torch.cat(
        [torch.nansum(_nans(x, i), -1), torch.nanmean(_nans(x, i), -1), torch.nanmean(_nans(x, i)[:1, 1:], -1)]
    ),
    # apache-tvm 0.27 simplified x != x (torch's own NaN test) to false
    "x != x": lambda x, i: _self_unequal(_nans(x, i)).sum(-1),
    # apache-tvm 0.27 could not build a non-finite fill of a computed tensor ("PrimType is not iterable")
    "masked_fill with -inf (attention mask)": lambda x, i: x.masked_fill(i > 2, float("-inf")).softmax(-1),
    "full_like(inf), fill with NaN": lambda x, i: (
        torch.full_like(x, float("inf")) * x.sign() + x.clone().fill_(float("nan"))[:1]
    ),
    # an empty K: torch's decomposition views empty tensors (Relax's reshape reads a 0 as "keep")
    "einsum over an empty K": lambda x, i: torch.einsum("ik,kj->ij", x[:, :0], x.T[:0]),
    # T5's relative-position buckets: TVM's C code printed log(16) as 2.772589e+00f, and the
    # division's 1.9999999 truncated to 1 at distances 16 and 32 (a Tessera kernel; a 0-d one, TVM's)
    "T5's log-spaced buckets": lambda x, i: (
        torch.log((x[:1, :1] * 0 + torch.arange(1, 65)) / 8) / math.log(128 / 8) * 8
    ).long(),
    "T5's bucket of a 0-d distance": lambda x, i: (torch.log(x[0, 0] * 0 + 4.0) / math.log(16) * 8).long(),
    "the buckets in float64": lambda x, i: (
        torch.log((x[:1, :1] * 0 + torch.arange(1, 65)).double() / 8) / math.log(16) * 8
    ).long(),
    # MPT's nn.LayerNorm(bias=False): not decomposed, "KeyError: None"
    "layer_norm with no bias": lambda x, i: F.layer_norm(x, (3,), x[0] + 1, None, 1e-3),
    "layer_norm with no weight nor bias": lambda x, i: F.layer_norm(x * 2, (2, 3), None, None, 1e-2),
    # Wav2Vec2's positional convolution (parametrizations.weight_norm): no converter, not decomposed
    # SigLIP's patch embedding, nn.Conv2d(padding="valid"): no converter, not decomposed
    "conv2d(padding='valid'), 'same' with an even kernel": lambda x, i: (
        F.conv2d(x[None, None], x[None, None, :, :2], padding="valid")
        + F.conv2d(x[None, None], x[None, None, :, :2], x[0, :1], padding="same", dilation=(1, 2))[..., :2]
    ),
    "conv1d(padding='same')": lambda x, i: F.conv1d(x[None], x[None, :, :2].repeat(2, 1, 1), padding="same"),
    "_weight_norm over dim 1": lambda x, i: torch._weight_norm(x + 3, x[:1] * 2, 1),
    "_weight_norm over dim 0, and all": lambda x, i: (
        torch._weight_norm(x, x[:, :1], 0) + torch._weight_norm(x, x[0, 0], -1)
    ),
    "index_put with a slice: y[:, i] = v, y[:, :, pos] = k, y[i, j] += 1, y[i, :, j]": _sliced_writes,
    # duplicates add up; [None, i]: a None for the leading axis
    "index_put(accumulate=True) of a 3-D tensor with a slice": lambda x, i: torch.ops.aten.index_put(
        _cube(x), [None, i[0].clamp(0, 1)], x[0] * 2, True
    ),
    "index_copy_ (StaticCache) and cache[:, :, pos] = k": _static_cache,
    # no converter in either TVM
    "scatter_add, scatter_add_ with an index smaller than src": lambda x, i: (
        torch.scatter_add(x, 1, i.clamp(0, 2), x * 2) + x.clone().scatter_add_(0, i[:1].clamp(0, 1), x)
    ),
    "index_add with duplicates and alpha": lambda x, i: torch.index_add(
        _cube(x), 2, i[0].clamp(0, 2), _cube(x), alpha=2
    ),
    # transformers' DynamicCache concatenates onto torch.tensor([]): torch skips a 1-D empty operand,
    # the importer's concat refused it ("Concat expects all input tensors to have same ndim")
    "cat with torch.tensor([]) operands": lambda x, i: (
        torch.cat([torch.tensor([]), x], -2) + torch.cat([x, torch.tensor([]), x * 2], 0)[1:3]
    ),
    # floor(a / b) gave -0.0 for -1 // inf (torch: -1), a - floor(a / b) * b NaN for -1 % inf (torch: inf)
    "floor_divide, remainder by +-inf": _by_infinity,
    # floor(a / b) and a - floor(a / b) * b (both TVMs): 10, 256, inf (torch: 9, 1, NaN)
    "float // and % as torch: 1 // 0.1, 1e10 % 1.5, inf // 1.5": _floored,
    # TileLang's TVM flipped the first dim only
    "flip over two dims": lambda x, i: x.flip(0, 1),
    # without the decomposition (both TVMs): exp(x) / alpha - 1; log(exp(a) + exp(b)), inf above 88;
    # cross_entropy's reduction and ignore_index (passed by position) and label_smoothing dropped.
    # With it, apache-tvm 0.27 did not build logaddexp's mask * mask
    "celu(alpha=0.5)": lambda x, i: F.celu(x, 0.5),
    "logaddexp of large numbers": lambda x, i: torch.logaddexp(x * 100 + 100, x.flip(0) * 100),
    "cross_entropy(reduction=, ignore_index=, label_smoothing=)": _cross_entropies,
    # the CPU's element-wise kernels computed in float32 and rounded only where they stored (TVM's
    # bfloat16 legalization dropped the cast inside the expression)
    "x.bfloat16().float() rounds": lambda x, i: (x * 3).bfloat16().float() + 1,
    # torch squares float16 in float32: the sums of squares here (~70000) overflowed float16 to inf
    "float16 var, std, norm": lambda x, i: torch.stack(
        [(x * 100).half().var(-1), (x * 100).half().std(-1), (x * 100).half().norm(dim=-1)]
    ),
}


class Cases(nn.Module):
    def __init__(self, names):
        super().__init__()
        self.names = names

    def forward(self, x, i):
        return tuple(CASES[name](x, i) for name in self.names)


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, generator=gen), torch.randint(-3, 5, (2, 3), generator=gen)


def exported_cases():
    """The cases as one exported program of (x, i), its inputs and torch's outputs."""
    x, i = _inputs()
    model = Cases(list(CASES))
    with torch.no_grad():
        expected = model(x, i)
    return torch.export.export(model, (x, i)), (x, i), expected


def wrong_types(types, expected) -> dict:
    """{case: (dtype, shape, torch's dtype, torch's shape)} where the imported result types differ."""
    wrong = {}
    for name, t, e in zip(CASES, types, expected, strict=True):
        shape = [int(d) for d in t.shape.values]
        if str(t.dtype) != str(e.dtype).removeprefix("torch.") or shape != list(e.shape):
            wrong[name] = (str(t.dtype), shape, str(e.dtype), list(e.shape))
    return wrong


def wrong_values(got, expected) -> dict:
    """{case: (dtype, values, torch's dtype, torch's values)} where the numpy results differ."""
    import numpy as np

    wrong = {}
    for name, g, e in zip(CASES, got, expected, strict=True):
        e = e.numpy()
        if g.shape != e.shape or g.dtype != e.dtype or not np.allclose(g, e, atol=1e-5, equal_nan=True):
            wrong[name] = (g.dtype, g.ravel()[:6], e.dtype, e.ravel()[:6])
    return wrong
