"""The CUDA backend (codegen kind ``cuda``): nvcc builds of TileLang's CUDA source and the runtime library.

:mod:`.nvcc` drives nvcc (``.cu`` -> ``.ptx`` -> ``.cubin``, ptxas's resource report), :mod:`.runtime`
packs the host launcher and the cubin into a loadable library and runs it on torch CUDA tensors,
:mod:`.lowered` is what ``tessera_tvm.lower`` calls through the manifest in :mod:`.backend`. The nvcc
driver's names are importable from here without TVM; the runtime's are imported on first use.
"""

from typing import Any

from .nvcc import (  # noqa: F401
    CUDA_FORMATS,
    CudaBuild,
    compile_cuda,
    gencode_flag,
    nvcc_available,
    parse_ptxas_report,
)

_RUNTIME = ("CudaKernel", "GpuUnavailableError", "build_cuda_runtime", "cuda_device_count")

__all__ = ["CUDA_FORMATS", "CudaBuild", "compile_cuda", "gencode_flag", "nvcc_available", "parse_ptxas_report"]
__all__ += list(_RUNTIME)


def __getattr__(name: str) -> Any:
    if name in _RUNTIME:  # the runtime imports TVM: only when asked for
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
