"""The CUDA backend's runner: a compiled kernel's values as torch tensors on an NVIDIA GPU.

    k = ts.compile(linear, target="hopper", shapes={"M": 4096, "N": 4096, "K": 4096})
    out = k(a, w, b)        # torch CUDA tensors in, a torch CUDA tensor out (zero-copy)
    out = k(a_np, w_np, b_np)  # numpy in: copied to the GPU, the result copied back to numpy

One call of the kernel's tvm-ffi library (``Instance.gpu_entry``: the CUDA backend's
``linked_module``, built into the kernel cache on first use) runs every fused kernel, with the
intermediates allocated on the GPU in stream order, on torch's current stream. A kernel the library
cannot express runs kernel by kernel through each fused kernel's runtime library
(``.artifacts[kernel]["runtime"]``, :class:`tessera_tvm.target.cuda.runtime.CudaKernel`). Without a GPU, compiling still writes every
artifact, and calling raises :class:`~tessera_tvm.errors.NotRunnableError` saying why. The
autotuner times candidates with CUDA events (:class:`CudaBench`). ``tessera.gpu`` re-exports the
conversions for users.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ... import trace as _trace
from ...errors import AutotuneError, NotRunnableError
from ..runner import Runner, readable

__all__ = [
    "GPU_RUNNER",
    "CudaBench",
    "GpuRunner",
    "TorchMemory",
    "from_torch",
    "gpu_available",
    "is_torch_tensor",
    "on_gpu",
    "run_on_gpu",
    "synchronize",
    "to_torch",
    "torch_dtype",
]


def gpu_available() -> bool:
    """Whether torch sees an NVIDIA GPU (a CUDA build of torch and a device)."""
    from .runtime import cuda_device_count

    return cuda_device_count() > 0


def is_torch_tensor(value: Any) -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - tilelang needs torch at import
        return False
    return isinstance(value, torch.Tensor)


def on_gpu(tensor) -> bool:
    """Whether a torch tensor lives on a CUDA device (what CUDA kernels take without a copy)."""
    return tensor.device.type == "cuda"


def torch_dtype(tvm_dtype: str):
    """The torch dtype of a TVM dtype string (``"bfloat16"`` -> ``torch.bfloat16``)."""
    try:
        return _torch_dtypes()[tvm_dtype]
    except KeyError:
        raise NotRunnableError(f"dtype {tvm_dtype} has no torch equivalent to run on the GPU") from None


@functools.cache
def _torch_dtypes() -> dict[str, Any]:
    import torch

    names = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
    names += ("int8", "int16", "int32", "int64", "uint8", "bool")
    return {name: getattr(torch, name) for name in names}


#: numpy dtypes torch cannot take directly, and the same-size integer they travel as.
_BIT_CARRIERS = {
    "bfloat16": (np.int16, "int16"),
    "float8_e4m3fn": (np.uint8, "uint8"),
    "float8_e5m2": (np.uint8, "uint8"),
}


def to_torch(array: np.ndarray, tvm_dtype: str, device) -> Any:
    """A numpy array (``ml_dtypes`` bf16/fp8 included) as a contiguous torch tensor on ``device``."""
    import torch

    carrier = _BIT_CARRIERS.get(tvm_dtype)
    host = readable(np.ascontiguousarray(array))  # torch.from_numpy warns on a read-only array
    if carrier is not None:
        tensor = torch.from_numpy(host.view(carrier[0])).to(device).view(torch_dtype(tvm_dtype))
    else:
        tensor = torch.from_numpy(host).to(device)
    return tensor


def from_torch(tensor, tvm_dtype: str) -> np.ndarray:
    """A torch tensor as a numpy array of the Tessera dtype (copied to the host)."""
    carrier = _BIT_CARRIERS.get(tvm_dtype)
    host = tensor.detach().cpu()
    if carrier is not None:
        import ml_dtypes  # numpy's bf16 and fp8 (every dtype with a carrier is one of them)

        return host.view(torch_dtype(carrier[1])).numpy().view(np.dtype(getattr(ml_dtypes, tvm_dtype)))
    return host.numpy()


class TorchMemory:
    """Arrays of ``Instance.run`` as torch tensors on one CUDA device: inputs converted and made
    contiguous there, intermediates never leave it (the methods of ``tessera.instance.Memory``)."""

    def __init__(self, device) -> None:
        self.device = device

    def hold(self, value: Any, dtype: str, shape: tuple[int, ...]) -> Any:
        return value.to(torch_dtype(dtype)).reshape(shape).contiguous()

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        import torch

        return torch.empty(shape, dtype=torch_dtype(dtype), device=self.device)

    def result(self, out: Any, dtype: str, shape: tuple[int, ...]) -> Any:
        return out.reshape(shape)  # a GPU tile program writes its graph dtype already

    def copy(self, value: Any) -> Any:
        return value.clone()

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)


def run_on_gpu(instance, arrays: Sequence[Any], collective=None) -> Any:
    """Run every fused kernel of ``instance`` on the GPU; numpy in gives numpy out, torch in gives torch out.
    ``collective``: a sharded kernel's hook for the collectives between its kernels (``Instance.run``),
    which receives and returns torch tensors on the device."""
    if not gpu_available():
        raise NotRunnableError(
            f"{instance.kernel.name} for {instance.config.name}: no NVIDIA GPU is visible to torch here "
            "(torch.cuda.is_available() is False); its source, cubin and runtime library are in .artifacts"
        )
    tensors = [a for a in arrays if is_torch_tensor(a)]
    device = tensors[0].device if tensors else _default_device()
    inputs = [
        value if is_torch_tensor(value) else to_torch(value, ttype.dtype.tvm, device)
        for value, (_, ttype) in zip(arrays, instance.kernel.params, strict=True)
    ]
    memory = TorchMemory(device)
    entry = instance.gpu_entry
    if entry is not None and _trace.active() is None and collective is None:
        # one call of the kernel's tvm-ffi library runs them all
        function, plan = entry  # it enters the tensors' device itself, and runs on torch's current stream
        held = [memory.hold(value, t.dtype, t.shape) for value, t in zip(inputs, plan.inputs, strict=True)]
        outs = [memory.empty(t.shape, t.dtype) for t in plan.outputs]
        function(*held, *outs)
        result = tuple(outs) if instance.graph.simplified.tuple_output else outs[0]
    else:  # under a trace each device kernel runs on its own, a span (and NVTX range) each, synchronised
        result = instance.run(inputs, memory, collective=collective)
    if tensors:
        return result
    if isinstance(result, tuple):
        return tuple(from_torch(r, str(r.dtype).removeprefix("torch.")) for r in result)
    return from_torch(result, str(result.dtype).removeprefix("torch."))


def synchronize() -> None:
    """Wait for the kernels queued on torch's current CUDA device (a metrics row times the work,
    not its launch)."""
    import torch

    torch.cuda.synchronize()


def _default_device():
    """Where numpy arguments go: torch's current CUDA device."""
    import torch

    return torch.device("cuda", torch.cuda.current_device())


class CudaBench:
    """Runs CUDA kernels where a GPU and the kernel's runtime library exist; CUDA events time them.

    Inputs and the output are torch tensors on torch's current CUDA device (where ``run_on_gpu``
    puts numpy arguments too), passed to ``lowered`` in the tile program's parameter order
    (``LoweredModule.__call__`` with a runtime library). Tested without a GPU by
    tests/frontend/test_autotune.py, which emulates the device, the launch and the events on the CPU.
    """

    on_gpu = True  # a Ray worker that measures these kernels holds a GPU (num_gpus=1)

    def __init__(self, spec, seed: int = 0):
        import torch

        self.device = _default_device()
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.spec = spec
        self.arrays = {}
        for p in spec.inputs():
            dtype = torch_dtype(p.dtype)
            if dtype.is_floating_point:
                data = torch.rand(p.shape, generator=gen, device=self.device, dtype=torch.float32) * 2 - 1
            else:  # as CpuBench: -3..3, wrapped into the dtype
                data = torch.randint(-3, 4, p.shape, generator=gen, device=self.device, dtype=torch.int64)
            self.arrays[p.name] = data.to(dtype)
        (self.out,) = spec.outputs()

    def prepare(self, lowered) -> tuple[Callable[[], Any], np.ndarray]:
        """A call of ``lowered`` on this bench's tensors, and the output of its first (warm-up) run
        (floats as float32, integers as they are), copied to the host."""
        import torch

        if "runtime" not in lowered.artifacts:
            raise AutotuneError(f"{lowered.name} has no CUDA runtime library (was nvcc on PATH?)")
        dtype = torch_dtype(self.out.dtype)
        fill = float("nan") if dtype.is_floating_point else 0  # an unwritten output shows
        out = torch.full(self.out.shape, fill, device=self.device, dtype=torch.float32).to(dtype)
        run = functools.partial(
            lowered, *[out if p.name == self.out.name else self.arrays[p.name] for p in self.spec.params()]
        )
        run()
        torch.cuda.synchronize(self.device)
        host = torch.float32 if dtype.is_floating_point else dtype
        return run, out.to("cpu", host, copy=True).numpy()

    def sample(self, run: Callable[[], Any], number: int) -> float:
        """Seconds per call, over ``number`` back-to-back calls, by CUDA events around them."""
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            run()
        end.record()
        torch.cuda.synchronize(self.device)
        return start.elapsed_time(end) / 1e3 / number  # elapsed_time is in milliseconds

    @staticmethod
    def available(config) -> str | None:
        """None when CUDA kernels of ``config`` can be timed here, else why not."""
        from .nvcc import nvcc_available

        if not gpu_available():
            return "no NVIDIA GPU is visible to this process"
        if not nvcc_available():
            return "nvcc is not on PATH (the kernels would have no cubin to run)"
        return None


class GpuRunner(Runner):
    """Runs a compiled instance on the GPU torch sees, its values as torch CUDA tensors."""

    device_memory = True
    bench = CudaBench

    def runnable(self, instance: Any) -> bool:
        """Every device kernel has its runtime library, and torch sees a GPU."""
        if instance is None:
            return False
        from .backend import CUDA

        built = all(CUDA.run_needs in dk.lowered.artifacts for dk in instance.devices)
        return built and gpu_available()

    def check_built(self, instance: Any, build: bool) -> None:
        unbuilt = [dk.name for dk in instance.devices if "runtime" not in dk.lowered.artifacts]
        if unbuilt:
            why = "it was compiled with build=False" if not build else "nvcc was not on PATH at compile time"
            raise NotRunnableError(
                f"{instance.kernel.name} for {instance.config.name} has no CUDA runtime library for "
                f"{', '.join(unbuilt)}: {why}; its source is in .artifacts (install the CUDA toolkit or set "
                "TESSERA_NVCC, then recompile)"
            )

    def run(self, instance: Any, arrays: Sequence[Any], collective: Callable[..., Any] | None = None) -> Any:
        return run_on_gpu(instance, arrays, collective=collective)

    def synchronize(self) -> None:
        synchronize()


GPU_RUNNER = GpuRunner()
