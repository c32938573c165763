"""tessera.AnnotateKernelMetadata: attach the Kernel Metadata (seed 004, section 11.2) to each kernel.

Runs at the end of OptimizeForTarget, after the host/device split, and sets on every device kernel
the func attr ``tessera.metadata``:

    name       the kernel's symbol
    tile       {M, N, K, stages}          from the tile program (``tessera.tile_info``)
    fragments  {dtype_in, dtype_acc}      from the tile program
    resources  {smem_per_cta, threads_per_block, local_bytes}   measured on the kernel
    launch     {grid: [x, y, z], block: [x, y, z], smem_bytes}  how the kernel is launched
    epilogue   [bias, gelu, relu, cast, ...]                     from the tile program

A count over the program's symbolic dims is its expression as text (``"(N + 127) // 128"``,
``analysis.Extent``), resolved when the kernel is called. ``kernel_metadata`` adds ``unchecked``:
the resource amounts ``tessera.VerifyResources`` could not check because they are symbolic.

The tile program's fields come from the ``tessera.tile_info`` attr that ``tessera.RecordTileInfo``
left on the host function launching the kernel; without it they are empty. ``smem_per_cta`` is
all the shared memory of a block (dynamic + static, e.g. mbarrier words); ``launch.smem_bytes`` is
the dynamic part the launcher must request. A CPU kernel is one call that loops over its tiles, so
its launch is ``[1, 1, 1]`` x ``[1, 1, 1]`` and its tiles live in ``local_bytes`` of stack arrays.
Registers are known only after ptxas; the codegen step adds them.

The attr does not change generated source (CUDA, HIP and C codegens do not print func attrs).
``kernel_metadata(mod)`` reads the attrs back as plain, JSON-serialisable dicts, keys in the seed's
order; ``metadata_json`` (tessera_tvm.target.metadata) writes them as metadata.json.
"""

from __future__ import annotations

from typing import Any

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, register_pass, tessera_module_pass
from tessera_tvm.target.metadata import metadata_json  # noqa: F401  (re-exported)

from . import analysis
from .record_tile_info import ATTR as TILE_INFO_ATTR

UNCHECKED_ATTR = "tessera.unchecked_resources"  # set by tessera.VerifyResources

ATTR = "tessera.metadata"
KEYS = ("name", "tile", "fragments", "resources", "launch", "epilogue")


def to_python(value: Any) -> Any:
    """A TVM attr value (Map, Array, IntImm, String, ...) as plain Python."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, tvm.tirx.IntImm):
        return int(value)
    if isinstance(value, tvm.tirx.FloatImm):
        return float(value)
    if hasattr(value, "items"):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or hasattr(value, "__len__"):
        return [to_python(v) for v in value]
    return str(value)


def tile_info_of(mod, gv) -> dict:
    """The ``tessera.tile_info`` of the tile program kernel ``gv`` came from ({} without it)."""
    host = analysis.launching_function(mod, gv)
    if host is None or not host[1].attrs or TILE_INFO_ATTR not in host[1].attrs:
        return {}
    return to_python(host[1].attrs[TILE_INFO_ATTR])


def kernel_metadata_of(mod, gv) -> dict:
    """The metadata of one device kernel of ``mod`` (plain Python, keys in the seed's order)."""
    func = mod[gv]
    info = tile_info_of(mod, gv)
    grid, block = analysis.kernel_launch(func)
    tile = dict(info.get("tile", {}))
    if "stages" in info:
        tile["stages"] = info["stages"]
    return {
        "name": analysis.kernel_name(gv, func),
        "tile": tile,
        "fragments": {key: info[key] for key in ("dtype_in", "dtype_acc") if key in info},
        "resources": {
            "smem_per_cta": analysis.shared_memory_bytes(func),
            "threads_per_block": analysis.threads_per_block(func),
            "local_bytes": analysis.local_memory_bytes(func),
        },
        "launch": {
            "grid": list(grid),
            "block": list(block),
            "smem_bytes": analysis.dynamic_shared_memory_bytes(func),
        },
        "epilogue": list(info.get("epilogue", [])),
    }


def kernel_metadata(mod) -> list[dict]:
    """The ``tessera.metadata`` of every device kernel of ``mod``, as plain Python dicts."""
    found = []
    for _, func in analysis.device_kernels(mod):
        if func.attrs and ATTR in func.attrs:
            metadata = to_python(func.attrs[ATTR])
            entry = {key: metadata[key] for key in KEYS if key in metadata}
            if UNCHECKED_ATTR in func.attrs:  # amounts over symbolic dims (tessera.VerifyResources)
                entry["unchecked"] = to_python(func.attrs[UNCHECKED_ATTR])
            found.append(entry)
    return found


@register_pass(
    "tessera.AnnotateKernelMetadata",
    doc="attach tile, fragment, resource, launch and epilogue metadata to each device kernel",
)
def annotate_kernel_metadata(ctx: BuildContext):
    def annotate(mod, _pass_ctx):
        out = mod.clone()  # the caller's module must not change under it
        for gv, func in analysis.device_kernels(mod):
            out[gv] = func.with_attr(ATTR, kernel_metadata_of(mod, gv))
        return out

    return tessera_module_pass(annotate, name="tessera.AnnotateKernelMetadata")
