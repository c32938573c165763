"""tessera.VerifyResources: fail before codegen when a kernel needs more than the target allows.

Runs at the end of OptimizeForTarget (after ``tessera.AnnotateKernelMetadata``) and checks every
device kernel against the config's ``resources``:

    shared_memory_per_block   shared memory of a block, dynamic + static (analysis.py says what counts)
    threads_per_block         threads in a block, as launched (warp specialisation included)
    local_memory_per_kernel   stack arrays of a CPU kernel

A limit the config does not declare is not checked. Registers are known only from ptxas's report
after nvcc, so the codegen step calls ``check_registers`` with them. Every failure is a
``ResourceError`` naming the kernel, the resource, the amount, the limit, the config and a fix.

An amount over the program's symbolic dims (a shared buffer sized by ``N``) cannot be checked
here: the pass records it in the func attr ``tessera.unchecked_resources``, the kernel's metadata
lists it under ``unchecked`` and the lowering's notes say so; ``check_resolved`` checks it when the
kernel is called and the dims are known.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tessera_tvm.config import TargetConfig
from tessera_tvm.errors import ResourceError
from tessera_tvm.registry import BuildContext, register_pass, tessera_module_pass
from tessera_tvm.target.cuda.lowered import check_registers  # noqa: F401  (re-exported)

from . import analysis
from .annotate_kernel_metadata import UNCHECKED_ATTR, tile_info_of


@dataclass(frozen=True)
class _Check:
    limit_key: str  # key in the config's `resources`
    resource: str  # what the error message calls it
    measure: Callable[[object], int | str]
    metadata_key: str  # the amount's key in the kernel metadata's `resources`
    scopes: tuple[str, ...]  # the program's buffers that use this memory, by scope prefix ("" for none)
    hint: str


_CHECKS = (
    _Check(
        "shared_memory_per_block",
        "bytes of shared memory per block",
        analysis.shared_memory_bytes,
        "smem_per_cta",
        ("shared",),
        "use smaller tiles",
    ),
    _Check(
        "threads_per_block",
        "threads per block",
        analysis.threads_per_block,
        "threads_per_block",
        (),
        "use fewer threads in T.Kernel(..., threads=...) (warp specialisation adds a producer warp group)",
    ),
    _Check(
        "local_memory_per_kernel",
        "bytes of local (stack) memory",
        analysis.local_memory_bytes,
        "local_bytes",
        ("local", "shared"),
        "use smaller tiles: the CPU kernel keeps its on-chip buffers in stack arrays",
    ),
)


def _hint(check: _Check, buffers: list[str], stages: int | None) -> str:
    """The check's fix, preceded by the program's buffers that use the memory (from tessera.tile_info)."""
    pipelined = check.limit_key == "shared_memory_per_block" and (stages is None or stages > 1)
    hint = check.hint
    if pipelined:
        hint += ", or fewer T.Pipelined stages (each stage keeps its own copy of the buffers it loads)"
    using = [b for b in buffers if b.startswith(check.scopes)] if check.scopes else []
    if not using:
        return hint
    names = ", ".join(b.split(" ", 1)[1] for b in using)
    over = f", pipelined over {stages} stages" if pipelined and stages else ""
    return f"its buffers: {names}{over}; {hint}"


def verify_kernel(name: str, func, config: TargetConfig, tile_info: dict | None = None) -> list[str]:
    """Raise ``ResourceError`` for the first limit of ``config`` that kernel ``func`` exceeds; its
    hint names the buffers of the tile program (``tile_info``, from tessera.RecordTileInfo) that
    use that memory.

    Returns what could not be checked: each amount that depends on the program's symbolic dims,
    as ``"<limit key> = <expression> (limit <n>)"``; :func:`check_resolved` checks them when called.
    """
    limits = config.resource_limits
    unchecked = []
    for check in _CHECKS:
        if check.limit_key in limits:
            amount = check.measure(func)
            limit = limits[check.limit_key]
            if isinstance(amount, str):
                unchecked.append(f"{check.limit_key} = {amount} (limit {limit})")
            elif amount > limit:
                info = tile_info or {}
                stages = info.get("stages", 1 if info else None)  # None: the program is not known
                hint = _hint(check, list(info.get("buffers", [])), stages)
                raise ResourceError(name, check.resource, amount, limit, config.name, hint)
    return unchecked


def check_resolved(metadata: dict, dims: dict[str, int], config: TargetConfig) -> None:
    """Check a kernel's symbolic resource amounts (its metadata's ``resources``) with ``dims`` bound."""
    limits = config.resource_limits
    for check in _CHECKS:
        amount = metadata["resources"].get(check.metadata_key)
        if isinstance(amount, str) and check.limit_key in limits:
            value = analysis.resolve_extent(amount, dims)
            if value > limits[check.limit_key]:
                hint = f"{amount} with {', '.join(f'{k}={v}' for k, v in sorted(dims.items()))}; {check.hint}"
                raise ResourceError(metadata["name"], check.resource, value, limits[check.limit_key], config.name, hint)


@register_pass("tessera.VerifyResources", doc="check each device kernel against the config's resource limits")
def verify_resources(ctx: BuildContext):
    def verify(mod, _pass_ctx):
        out = mod
        for gv, func in analysis.device_kernels(mod):
            info = tile_info_of(mod, gv)
            unchecked = verify_kernel(analysis.kernel_name(gv, func), func, ctx.config, info)
            if unchecked:  # said in the kernel's metadata and in the lowering's notes
                out = out.clone() if out.same_as(mod) else out
                out[gv] = func.with_attr(UNCHECKED_ATTR, unchecked)
        return out

    return tessera_module_pass(verify, name="tessera.VerifyResources")
