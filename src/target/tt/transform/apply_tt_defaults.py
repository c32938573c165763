"""tt.ApplyTTDefaults: resolve the Tenstorrent arch and defaults once, onto every PrimFunc.

Runs first, before the shared LowerAndLegalize passes. The arch named by the config's ``tt.arch``
is looked up in the arch table (``tessera_tvm.target.tt.arch``), and the limits the later passes
check come from the config's resources (which default to that row), so no pass holds a constant:

    tt.arch            {name, board, grid: [x, y], l1_bytes, num_cbs, dst_tiles, dram_banks, tile_shape}
    tt.compute_config  {math_fidelity, fp32_dest_acc_en, math_approx_mode}

``fp32_dest_acc_en: auto`` (the default) turns fp32 DST accumulation on for a function that holds
float32 anywhere (a float32 accumulator, float32 buffers): without it DST holds 16-bit values, and
a GEMM's K loop or a row reduction would accumulate in bf16. Its ``dst_tiles`` is then the arch's
fp32 capacity (half the 16-bit one).
    tt.defaults        {schedule_policy: "contiguous", schedule_order: "row_major", memory: "dram_interleaved"}

An attr the function already has is kept: a frontend (or a test) may set its own, which is what
makes these *defaults*.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, register_pass
from tessera_tvm.target.tt import TILE_HEIGHT, TILE_WIDTH
from tessera_tvm.target.tt.arch import get_arch

from . import common


def holds_float32(func) -> bool:
    """Whether ``func`` has a float32 buffer (a parameter, an accumulator, any tile buffer)."""
    found = [str(buf.dtype) == "float32" for buf in func.buffer_map.values()]

    def visit(node):
        if isinstance(node, tvm.tirx.BufferStore | tvm.tirx.BufferLoad):
            found.append(str(node.buffer.dtype) == "float32")
        elif isinstance(node, tvm.tirx.SBlock):
            found.extend(str(b.dtype) == "float32" for b in node.alloc_buffers)

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return any(found)


def arch_attr(options: dict, resources: dict) -> dict:
    arch = get_arch(options["arch"])
    return {
        "name": arch.name,
        "board": arch.board,
        "grid": [arch.worker_grid_x, arch.worker_grid_y],
        "l1_bytes": resources["l1_bytes_per_core"],
        "num_cbs": resources["circular_buffers_per_core"],
        "dst_tiles": resources["dst_tiles"],
        "dram_banks": arch.dram_banks,
        "tile_shape": [TILE_HEIGHT, TILE_WIDTH],
    }


DEFAULTS = {"schedule_policy": "contiguous", "schedule_order": "row_major", "memory": "dram_interleaved"}


@register_pass("tt.ApplyTTDefaults", doc="attach the Tenstorrent arch, compute config and schedule/layout defaults")
def apply_tt_defaults(ctx: BuildContext):
    options = common.tt_options(ctx)
    arch = get_arch(options["arch"])

    def apply(_name, func):
        fp32 = options["fp32_dest_acc_en"]
        if fp32 == "auto":
            fp32 = holds_float32(func)
        limits = arch_attr(options, ctx.config.resource_limits)
        limits["dst_tiles"] = min(limits["dst_tiles"], arch.dst_tiles(fp32))
        values = {
            common.ARCH: limits,
            common.COMPUTE_CONFIG: {
                "math_fidelity": options["math_fidelity"],
                "fp32_dest_acc_en": bool(fp32),
                "math_approx_mode": options["math_approx_mode"],
            },
            common.DEFAULTS: dict(DEFAULTS),
        }
        for key, value in values.items():
            if func.attrs is None or key not in func.attrs:
                func = func.with_attr(key, value)
        return func

    return common.module_pass(apply, name="tt.ApplyTTDefaults")
