"""The CUDA runtime library: a lowered CUDA kernel as a loadable module that runs on an NVIDIA GPU.

Building needs nvcc and g++ but no GPU; running needs a GPU. :func:`build_cuda_runtime` packs

- the device module: the cubin Tessera's own nvcc driver built (:mod:`tessera_tvm.target.cuda.nvcc`),
  wrapped by TileLang's CUDA module codegen, which records each kernel's launch parameters
  (grid, block, dynamic shared memory) from the device IR,
- the host module: the host PrimFunc of the lowered module (argument checks, TMA descriptor
  creation, the kernel launch) generated as C by TileLang's host codegen,

into one shared library (``<name>.cuda.so``) with TVM's ``export_library``. :class:`CudaKernel`
loads it on the first call and runs it on torch CUDA tensors (zero-copy through DLPack).

TileLang's CUDA module codegen compiles its source through the global callback
``tilelang_callback_cuda_compile``; :func:`_serving_cubin` stands in for it while we build, handing
back the cubin we already have, so nvcc runs once per kernel (and with Tessera's flags).
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tessera_tvm._tvm import tvm  # importing it registers TileLang's codegens

from ...errors import TesseraError
from ..toolchain import validate_artifact_name

__all__ = ["CudaKernel", "GpuUnavailableError", "build_cuda_runtime", "cuda_device_count"]

_COMPILE_CALLBACK = "tilelang_callback_cuda_compile"
_CALLBACK_LOCK = threading.Lock()


class GpuUnavailableError(TesseraError, RuntimeError):
    """A CUDA kernel was called where no NVIDIA GPU (or no CUDA build of torch) is available."""


@contextmanager
def _serving_cubin(cubin: bytes, source: str) -> Iterator[None]:
    """While active, TileLang's CUDA module codegen receives ``cubin`` instead of compiling ``source``."""

    def serve(code: str, *_unused: Any) -> bytearray:
        if code != source:  # the codegen printed something else than the source we compiled: never mix
            raise TesseraError(
                "the CUDA source generated for the runtime module differs from the source nvcc compiled; "
                "rebuild the kernel (this is a Tessera bug: please report it with the kernel)"
            )
        return bytearray(cubin)

    with _CALLBACK_LOCK:
        original = tvm.ffi.get_global_func(_COMPILE_CALLBACK, allow_missing=True)
        tvm.ffi.register_global_func(_COMPILE_CALLBACK, serve, override=True)
        try:
            yield
        finally:
            if original is not None:
                tvm.ffi.register_global_func(_COMPILE_CALLBACK, original, override=True)
            else:
                tvm.ffi.remove_global_func(_COMPILE_CALLBACK)


def build_cuda_runtime(
    host_mod, device_mod, target, *, cubin_path: str | os.PathLike, source: str, out_dir: str | os.PathLike, name: str
) -> Path:
    """Write ``<out_dir>/<name>.cuda.so``: the host launcher and the cubin, loadable with :class:`CudaKernel`.

    ``device_mod`` is the device module after the config's codegen_prep phase and ``source`` the
    CUDA source generated from it (what ``cubin_path`` was compiled from). The library is written
    to a temporary name and renamed into place, so a failed build leaves nothing behind.
    """
    from tessera_tvm._tvm import create_backend_context, host_codegen

    validate_artifact_name(name)
    cubin = Path(cubin_path).read_bytes()
    with target:
        with _serving_cubin(cubin, source):
            device_rt = tvm.ffi.get_global_func("target.build.tilelang_cuda")(device_mod, target)
        context = create_backend_context(target, "c", None)
        host_rt = host_codegen(host_mod, context)
    host_rt.import_module(device_rt)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / f"{name}.cuda.so"
    fd, staging = tempfile.mkstemp(prefix=f".{name}.", suffix=".so", dir=out)
    os.close(fd)
    try:
        host_rt.export_library(staging)
        os.replace(staging, final)  # never write into a library another process may have mapped
    except Exception as exc:
        Path(staging).unlink(missing_ok=True)
        if isinstance(exc, TesseraError):
            raise
        raise TesseraError(f"building the CUDA runtime library {final} failed: {exc}") from exc
    return final


def cuda_device_count() -> int:
    """How many CUDA devices torch sees (0 without a GPU or with a CPU build of torch)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - tilelang needs torch at import
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class CudaKernel:
    """A CUDA runtime library's entry function, called with torch CUDA tensors in parameter order.

    The library is loaded on the first call, so a kernel built on a machine without a GPU can be
    inspected and shipped; calling it there raises :class:`GpuUnavailableError`.
    """

    def __init__(self, library: str | os.PathLike, symbol: str, buffers: Sequence[str]) -> None:
        self.library = Path(library)
        self.symbol = symbol
        self.buffers = list(buffers)  # the tile program's buffer parameters, in order
        self._function = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<CudaKernel {self.symbol} from {self.library.name}>"

    def _load(self):
        with self._lock:
            if self._function is None:
                module = tvm.runtime.load_module(str(self.library))
                self._function = module[self.symbol]
            return self._function

    def __call__(self, *tensors: Any) -> None:
        """Run on torch CUDA tensors (outputs written in place); synchronises with torch's stream."""
        if cuda_device_count() == 0:
            raise GpuUnavailableError(
                f"{self.symbol}: no NVIDIA GPU is visible to torch here (torch.cuda.is_available() is False); "
                f"the kernel's library {self.library} runs on a machine with a GPU and a CUDA build of torch"
            )
        import torch

        if len(tensors) != len(self.buffers):
            raise TesseraError(
                f"{self.symbol} takes {len(self.buffers)} tensors ({', '.join(self.buffers)}), got {len(tensors)}"
            )
        device = None
        for name, tensor in zip(self.buffers, tensors, strict=True):
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cuda":
                raise TesseraError(
                    f"{self.symbol}: argument {name} must be a torch CUDA tensor, found {_describe(tensor)}"
                )
            if not tensor.is_contiguous():
                raise TesseraError(f"{self.symbol}: argument {name} is not contiguous; call .contiguous() first")
            if device is not None and tensor.device != device:
                raise TesseraError(f"{self.symbol}: arguments are on {device} and {tensor.device}; put them on one GPU")
            device = tensor.device
        function = self._load()
        with torch.cuda.device(device):
            try:
                function(*tensors)
            except Exception as exc:  # the host code's own checks (shapes, dtypes) raise through the FFI
                raise TesseraError(f"{self.symbol} failed on {device}: {exc}") from None


def _describe(value: Any) -> str:
    device = getattr(value, "device", None)
    return f"{type(value).__name__}{f' on {device}' if device is not None else ''}"
