"""``tt.plan.json``: the execution plan of one kernel, from its annotations (``plan.schema.json``).

The plan names the arch, the cores and their output tiles (``tt.schedule`` + ``tt.core_map``),
the DRAM buffers (``tt.shard``, ``tt.padding``), the circular buffers (``tt.circular_buffers``), the
three kernels with their compile-time args, and per-core runtime args in the order the kernels
read them. ``main.cpp`` is printed from the plan, and ``run_plan`` executes it in the emulator.
"""

from __future__ import annotations

from tessera_tvm.target.tt import TILE_HEIGHT, TILE_WIDTH, TT_METAL_VERSION

from .. import ir
from .cexpr import CodegenError
from .kernels import KernelInfo

KERNEL_FILES = {"reader": "reader.cpp", "compute": "compute.cpp", "writer": "writer.cpp"}


def _buffers(info: KernelInfo) -> list[dict]:
    out = []
    for buffer in info.func.buffer_map.values():
        name = buffer.name
        shard = info.shards[name]
        if name in info.reads and name in info.writes:
            raise CodegenError(
                f"kernel {info.name!r}: buffer {name!r} is both read and written; "
                "Tenstorrent kernels read inputs and write separate outputs"
            )
        role = "output" if name in info.writes else "input"
        out.append(
            {
                "name": name,
                "role": role,
                "shape": list(shard["shape"]),
                "dtype": shard["dtype"],
                "layout": "tile",
                "tile_shape": [TILE_HEIGHT, TILE_WIDTH],
                "padded_shape": [shard["tiles"][0] * TILE_HEIGHT, shard["tiles"][1] * TILE_WIDTH],
                "memory": "dram_interleaved",
                "page_size": shard["page_size"],
            }
        )
    return out


def _describe(info: KernelInfo, schedule: dict, arch: dict) -> str:
    ops = []
    for node in _compute_nodes(info):
        if node["tile_op"] not in ("copy_in", "copy_out", "alias", "fill") and node["tile_op"] not in ops:
            ops.append(node["tile_op"])
    inputs = ", ".join(info.reads) or "nothing"
    outputs = ", ".join(info.writes) or "nothing"
    return (
        f"{outputs} from {inputs} ({', '.join(ops) or 'copy'}); {schedule['total_tiles']} output tile(s) on "
        f"{schedule['num_cores']} core(s) of {arch['name']} {arch['board']}; tt-metal {TT_METAL_VERSION}"
    )


def _compute_nodes(info: KernelInfo) -> list[dict]:
    from .kernels import annotations

    return annotations(info.loop.body, ir.COMPUTE)


def build_plan(info: KernelInfo) -> dict:
    func = info.func
    arch = ir.attr(func, ir.ARCH)
    schedule = ir.attr(func, ir.SCHEDULE)
    core_map = ir.attr(func, ir.CORE_MAP)
    config = info.compute_config
    buffers = _buffers(info)
    outputs = [b["name"] for b in buffers if b["role"] == "output"]
    cores = []
    for core_id, start, count in schedule["assignments"]:
        cores.append(
            {
                "core": list(core_map["cores"][core_id]),
                "tiles": [start, count],
                "runtime_args": {
                    "reader": [{"buffer_address": b} for b in info.reads] + [start, count],
                    "compute": [start, count],
                    "writer": [{"buffer_address": b} for b in info.writes] + [start, count],
                },
            }
        )
    plan_schedule = {"policy": schedule["policy"], "order": schedule["order"], "total_tiles": schedule["total_tiles"]}
    if len(outputs) == 1:
        plan_schedule["output"] = outputs[0]
    return {
        "schema_version": 1,
        "tt_metal_version": TT_METAL_VERSION,
        "name": info.name,
        "description": _describe(info, schedule, arch),
        "arch": arch["name"],
        "grid": list(core_map["grid"]),
        "schedule": plan_schedule,
        "buffers": buffers,
        "circular_buffers": [
            {key: cb[key] for key in ("id", "name", "page_size", "num_pages", "data_format")} for cb in info.cbs
        ],
        "kernels": {
            "reader": {
                "source": KERNEL_FILES["reader"],
                "processor": "RISCV_1",
                "noc": "RISCV_1_default",
                "compile_time_args": [{"tensor_accessor": b} for b in info.reads],
            },
            "compute": {
                "source": KERNEL_FILES["compute"],
                "math_fidelity": config.get("math_fidelity", "HiFi4"),
                "fp32_dest_acc_en": bool(config.get("fp32_dest_acc_en", False)),
                "math_approx_mode": bool(config.get("math_approx_mode", False)),
            },
            "writer": {
                "source": KERNEL_FILES["writer"],
                "processor": "RISCV_0",
                "noc": "RISCV_0_default",
                "compile_time_args": [{"tensor_accessor": b} for b in info.writes],
            },
        },
        "cores": cores,
    }
