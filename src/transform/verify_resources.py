"""tessera.VerifyResources: fail before codegen when a kernel needs more than the target allows.

Runs at the end of OptimizeForTarget (after ``tessera.AnnotateKernelMetadata``) and checks every
device kernel against the config's ``resources``:

    shared_memory_per_block   shared memory of a block, dynamic + static (analysis.py says what counts)
    threads_per_block         threads in a block, as launched (warp specialisation included)
    local_memory_per_kernel   stack arrays of a CPU kernel

A limit the config does not declare is not checked. Registers are known only from ptxas's report
after nvcc, so the codegen step calls ``check_registers`` with them. Every failure is a
``ResourceError`` naming the kernel, the resource, the amount, the limit, the config and a fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tessera_tvm.config import TargetConfig
from tessera_tvm.errors import ResourceError
from tessera_tvm.registry import BuildContext, register_pass, tessera_module_pass

from . import analysis


@dataclass(frozen=True)
class _Check:
    limit_key: str  # key in the config's `resources`
    resource: str  # what the error message calls it
    measure: Callable[[object], int]
    hint: str


_CHECKS = (
    _Check(
        "shared_memory_per_block",
        "bytes of shared memory per block",
        analysis.shared_memory_bytes,
        "reduce block_m/block_n/block_k or stages (each stage holds one A and one B tile)",
    ),
    _Check(
        "threads_per_block",
        "threads per block",
        analysis.threads_per_block,
        "use fewer threads in T.Kernel(..., threads=...) (warp specialisation adds a producer warp group)",
    ),
    _Check(
        "local_memory_per_kernel",
        "bytes of local (stack) memory",
        analysis.local_memory_bytes,
        "reduce block_m/block_n/block_k: the CPU kernel keeps its tiles in stack arrays",
    ),
)

_REGISTER_HINT = "reduce block_m/block_n (the accumulator lives in registers) or use more threads per block"


def verify_kernel(name: str, func, config: TargetConfig) -> None:
    """Raise ``ResourceError`` for the first limit of ``config`` that kernel ``func`` exceeds."""
    limits = config.resource_limits
    for check in _CHECKS:
        if check.limit_key in limits:
            amount = check.measure(func)
            limit = limits[check.limit_key]
            if amount > limit:
                raise ResourceError(name, check.resource, amount, limit, config.name, check.hint)


def check_registers(
    kernel_name: str, registers: int, config: TargetConfig, threads_per_block: int | None = None
) -> None:
    """Check ptxas's register count of a kernel (per thread, and per block when threads are given)."""
    limits = config.resource_limits
    if "registers_per_thread" in limits and registers > limits["registers_per_thread"]:
        raise ResourceError(
            kernel_name, "registers per thread", registers, limits["registers_per_thread"], config.name, _REGISTER_HINT
        )
    if threads_per_block is not None and "registers_per_block" in limits:
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


@register_pass("tessera.VerifyResources", doc="check each device kernel against the config's resource limits")
def verify_resources(ctx: BuildContext):
    def verify(mod, _pass_ctx):
        for gv, func in analysis.device_kernels(mod):
            verify_kernel(analysis.kernel_name(gv, func), func, ctx.config)
        return mod

    return tessera_module_pass(verify, name="tessera.VerifyResources")
