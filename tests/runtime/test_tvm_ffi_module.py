"""A CPU kernel from ts.compile as one tvm-ffi library, loaded in a fresh process as a TVM user would.

The numerics are compared with numpy (float32; tolerance as in the frontend numerics tests: a
softmax over 40 columns and 16-term dot products stay within 1e-5 of numpy's float32).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import tvm_ffi

import tessera as ts
from tessera import Tensor, ops


@ts.kernel
def mlp(x: Tensor["M", "K", ts.f32], w: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.softmax(ops.relu(ops.matmul(x, w) + b))


SHAPES = {"M": 24, "K": 16, "N": 40}


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    compiled = ts.compile(mlp, target="cpu", shapes=SHAPES)
    return compiled.build_module(tmp_path_factory.mktemp("mlp"))


def _reference(x, w, b):
    r = np.maximum(x @ w + b, 0)
    e = np.exp(r - r.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch
    import tvm_ffi

    lib, kind = sys.argv[1], sys.argv[2]
    f = tvm_ffi.load_module(lib)["mlp"]
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((24, 16), (16, 40), (40,)))
    if kind == "numpy":
        out = np.zeros((24, 40), np.float32)
        f(*[tvm_ffi.from_dlpack(a) for a in (x, w, b, out)])
    else:
        out_t = torch.zeros(24, 40)
        f(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), out_t)
        out = out_t.numpy()
    errors = {}
    for case, args in {
        "shape": (x, x, b, out),
        "dtype": (x, w.astype(np.float64), b, out),
        "strides": (x, np.asfortranarray(w), b, out),
    }.items():
        try:
            f(*[tvm_ffi.from_dlpack(a) for a in args])
        except Exception as exc:
            errors[case] = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"x": x.tolist(), "w": w.tolist(), "b": b.tolist(), "out": out.tolist(), "errors": errors}))
    """
)


def _run_child(library, kind: str) -> dict:
    """Load and call the library in a fresh interpreter that never imports tessera."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(library), kind], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_library_exports_one_tvm_ffi_entry_per_kernel(library):
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
    assert " T __tvm_ffi_mlp" in symbols
    assert library.with_name("mlp.entry.cc").is_file()


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_fresh_process_runs_it_on_numpy_and_torch(library, kind):
    result = _run_child(library, kind)
    x, w, b = (np.array(result[k], np.float32) for k in ("x", "w", "b"))
    np.testing.assert_allclose(np.array(result["out"], np.float32), _reference(x, w, b), rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_errors_naming_the_argument(library):
    errors = _run_child(library, "numpy")["errors"]
    assert errors["shape"] == "ValueError: mlp: argument w has shape[0] = 24; expected 16"
    assert errors["dtype"].startswith("TypeError: mlp: argument w has DLPack dtype (code 2, bits 64")
    assert errors["strides"].startswith("ValueError: mlp: argument w is not contiguous")


def test_kernels_that_return_an_input_copy_it():
    @ts.kernel
    def both(x: Tensor["M", ts.f32]) -> (Tensor["M", ts.f32], Tensor["M", ts.f32]):
        return ops.relu(x), x

    import tvm_ffi

    path = ts.compile(both, target="cpu", shapes={"M": 8}).build_module()
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    out0, out1 = np.zeros(8, np.float32), np.zeros(8, np.float32)
    tvm_ffi.load_module(str(path))["both"](*[tvm_ffi.from_dlpack(a) for a in (x, out0, out1)])
    np.testing.assert_array_equal(out0, np.maximum(x, 0))
    np.testing.assert_array_equal(out1, x)


def test_targets_without_a_module_builder_say_so():
    with pytest.raises(ts.NotRunnableError, match=r"build_module\(\) is not supported for rocm \(HIP\) yet"):
        ts.compile(mlp, target="rocm", shapes=SHAPES).build_module()


def test_tvm_runtime_load_module_finds_the_same_entry(library):
    from tessera_tvm._tvm import tvm

    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((24, 16), (16, 40), (40,)))
    out = tvm.runtime.tensor(np.zeros((24, 40), np.float32))
    tvm.runtime.load_module(str(library))["mlp"](*[tvm.runtime.tensor(a) for a in (x, w, b)], out)
    np.testing.assert_allclose(out.numpy(), _reference(x, w, b), rtol=1e-5, atol=1e-6)


def test_calls_run_the_kernels_in_one_entry_call(monkeypatch):
    """ts.compile's calls on numpy arrays go through the tvm-ffi entry (linked against the device
    kernels' own libraries): with the kernel-by-kernel path broken, they still compute."""
    from tessera.instance import DeviceKernel

    compiled = ts.compile(mlp, target="cpu", shapes=SHAPES)
    rng = np.random.default_rng(2)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((24, 16), (16, 40), (40,)))
    assert compiled._instance.host_entry is not None

    def broken(self, arrays):
        raise AssertionError("ran kernel by kernel")

    monkeypatch.setattr(DeviceKernel, "run", broken)
    np.testing.assert_allclose(compiled(x, w, b), _reference(x, w, b), rtol=1e-5, atol=1e-6)
    with pytest.raises(AssertionError, match="kernel by kernel"):  # an array the entry would refuse: the old path
        compiled._instance.run((x, np.asfortranarray(w), b))


def test_torch_cpu_tensors_in_give_torch_tensors_out():
    import torch

    compiled = ts.compile(mlp, target="cpu", shapes=SHAPES)
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((24, 16), (16, 40), (40,)))
    out = compiled(torch.from_numpy(x), torch.from_numpy(w).t().contiguous().t(), torch.from_numpy(b))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and tuple(out.shape) == (24, 40)
    np.testing.assert_allclose(out.numpy(), _reference(x, w, b), rtol=1e-5, atol=1e-6)
    with pytest.raises(
        ts.ArgumentError, match="pass all arguments as torch CPU tensors or all as numpy arrays, not a mix"
    ):
        compiled(torch.from_numpy(x), w, b)
    with pytest.raises(ts.ArgumentError, match=r"argument x is a torch tensor on meta, but this kernel runs on"):
        compiled(torch.empty(24, 16, device="meta"), torch.from_numpy(w), torch.from_numpy(b))
    with pytest.raises(ts.ArgumentError, match=r"argument w has dtype torch.float64, expected f32"):
        compiled(torch.from_numpy(x), torch.from_numpy(w).double(), torch.from_numpy(b))


def test_bf16_numpy_and_torch_run_in_the_entry(monkeypatch):
    """numpy cannot hand bf16 over through DLPack (ml_dtypes): its arrays go to the entry as torch
    views of the same memory (a kernel-by-kernel call costs ~25 us more), read-only ones too."""
    import ml_dtypes
    import torch

    from tessera.instance import DeviceKernel

    @ts.kernel
    def act(x: Tensor["M", ts.bf16], y: Tensor["M", ts.f32]) -> Tensor["M", ts.bf16]:
        return ops.cast(ops.relu(ops.cast(x, ts.f32)) + y, ts.bf16)

    compiled = ts.compile(act, target="cpu", shapes={"M": 8})
    x = np.linspace(-1, 1, 8, dtype=np.float32).astype(ml_dtypes.bfloat16)
    y = np.arange(8, dtype=np.float32) / 8
    want = (np.maximum(x.astype(np.float32), 0) + y).astype(ml_dtypes.bfloat16)

    def broken(self, arrays):
        raise AssertionError("ran kernel by kernel")

    monkeypatch.setattr(DeviceKernel, "run", broken)
    frozen = x.copy()
    frozen.flags.writeable = False
    for given in (x, frozen):
        out = compiled(given, y)
        assert type(out) is np.ndarray and out.dtype == ml_dtypes.bfloat16 and out.shape == (8,)
        np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    out = compiled(torch.from_numpy(x.astype(np.float32)).bfloat16(), torch.from_numpy(y))
    assert out.dtype == torch.bfloat16
    np.testing.assert_array_equal(out.float().numpy(), want.astype(np.float32))
    with pytest.raises(AssertionError, match="kernel by kernel"):  # not contiguous: the old path
        compiled._instance.run((np.repeat(x, 2)[::2], y))


@ts.kernel
def to_e4m3(x: Tensor["N", ts.f32]) -> Tensor["N", ts.fp8_e4m3]:
    return ops.cast(x, ts.fp8_e4m3)


@ts.kernel
def to_e5m2(x: Tensor["N", ts.f32]) -> Tensor["N", ts.fp8_e5m2]:
    return ops.cast(x, ts.fp8_e5m2)


@ts.kernel
def from_e4m3(x: Tensor["N", ts.fp8_e4m3]) -> Tensor["N", ts.f32]:
    return ops.cast(x, ts.f32) * 2.0


@pytest.mark.parametrize("kernel, name", [(to_e4m3, "float8_e4m3fn"), (to_e5m2, "float8_e5m2")])
def test_fp8_results_are_encoded_as_ml_dtypes_encodes_them(kernel, name, tmp_path):
    # CPU tile programs hold fp8 as float32; the entry encodes the result. Every value, the midpoints
    # between neighbours (ties go to the even code), overflow, subnormals, inf and NaN: bit for bit.
    import ml_dtypes

    fp8 = getattr(ml_dtypes, name)
    values = np.arange(256, dtype=np.uint8).view(fp8).astype(np.float32)
    finite = np.sort(values[np.isfinite(values)])
    midpoints = (finite[:-1] + finite[1:]) / 2
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [finite, midpoints, np.nextafter(midpoints, np.inf), np.nextafter(midpoints, -np.inf),
         [1e9, -1e9, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 0.0, -0.0],
         rng.standard_normal(500).astype(np.float32) * 100]
    ).astype(np.float32)  # fmt: skip
    compiled = ts.compile(kernel, target="cpu", shapes={"N": x.size})
    f = tvm_ffi.load_module(str(compiled.build_module(tmp_path)))[kernel.name]
    out = torch.empty(x.size, dtype=getattr(torch, name))
    f(torch.from_numpy(x), out)
    got = out.view(torch.uint8).numpy()
    want = x.astype(fp8)
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.view(fp8).astype(np.float32)), nan)
    assert np.array_equal(got[~nan], want.view(np.uint8)[~nan])


def test_fp8_inputs_are_decoded_exactly(tmp_path):
    import ml_dtypes

    codes = np.arange(256, dtype=np.uint8)
    compiled = ts.compile(from_e4m3, target="cpu", shapes={"N": 256})
    f = tvm_ffi.load_module(str(compiled.build_module(tmp_path)))["from_e4m3"]
    out = torch.empty(256)
    f(torch.from_numpy(codes).view(torch.float8_e4m3fn), out)
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * 2
    np.testing.assert_array_equal(out.numpy(), want)  # NaN where the code is NaN, exact elsewhere


def test_one_library_binds_the_dims_from_the_arguments(tmp_path):
    # A kernel compiled for M = 8 and M = 24: the entry picks by the arguments' shapes.
    compiled = ts.compile(mlp, target="cpu", shapes={"K": 16, "N": 40})
    f = tvm_ffi.load_module(str(compiled.build_module(tmp_path, shapes=[{"M": 8}, {"M": 24}])))["mlp"]
    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((16, 40)).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    for m in (8, 24, 8):
        x = rng.standard_normal((m, 16)).astype(np.float32)
        out = torch.zeros(m, 40)
        f(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), out)
        np.testing.assert_allclose(out.numpy(), _reference(x, w, b), rtol=1e-5, atol=1e-6)
    x = torch.zeros(10, 16)
    with pytest.raises(ValueError, match=r"mlp: the arguments' shapes match none of the dims this library was built "
                       r"for \(M=8,K=16,N=40 \| M=24,K=16,N=40\)"):  # fmt: skip
        f(x, torch.from_numpy(w), torch.from_numpy(b), torch.zeros(10, 40))
    with pytest.raises(TypeError, match="mlp: takes 4 tensors"):
        f(x)


def test_several_shapes_are_checked_before_anything_is_built(tmp_path):
    compiled = ts.compile(mlp, target="cpu", shapes={"K": 16, "N": 40})
    with pytest.raises(ts.ShapeError, match=r"shapes \{'Q': 3\} names unknown dims \['Q'\]"):
        compiled.build_module(tmp_path / "a", shapes=[{"M": 8}, {"Q": 3}])
    with pytest.raises(ts.ShapeError, match="shapes takes a list of dicts"):
        compiled.build_module(tmp_path / "b", shapes={"M": 8})
    with pytest.raises(ts.TesseraError, match="the same dims were given twice"):
        compiled.build_module(tmp_path / "c", shapes=[{"M": 8}, {"M": 8}])
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()
