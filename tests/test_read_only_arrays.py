# ruff: noqa: F821  (dim names in Tensor[...] are not Python names)
"""Read-only arrays (``np.frombuffer``, read-only memory maps) as kernel arguments (issue #37, item 7):
taken as inputs without a copy, refused with an ArgumentError where a kernel writes."""

import numpy as np
import pytest

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops
from tessera_tvm.target.cpu import ArgumentError as CpuArgumentError
from tests.programs import gemm as programs


@ts.kernel
def linear(x: Tensor["M", "K", ts.f32], w: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.relu(ops.matmul(x, w))


def _read_only(array: np.ndarray) -> np.ndarray:
    out = np.frombuffer(array.tobytes(), array.dtype).reshape(array.shape)
    assert not out.flags.writeable
    return out


def test_read_only_inputs_run_and_write_no_capture(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_REPRO_DIR", str(tmp_path / "repro"))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((32, 16), dtype=np.float32), rng.standard_normal((16, 8), dtype=np.float32)
    k = ts.compile(linear, target="cpu", shapes={"M": 32, "K": 16, "N": 8})
    expected = np.maximum(x @ w, 0)
    out = k(_read_only(x), _read_only(w))  # the tvm-ffi entry (DLPack)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert out.flags.writeable
    with ts.trace(tmp_path / "trace.json"):  # kernel by kernel
        np.testing.assert_allclose(k(_read_only(x), _read_only(w)), expected, rtol=1e-5, atol=1e-5)
    assert not (tmp_path / "repro").exists()


def test_readable_aliases_without_a_copy():
    from tessera.instance import readable

    base = _read_only(np.arange(6, dtype=np.float32).reshape(2, 3))
    alias = readable(base)
    assert alias.flags.writeable and alias.dtype == base.dtype and alias.shape == base.shape
    assert alias.ctypes.data == base.ctypes.data
    writable = np.ones(3, np.float32)
    assert readable(writable) is writable


def test_the_cpu_runner_takes_read_only_inputs_and_refuses_a_read_only_output():
    lowered = tessera_tvm.lower(programs.cpu_gemm(64, 64, 32), "cpu")
    a, b = np.ones((64, 32), np.float32), np.ones((32, 64), np.float32)
    c = np.zeros((64, 64), np.float32)
    lowered(_read_only(a), _read_only(b), c)
    assert np.all(c == 32.0)
    with pytest.raises(CpuArgumentError, match=r"argument 'C' is a read-only array, but the kernel writes C"):
        lowered(a, b, _read_only(c))
