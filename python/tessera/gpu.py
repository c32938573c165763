"""Running a kernel compiled for a CUDA config on an NVIDIA GPU: the names users import.

    k = ts.compile(linear, target="hopper", shapes={"M": 4096, "N": 4096, "K": 4096})
    out = k(a, w, b)        # torch CUDA tensors in, a torch CUDA tensor out (zero-copy)
    out = k(a_np, w_np, b_np)  # numpy in: copied to the GPU, the result copied back to numpy

The CUDA backend owns the running (memory, launch, synchronising, the autotuner's bench):
:mod:`tessera_tvm.target.cuda.runner`, which ``ts.compile``'s kernels reach through their backend's
runner. This module re-exports its conversions and checks under their old names.
"""

from __future__ import annotations

from tessera_tvm.target.cuda.runner import (  # noqa: F401  (re-exported: the frontend's and users' names)
    TorchMemory,
    _default_device,
    from_torch,
    gpu_available,
    is_torch_tensor,
    on_gpu,
    run_on_gpu,
    synchronize,
    to_torch,
    torch_dtype,
)

__all__ = [
    "TorchMemory",
    "from_torch",
    "gpu_available",
    "is_torch_tensor",
    "on_gpu",
    "run_on_gpu",
    "to_torch",
    "torch_dtype",
]
