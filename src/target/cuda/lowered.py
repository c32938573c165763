"""The CUDA backend's part of ``tessera_tvm.lower``: nvcc, the runtime library and calling it.

``tessera_tvm.lower`` reaches these through the CUDA manifest (:mod:`.backend`): :func:`build` runs
nvcc (cubin + PTX when nvcc is on PATH), records ptxas's registers in the metadata, checks them
against the config's limits (:func:`check_registers`) and packs the runtime library; :func:`run`
calls that library on torch CUDA tensors.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ResourceError, TesseraError

_REGISTER_HINT = "reduce block_m/block_n (the accumulator lives in registers) or use more threads per block"


def build(lowered, out_dir: Path) -> None:
    """nvcc -> cubin + PTX, when nvcc is on PATH; registers from ptxas are checked and recorded."""
    from ..metadata import write_metadata
    from .nvcc import compile_cuda, nvcc_available

    if not nvcc_available():
        lowered.notes.append(
            "nvcc not on PATH: CUDA source written, cubin/PTX skipped (install the CUDA toolkit or set TESSERA_NVCC)"
        )
        return
    arch = lowered.config.target_dict["arch"]
    built = compile_cuda(
        lowered.source,
        arch=arch,
        out_dir=out_dir,
        name=lowered.name,
        extra_flags=tuple(lowered.config.codegen_dict["flags"]),
    )
    lowered.artifacts.update(cubin=built.cubin_path, ptx=built.ptx_path)
    for kernel in lowered.metadata:
        usage = built.resource_usage.get(kernel["name"])
        if usage:
            kernel["resources"]["regs_per_thread"] = usage["registers"]
            check_registers(
                kernel["name"],
                usage["registers"],
                lowered.config,
                threads_per_block=kernel["resources"].get("threads_per_block"),
            )
    if built.resource_usage:
        write_metadata(lowered)
    if built.cubin_path is not None:  # host launcher + cubin in one library that runs where a GPU is
        from .runtime import build_cuda_runtime

        lowered.artifacts["runtime"] = build_cuda_runtime(
            lowered.host_mod,
            lowered.device_mod,
            lowered.config.tvm_target(),
            cubin_path=built.cubin_path,
            source=lowered.source,
            out_dir=out_dir,
            name=lowered.name,
        )


def cuda_kernel(lowered):
    """The runtime library's entry as a :class:`~.runtime.CudaKernel` (torch CUDA tensors in the tile
    program's parameter order); needs the ``runtime`` artifact."""
    from .runtime import CudaKernel

    if "runtime" not in lowered.artifacts:
        raise TesseraError(f"{lowered.name!r} has no CUDA runtime library: compile for a CUDA config with nvcc on PATH")
    if lowered._cuda_kernel is None:
        lowered._cuda_kernel = CudaKernel(lowered.artifacts["runtime"], lowered.name, lowered._program_order)
    return lowered._cuda_kernel


def check_registers(kernel_name: str, registers: int, config, threads_per_block: int | None = None) -> None:
    """Check ptxas's register count of a kernel (per thread, and per block when threads are given)
    against ``config``'s (a TargetConfig's) resource limits."""
    limits = config.resource_limits
    if "registers_per_thread" in limits and registers > limits["registers_per_thread"]:
        raise ResourceError(
            kernel_name, "registers per thread", registers, limits["registers_per_thread"], config.name, _REGISTER_HINT
        )
    if isinstance(threads_per_block, int) and "registers_per_block" in limits:  # not when symbolic
        per_block = registers * threads_per_block
        if per_block > limits["registers_per_block"]:
            raise ResourceError(
                kernel_name,
                "registers per block",
                per_block,
                limits["registers_per_block"],
                config.name,
                _REGISTER_HINT,
            )


def run(lowered, arrays: tuple, named: dict) -> None:
    """Call the runtime library on torch CUDA tensors (program order, or by buffer name)."""
    return cuda_kernel(lowered)(*lowered._ordered(lowered._program_order, arrays, named))
