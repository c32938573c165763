"""The CPU pooling tile program against torch's max_pool2d / avg_pool2d (padding, strides,
dilation, ceil mode, count_include_pad), and the specs it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_tvm import TesseraError
from tessera_tvm.tile import Pool2dSpec, SpecError, build_tile_program

from .conftest import random_inputs, run_cpu

torch = pytest.importorskip("torch")
F = torch.nn.functional

CASES = [
    # ResNet's stem pool; ceil mode with a partial last window; a dilated, rectangular window with
    # stride (1, 2); averages with and without the padding counted, in and out of ceil mode.
    dict(kind="max", pool=(3, 3), stride=(2, 2), padding=(1, 1, 1, 1)),
    dict(kind="max", pool=(3, 3), stride=(2, 2), ceil_mode=True),
    dict(kind="max", pool=(2, 3), stride=(1, 2), padding=(1, 1, 1, 1), dilation=(2, 1)),
    dict(kind="avg", pool=(3, 3), stride=(2, 2), padding=(1, 1, 1, 1)),
    dict(kind="avg", pool=(3, 3), stride=(2, 2), padding=(1, 1, 1, 1), count_include_pad=False),
    dict(kind="avg", pool=(3, 2), stride=(2, 2), padding=(1, 1, 1, 1), ceil_mode=True),
    dict(kind="avg", pool=(3, 2), stride=(2, 2), padding=(1, 1, 1, 1), ceil_mode=True, count_include_pad=False),
]


def torch_pool(x: np.ndarray, case: dict) -> np.ndarray:
    top, left, _, _ = case.get("padding", (0, 0, 0, 0))
    common = dict(stride=case["stride"], padding=(top, left), ceil_mode=case.get("ceil_mode", False))
    t = torch.from_numpy(x.astype(np.float32))
    if case["kind"] == "max":
        return F.max_pool2d(t, case["pool"], dilation=case.get("dilation", (1, 1)), **common).numpy()
    return F.avg_pool2d(t, case["pool"], count_include_pad=case.get("count_include_pad", True), **common).numpy()


@pytest.mark.parametrize("case", CASES, ids=[f"{c['kind']}-{i}" for i, c in enumerate(CASES)])
def test_pool2d_matches_torch(case, cpu_config, tmp_path):
    spec = Pool2dSpec(2, 3, 11, 10, **case)
    inputs = random_inputs(spec)
    out = run_cpu(spec, inputs, cpu_config, tmp_path)["Y"]
    expected = torch_pool(inputs["X"], case)
    assert out.shape == expected.shape == spec.shape_out
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


def test_a_float16_max_pool_keeps_its_dtype(cpu_config, tmp_path):
    spec = Pool2dSpec(1, 4, 9, 9, "max", (3, 3), stride=(2, 2), padding=(1, 1, 1, 1), dtype_in="float16")
    inputs = random_inputs(spec, seed=1)
    out = run_cpu(spec, inputs, cpu_config, tmp_path)["Y"]
    assert out.dtype == np.float16
    np.testing.assert_array_equal(
        out,
        torch_pool(inputs["X"], dict(kind="max", pool=(3, 3), stride=(2, 2), padding=(1, 1, 1, 1))).astype(np.float16),
    )


def test_bad_pool_specs_are_refused_by_name():
    with pytest.raises(SpecError, match="kind is 'min'; expected one of max, avg"):
        Pool2dSpec(1, 3, 8, 8, "min", (2, 2))
    with pytest.raises(SpecError, match=r"padding \(2, 2, 2, 2\) is more than half the 3x3 window"):
        Pool2dSpec(1, 3, 8, 8, "max", (3, 3), padding=(2, 2, 2, 2))
    with pytest.raises(SpecError, match=r"an average pool with dilation \(2, 2\)"):
        Pool2dSpec(1, 3, 8, 8, "avg", (2, 2), dilation=(2, 2))
    with pytest.raises(SpecError, match="does not fit the 2x2 input"):
        Pool2dSpec(1, 3, 2, 2, "max", (3, 3))
    with pytest.raises(TesseraError, match="no tile program for 'pool2d'"):
        build_tile_program(Pool2dSpec(1, 3, 8, 8, "max", (2, 2)), None, "cuda")
