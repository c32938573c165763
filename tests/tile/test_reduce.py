"""Row-reduction tile programs (sum/max/mean, softmax, layer_norm, rms_norm): CPU numerics, GPU artifacts."""

from __future__ import annotations

import numpy as np
import pytest

import tessera_tvm
from tessera_tvm.tile import NormSpec, ReduceSpec, SoftmaxSpec, TileSchedule, build_tile_program

from .conftest import as64, assert_close, random_inputs, run_cpu

# Small blocks on the CPU so every kernel sees several blocks and a partial last one.
SMALL = TileSchedule(block_m=4, block_n=32)


def softmax_reference(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def norm_reference(spec: NormSpec, arrays):
    x = as64(arrays["x"])
    if spec.kind == "layer_norm":
        y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + spec.eps)
    else:
        y = x / np.sqrt((x * x).mean(-1, keepdims=True) + spec.eps)
    if spec.has_weight:
        y = y * as64(arrays["weight"])
    if spec.has_bias:
        y = y + as64(arrays["bias"])
    return y


# (shape, axis, kind, keepdims, dtype): two consecutive axes, a middle axis kept, a vector, one element;
# then axes followed by runs of columns (reduce.CPU_COLUMNS_FROM or more): more columns than a block
# (CPU_COLUMN_BLOCK, the last block ragged), and two dims after the axis, kept.
REDUCTIONS = [
    ((3, 37, 53), (1, 2), "sum", False, "float32"),
    ((3, 37, 53), 1, "max", True, "float16"),
    ((131,), 0, "mean", False, "bfloat16"),
    ((1, 1), -1, "sum", True, "float32"),
    ((2, 5, 1100), 1, "mean", False, "float32"),
    ((2, 3, 4, 6), (0, 1), "sum", True, "float32"),
]


@pytest.mark.parametrize("shape, axis, kind, keepdims, dtype", REDUCTIONS, ids=lambda v: str(v))
def test_cpu_reduce(shape, axis, kind, keepdims, dtype, cpu_config, tmp_path):
    spec = ReduceSpec(shape, axis, kind, keepdims, dtype)
    arrays = random_inputs(spec)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=SMALL)["out"]
    expected = getattr(np, kind)(as64(arrays["x"]), axis=spec.axis, keepdims=keepdims).reshape(out.shape)
    reduced = int(np.prod([shape[a] for a in spec.axis]))
    # A sum of n standard normals is O(sqrt(n)); the mean and max stay O(1).
    assert_close(out, expected, dtype, atol_scale=np.sqrt(reduced) if kind == "sum" else 1.0)


def test_cpu_max_over_columns_keeps_a_nan_in_its_column_only(cpu_config, tmp_path):
    spec = ReduceSpec((4, 6, 40), 1, "max")
    x = random_inputs(spec)["x"]
    x[1, 2, 7] = np.nan
    out = run_cpu(spec, {"x": x}, cpu_config, tmp_path)["out"]
    assert np.isnan(out[1, 7]) and np.isnan(out).sum() == 1
    np.testing.assert_array_equal(out, np.max(x, axis=1))


# (shape, axis, dtype): a middle axis (strided rows), the last axis longer than a block, one element,
# a prime-length last axis.
SOFTMAXES = [
    ((3, 37, 53), 1, "float32"),
    ((5, 300), -1, "float16"),
    ((1, 1), 0, "bfloat16"),
    ((2, 1009), -1, "bfloat16"),
]


@pytest.mark.parametrize("shape, axis, dtype", SOFTMAXES, ids=lambda v: str(v))
def test_cpu_softmax(shape, axis, dtype, cpu_config, tmp_path):
    spec = SoftmaxSpec(shape, axis, dtype)
    arrays = random_inputs(spec)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=SMALL)["out"]
    assert_close(out, softmax_reference(as64(arrays["x"]), axis), dtype)


def test_cpu_softmax_is_stable_for_large_logits(cpu_config, tmp_path):
    spec = SoftmaxSpec((4, 70), -1, "float32")
    arrays = {"x": (np.random.default_rng(3).standard_normal((4, 70)) * 50 + 1000).astype(np.float32)}
    out = run_cpu(spec, arrays, cpu_config, tmp_path)["out"]
    assert np.isfinite(out).all()
    assert_close(out, softmax_reference(as64(arrays["x"]), -1), "float32")


# (kind, shape, weight, bias, dtype_in, dtype_out)
NORMS = [
    ("layer_norm", (5, 37, 300), True, True, "bfloat16", "float32"),
    ("layer_norm", (1, 1), False, False, "float32", "float32"),
    ("rms_norm", (7, 129), True, False, "float16", "float16"),
    ("rms_norm", (3, 64), True, True, "float32", "bfloat16"),
]


@pytest.mark.parametrize("kind, shape, weight, bias, dtype_in, dtype_out", NORMS, ids=lambda v: str(v))
def test_cpu_norm(kind, shape, weight, bias, dtype_in, dtype_out, cpu_config, tmp_path):
    spec = NormSpec(kind, shape, -1, 1e-5, weight, bias, dtype_in, dtype_out)
    arrays = random_inputs(spec)
    out = run_cpu(spec, arrays, cpu_config, tmp_path, schedule=SMALL)["out"]
    worst = "bfloat16" if "bfloat16" in (dtype_in, dtype_out) else dtype_out
    # Normalised values are O(1) but weight * bias adds up to ~3 sigma: scale atol by 3.
    assert_close(out, norm_reference(spec, arrays), worst, atol_scale=3.0)


# ---------------------------------------------------------------------------------------------
# GPU targets: artifacts
# ---------------------------------------------------------------------------------------------

GPU_SOFTMAX = SoftmaxSpec((37, 1001), -1, "float16")
GPU_LAYER_NORM = NormSpec("layer_norm", (4, 37, 1001), has_bias=True, dtype_in="bfloat16")


@pytest.mark.parametrize("target", ["hopper", "ampere", "rocm"])
@pytest.mark.parametrize("spec", [GPU_SOFTMAX, GPU_LAYER_NORM], ids=["softmax", "layer_norm"])
def test_gpu_row_kernels_reduce_across_threads_and_mask(spec, target):
    source = tessera_tvm.lower(build_tile_program(spec, None, target), target, build=False).source
    assert f"{spec.family}_kernel" in source
    assert "AllReduce" in source  # the block's lanes are combined across threads
    assert "< 1001)" in source  # the row end is masked per element


@pytest.mark.parametrize("target", ["hopper", "rocm"])
def test_gpu_reduce_lowers(target):
    spec = ReduceSpec((3, 37, 53), (1, 2), "mean", dtype_in="float16", dtype_out="float32")
    source = tessera_tvm.lower(build_tile_program(spec, None, target), target, build=False).source
    assert "AllReduce" in source


@pytest.mark.nvcc
def test_ampere_layer_norm_builds_with_nvcc(tmp_path):
    lowered = tessera_tvm.lower(build_tile_program(GPU_LAYER_NORM, None, "ampere"), "ampere", out_dir=tmp_path)
    assert lowered.artifacts["cubin"].stat().st_size > 0
    assert ".target sm_80" in lowered.artifacts["ptx"].read_text()
