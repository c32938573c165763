# ruff: noqa: F821, F722  (Tensor["M", "K", ...] dims are strings, not names)
"""Kernels compiled for CUDA configs run on a GPU, with torch CUDA tensors or numpy arrays.

Without a GPU (CI): compiling still builds the runtime library (nvcc tests), the library loads,
and calling says why it cannot run; argument checks and the numpy<->torch conversions are tested
on the CPU. With a GPU (``pytest -m gpu``): each kernel runs and matches the CPU target's result.
"""

# No `from __future__ import annotations`: the kernels annotate with module-level dtypes.

import ml_dtypes
import numpy as np
import pytest
import torch
import tvm_ffi

import tessera as ts
from tessera import Tensor, ops
from tessera.gpu import from_torch, gpu_available, to_torch
from tessera_tvm._tvm import tvm


@ts.kernel
def linear(A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16], b: Tensor["N", ts.f16]):
    return ops.gelu(ops.matmul(A, W) + b)


@ts.kernel
def block(x: Tensor["M", "N", ts.bf16], W: Tensor["N", "P", ts.bf16]):
    return ops.softmax(ops.matmul(ops.layer_norm(x), W))


@ts.kernel
def attention(q: Tensor[1, 4, "S", 64, ts.bf16], k: Tensor[1, 4, "S", 64, ts.bf16], v: Tensor[1, 4, "S", 64, ts.bf16]):
    return ops.flash_attention(q, k, v, causal=True)


LINEAR_SHAPES = {"M": 200, "N": 136, "K": 72}  # not multiples of the block


def _linear_inputs(rng):
    return (
        rng.standard_normal((200, 72)).astype(np.float16),
        (rng.standard_normal((72, 136)) / 8).astype(np.float16),
        rng.standard_normal(136).astype(np.float16),
    )


# ---------------------------------------------------------------------------------------- no GPU needed


@pytest.mark.nvcc
@pytest.mark.parametrize("target", ["hopper", "ampere"])
def test_compile_builds_a_loadable_runtime_library(target):
    k = ts.compile(linear, target=target, shapes=LINEAR_SHAPES)
    (files,) = k.artifacts.values()
    assert files["runtime"].name.endswith(".cuda.so") and files["runtime"].exists()
    module = tvm.runtime.load_module(str(files["runtime"]))  # loads without a GPU; the cubin is inside
    (device,) = module.imports
    assert device.kind == "cuda"
    assert module.implements_function(k.device_kernels[0].name)


@pytest.mark.nvcc
def test_runtime_build_restores_tilelang_compile_callback():
    name = "tilelang_callback_cuda_compile"
    before = tvm.ffi.get_global_func(name)
    ts.compile(linear, target="ampere", shapes={"M": 64, "N": 64, "K": 32}, schedule={"block_m": 64})
    after = tvm.ffi.get_global_func(name)
    source = 'extern "C" __global__ void k() {}'
    assert before is not None and after is not None
    # TileLang's own compile callback is back: it compiles a source it has never seen (no served cubin).
    assert bytes(after(source, tvm.target.Target({"kind": "cuda", "arch": "sm_80"})))[:4] == b"\x7fELF"


@pytest.mark.nvcc
@pytest.mark.skipif(gpu_available(), reason="checks the message given where no GPU is present")
def test_calling_without_a_gpu_says_so():
    k = ts.compile(linear, target="hopper", shapes=LINEAR_SHAPES)
    assert not k.runnable
    with pytest.raises(ts.NotRunnableError, match=r"no NVIDIA GPU is visible to torch here"):
        k(*_linear_inputs(np.random.default_rng(0)))


def test_unbuilt_cuda_kernel_names_the_reason():
    k = ts.compile(linear, target="ampere", shapes=LINEAR_SHAPES, build=False)
    assert not k.runnable
    with pytest.raises(ts.NotRunnableError, match=r"no CUDA runtime library .* compiled with build=False"):
        k(*_linear_inputs(np.random.default_rng(0)))


def test_rocm_kernels_do_not_run_here():
    k = ts.compile(linear, target="rocm", shapes=LINEAR_SHAPES, build=False)
    with pytest.raises(ts.NotRunnableError, match=r"compiled for rocm \(hip\); its kernels do not run"):
        k(*_linear_inputs(np.random.default_rng(0)))


@pytest.mark.nvcc
def test_cpu_torch_tensor_is_rejected_before_running():
    k = ts.compile(linear, target="hopper", shapes=LINEAR_SHAPES)
    a, w, b = (torch.from_numpy(x) for x in _linear_inputs(np.random.default_rng(0)))
    with pytest.raises(ts.ArgumentError, match=r"argument A is a torch tensor on cpu; expected a CUDA tensor"):
        k(a, w, b)


@pytest.mark.nvcc
def test_wrong_torch_dtype_is_rejected():
    k = ts.compile(linear, target="hopper", shapes=LINEAR_SHAPES)
    a, w, b = _linear_inputs(np.random.default_rng(0))
    with pytest.raises(ts.ArgumentError, match=r"argument A is a str; expected a torch CUDA tensor or a numpy array"):
        k("a", w, b)
    with pytest.raises(ts.ArgumentError, match=r"argument W has dtype float32, expected f16"):
        k(a, w.astype(np.float32), b)


@pytest.mark.parametrize(
    "tvm_dtype, values",
    [
        ("bfloat16", np.array([1.5, -2.25, 3e38, -0.0], dtype=ml_dtypes.bfloat16)),
        ("float8_e4m3fn", np.array([1.5, -2.25, 448.0, -0.0], dtype=ml_dtypes.float8_e4m3fn)),
        ("float16", np.array([1.5, -2.25, 65504.0, -0.0], dtype=np.float16)),
    ],
)
def test_numpy_torch_round_trip_keeps_every_bit(tvm_dtype, values):
    tensor = to_torch(values, tvm_dtype, "cpu")
    assert str(tensor.dtype) == f"torch.{tvm_dtype}"
    assert tensor.float().tolist() == values.astype(np.float32).tolist()
    back = from_torch(tensor, tvm_dtype)
    assert back.dtype == values.dtype and back.tobytes() == values.tobytes()


# ---------------------------------------------------------------------------------------- on a GPU


def _cpu_reference(kernel, arrays):
    return np.asarray(ts.compile(kernel, target="cpu")(*arrays), dtype=np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["hopper", "ampere"])
def test_linear_runs_on_the_gpu_with_numpy_and_torch(target):
    arrays = _linear_inputs(np.random.default_rng(1))
    expected = _cpu_reference(linear, arrays)
    k = ts.compile(linear, target=target, shapes=LINEAR_SHAPES)
    assert k.runnable
    got = k(*arrays)  # numpy in, numpy out
    assert isinstance(got, np.ndarray) and got.dtype == np.float16 and got.shape == (200, 136)
    # f16 inputs, f32 accumulation in both; the output rounds to f16: 1e-2 relative covers its ulp.
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=1e-2, atol=1e-2)
    tensors = [torch.from_numpy(x).cuda() for x in arrays]
    out = k(*tensors)  # torch in, torch out, on the same device
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.dtype == torch.float16
    np.testing.assert_array_equal(out.cpu().numpy(), got)


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["hopper", "ampere"])
def test_fused_kernels_chain_on_the_gpu(target):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((96, 128)).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((128, 80)) / 8).astype(ml_dtypes.bfloat16)
    expected = _cpu_reference(block, (x, w))
    k = ts.compile(block, target=target, shapes={"M": 96, "N": 128, "P": 80})
    assert len(k.device_kernels) > 1  # layer_norm, matmul, softmax: intermediates stay on the GPU
    got = k(x, w)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=2e-2, atol=2e-3)  # bf16 ulp is 2^-8


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["hopper", "ampere"])
def test_flash_attention_runs_on_the_gpu(target):
    rng = np.random.default_rng(3)
    q, k_, v = (rng.standard_normal((1, 4, 200, 64)).astype(ml_dtypes.bfloat16) for _ in range(3))
    expected = _cpu_reference(attention, (q, k_, v))
    k = ts.compile(attention, target=target, shapes={"S": 200})
    got = k(*(torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16) for a in (q, k_, v)))
    np.testing.assert_allclose(got.float().cpu().numpy(), expected, rtol=2e-2, atol=2e-2)


@ts.kernel
def masked_attention(
    q: Tensor["B", 8, "S", 64, ts.bf16],
    k: Tensor["B", 2, "S", 64, ts.bf16],
    v: Tensor["B", 2, "S", 64, ts.bf16],
    m: Tensor["B", 1, 1, "S", ts.bf16],
):
    return ops.flash_attention(q, k, v, bias=m)


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["hopper", "ampere"])
def test_flash_attention_with_a_padding_mask_runs_on_the_gpu_and_matches_torch(target):
    rng = np.random.default_rng(5)
    b, s = 2, 300
    q = rng.standard_normal((b, 8, s, 64)).astype(ml_dtypes.bfloat16)
    k_, v = (rng.standard_normal((b, 2, s, 64)).astype(ml_dtypes.bfloat16) for _ in range(2))
    m = np.zeros((b, 1, 1, s), np.float32)
    m[0, ..., 250:] = -np.inf  # the first sequence is padded after 250 tokens
    m = m.astype(ml_dtypes.bfloat16)
    k = ts.compile(masked_attention, target=target, shapes={"B": b, "S": s})
    got = k(*(torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16) for a in (q, k_, v, m)))
    tq, tk, tv, tm = (torch.from_numpy(a.astype(np.float32)) for a in (q, k_, v, m))
    want = torch.nn.functional.scaled_dot_product_attention(
        tq, tk.repeat_interleave(4, dim=1), tv.repeat_interleave(4, dim=1), attn_mask=tm
    )
    np.testing.assert_allclose(got.float().cpu().numpy(), want.numpy(), rtol=2e-2, atol=2e-2)


def _attention_of(causal: bool, causal_align: str = "top_left"):
    def attention(
        q: Tensor["B", "H", "Sq", "D", ts.bf16],
        k: Tensor["B", "Hkv", "Skv", "D", ts.bf16],
        v: Tensor["B", "Hkv", "Skv", "D", ts.bf16],
    ):
        return ops.flash_attention(q, k, v, causal=causal, causal_align=causal_align)

    return ts.kernel(attention)


OVERLAP_CASES = {
    # GQA, both lengths ragged at the 128-key block
    "gqa": (_attention_of(False), {"B": 2, "H": 8, "Hkv": 2, "Sq": 1000, "Skv": 1000, "D": 64}),
    "causal_d128": (_attention_of(True), {"B": 1, "H": 4, "Hkv": 4, "Sq": 1000, "Skv": 1000, "D": 128}),
    # bottom-right with more queries than keys: the first 170 queries see no key (zero rows)
    "bottom_right": (_attention_of(True, "bottom_right"), {"B": 1, "H": 2, "Hkv": 1, "Sq": 300, "Skv": 130, "D": 64}),
    # one key block: the loop's first and last iterations are all of it
    "one_block": (_attention_of(True), {"B": 1, "H": 2, "Hkv": 2, "Sq": 100, "Skv": 100, "D": 64}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(OVERLAP_CASES))
def test_overlapped_attention_runs_on_hopper_and_matches_the_cpu(case):
    """schedule overlap=True: the hand-pipelined loop (asynchronous wgmma, softmax beside P V)."""
    kernel, shapes = OVERLAP_CASES[case]
    rng = np.random.default_rng(7)
    q = rng.standard_normal((shapes["B"], shapes["H"], shapes["Sq"], shapes["D"])).astype(ml_dtypes.bfloat16)
    k_, v = (
        rng.standard_normal((shapes["B"], shapes["Hkv"], shapes["Skv"], shapes["D"])).astype(ml_dtypes.bfloat16)
        for _ in range(2)
    )
    expected = np.asarray(ts.compile(kernel, target="cpu", shapes=shapes)(q, k_, v), dtype=np.float32)
    k = ts.compile(kernel, target="hopper", shapes=shapes, schedule={"overlap": True})
    assert k.schedules[0].overlap
    got = k(*(torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16) for a in (q, k_, v)))
    np.testing.assert_allclose(got.float().cpu().numpy(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_overlapped_attention_with_a_padding_mask_runs_on_hopper():
    """The bias path: scores scaled (and the mask added) in the log2 domain after the wait for Q K^T."""
    rng = np.random.default_rng(9)
    b, s = 2, 300
    q = rng.standard_normal((b, 8, s, 64)).astype(ml_dtypes.bfloat16)
    k_, v = (rng.standard_normal((b, 2, s, 64)).astype(ml_dtypes.bfloat16) for _ in range(2))
    m = np.zeros((b, 1, 1, s), np.float32)
    m[1, ..., 200:] = -np.inf
    m = m.astype(ml_dtypes.bfloat16)
    expected = _cpu_reference(masked_attention, (q, k_, v, m))
    k = ts.compile(masked_attention, target="hopper", shapes={"B": b, "S": s}, schedule={"overlap": True})
    got = k(*(torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16) for a in (q, k_, v, m)))
    np.testing.assert_allclose(got.float().cpu().numpy(), expected, rtol=2e-2, atol=2e-2)


def test_gpu_orchestration_matches_the_cpu_with_the_launch_emulated(monkeypatch):
    """run_on_gpu's conversions, reshapes and intermediates, checked without a GPU: torch CPU tensors
    stand in for CUDA ones and each fused kernel's launch runs the CPU target's kernel instead."""
    import tessera.gpu as gpu
    import tessera_tvm.target.cuda.runner as cuda_runner
    from tessera.compiler import DeviceKernel

    shapes = {"M": 40, "N": 48, "P": 24}
    rng = np.random.default_rng(4)
    x = rng.standard_normal((40, 48)).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((48, 24)) / 8).astype(ml_dtypes.bfloat16)
    cpu = ts.compile(block, target="cpu", shapes=shapes)
    expected = cpu(x, w)
    on_cpu = {dk.name: dk for dk in cpu.device_kernels}
    k = ts.compile(block, target="hopper", shapes=shapes, build=False)
    assert [dk.name for dk in k.device_kernels] == list(on_cpu)
    launched = []
    run_on_cpu = DeviceKernel.run

    def launch(self, named):  # what the CUDA kernel would do, on the CPU target's kernel
        launched.append(self.name)
        reference = on_cpu[self.name]
        spec = reference.tile_spec
        arrays = {
            p.name: from_torch(named[p.name], str(named[p.name].dtype).removeprefix("torch.")) for p in spec.params()
        }
        held = {
            n: np.ascontiguousarray(a.astype(np.dtype(ts.dtype(p.dtype).numpy)))
            for (n, a), p in zip(arrays.items(), spec.params(), strict=True)
        }
        run_on_cpu(reference, held)
        (out,) = spec.outputs()
        result = held[out.name].astype(arrays[out.name].dtype)
        named[out.name].copy_(to_torch(result, str(named[out.name].dtype).removeprefix("torch."), "cpu"))

    for dk in k.device_kernels:
        dk.lowered.artifacts["runtime"] = dk.lowered.artifacts["source"]  # stands in for the library
    monkeypatch.setattr(cuda_runner, "gpu_available", lambda: True)  # where the CUDA runner reads it
    monkeypatch.setattr(cuda_runner, "_default_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(gpu, "on_gpu", lambda tensor: True)
    monkeypatch.setattr(DeviceKernel, "run", launch)
    got = k(x, w)  # numpy in: numpy out, of the graph's dtype
    assert launched == list(on_cpu)
    assert isinstance(got, np.ndarray) and got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got.astype(np.float32), expected.astype(np.float32))
    out = k(*(to_torch(a, "bfloat16", "cpu") for a in (x, w)))  # torch in: torch out
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    np.testing.assert_array_equal(out.float().numpy(), expected.astype(np.float32))


def test_gpu_calls_go_through_the_kernels_library_in_one_call(monkeypatch):
    """With cubins built, k(...) on a CUDA config calls the kernel's tvm-ffi library once (here a
    stand-in that runs the CPU target's library on torch CPU tensors): numpy in gives numpy out."""
    import tessera_tvm.target.cuda.runner as cuda_runner

    shapes = {"M": 40, "N": 48, "P": 24}
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 48)).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((48, 24)) / 8).astype(ml_dtypes.bfloat16)
    cpu = ts.compile(block, target="cpu", shapes=shapes)
    expected = cpu(x, w)
    cpu_library = tvm_ffi.load_module(str(cpu.build_module()))["block"]
    k = ts.compile(block, target="hopper", shapes=shapes, build=False)
    instance = k._require_instance("test")
    from tessera.module import module_plan

    calls = []

    def library(*tensors):
        calls.append([tuple(t.shape) for t in tensors])
        cpu_library(*tensors)

    instance.__dict__["gpu_entry"] = (library, module_plan(instance))
    for dk in k.device_kernels:
        dk.lowered.artifacts["runtime"] = dk.lowered.artifacts["source"]  # stands in for the built library
    monkeypatch.setattr(cuda_runner, "gpu_available", lambda: True)  # where the CUDA runner reads it
    monkeypatch.setattr(cuda_runner, "_default_device", lambda: torch.device("cpu"))
    got = k(x, w)
    assert calls == [[(40, 48), (48, 24), (40, 24)]]  # one call: inputs, then the output
    assert isinstance(got, np.ndarray) and got.dtype == expected.dtype
    np.testing.assert_array_equal(got.astype(np.float32), expected.astype(np.float32))
