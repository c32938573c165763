"""Element types and Tensor annotations."""

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera import Tensor


@pytest.mark.parametrize(
    "dtype, tvm, numpy",
    [
        (ts.f32, "float32", np.float32),
        (ts.f16, "float16", np.float16),
        (ts.bf16, "bfloat16", ml_dtypes.bfloat16),
        (ts.fp8_e4m3, "float8_e4m3fn", ml_dtypes.float8_e4m3fn),
        (ts.fp8_e5m2, "float8_e5m2", ml_dtypes.float8_e5m2),
        (ts.int8, "int8", np.int8),
        (ts.int32, "int32", np.int32),
    ],
)
def test_dtype_knows_tvm_and_numpy(dtype, tvm, numpy):
    assert dtype.tvm == tvm
    assert dtype.numpy == np.dtype(numpy)
    assert ts.dtype(tvm) is dtype and ts.dtype(dtype.name) is dtype and ts.dtype(np.dtype(numpy)) is dtype
    assert dtype.itemsize == np.dtype(numpy).itemsize


def test_unknown_dtype():
    with pytest.raises(TypeError, match=r"unknown dtype 'float64'; expected one of ts.f32"):
        ts.dtype("float64")


def test_tensor_annotation():
    t = Tensor["B", "H", 128, "D", ts.bf16]
    assert t.dims == ("B", "H", 128, "D") and t.dtype is ts.bf16
    assert t.symbols == ("B", "H", "D") and t.rank == 4
    assert repr(t) == "Tensor['B', 'H', 128, 'D', ts.bf16]"
    assert t.describe() == "[B, H, 128, D] bf16"


def test_tensor_annotation_needs_dtype_last():
    with pytest.raises(TypeError, match=r"the last item must be a dtype .*found 'K'"):
        Tensor["M", "K"]


@pytest.mark.parametrize("dim", [0, -3, "2x", "class", 1.5, True])
def test_tensor_annotation_rejects_bad_dims(dim):
    with pytest.raises(TypeError, match="must be a name .* or a positive int"):
        Tensor[dim, ts.f32]
