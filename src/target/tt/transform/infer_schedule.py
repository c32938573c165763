"""tt.InferSchedule: which output tiles each worker core computes.

A TileLang kernel launches a grid of blocks (``T.Kernel(nx, ny)``); on Tenstorrent every block is
one 32x32 output tile and the grid is folded onto the arch's worker cores. Blocks are numbered
row-major (``t = by * nx + bx``) and split into contiguous ranges, the first ``total % cores``
cores taking one extra tile, over ``min(total, cores)`` cores (the arch grid, or ``cores`` when the
pass argument limits it). The function gets

    tt.schedule = {policy: "contiguous", order: "row_major", grid: [nx, ny], total_tiles,
                   num_cores, assignments: [[core_id, start_tile, num_tiles], ...]}

Constant grids only: a launch extent that is not a constant, or a third grid axis, is an
``UnsupportedTTOperationError``.
"""

from __future__ import annotations

from tessera_tvm.registry import BuildContext, Param, register_pass

from . import common


def split_contiguous(total: int, num_cores: int) -> list[tuple[int, int]]:
    """``(start, count)`` per core: contiguous ranges, the first ``total % num_cores`` one longer."""
    out, start = [], 0
    for core in range(num_cores):
        count = total // num_cores + (1 if core < total % num_cores else 0)
        out.append((start, count))
        start += count
    return out


def block_grid(name: str, func) -> list[int]:
    """``[nx, ny]``: constant blockIdx.x / blockIdx.y extents of the kernel's launch (1 when absent)."""
    extents = {"blockIdx.x": 1, "blockIdx.y": 1}
    for tag, _var, extent in common.launch_grid(func):
        if extent is None:
            raise common.UnsupportedTTOperationError(
                f"kernel {name!r}: launch extent of {tag} is not a constant; the Tenstorrent target needs "
                "static shapes (give the kernel concrete sizes)"
            )
        if tag == "blockIdx.z" and extent != 1:
            raise common.UnsupportedTTOperationError(
                f"kernel {name!r}: a third grid axis ({tag} = {extent}, e.g. a batch) is not supported on the "
                "Tenstorrent target yet; launch one kernel per batch entry"
            )
        extents[tag] = extent
    return [extents["blockIdx.x"], extents["blockIdx.y"]]


def schedule(grid: list[int], worker_cores: int, policy: str = "contiguous", order: str = "row_major") -> dict:
    total = grid[0] * grid[1]
    num_cores = max(1, min(total, worker_cores))
    ranges = split_contiguous(total, num_cores)
    return {
        "policy": policy,
        "order": order,
        "grid": list(grid),
        "total_tiles": total,
        "num_cores": num_cores,
        "assignments": [[core, start, count] for core, (start, count) in enumerate(ranges)],
    }


@register_pass(
    "tt.InferSchedule",
    params={"cores": Param(int, 0, "use at most this many worker cores (0: the arch's whole grid)")},
    doc="assign the kernel's output tiles to worker cores: contiguous ranges, row-major",
)
def infer_schedule(ctx: BuildContext, cores: int = 0):
    def infer(name, func):
        arch = common.require_attr(func, common.ARCH, name, "tt.ApplyTTDefaults")
        defaults = common.attr(func, common.DEFAULTS, {})
        policy = defaults.get("schedule_policy", "contiguous")
        order = defaults.get("schedule_order", "row_major")
        if (policy, order) != ("contiguous", "row_major"):
            raise common.TTLoweringError(
                f"kernel {name!r}: schedule {policy}/{order} is not implemented; "
                "the Tenstorrent target schedules contiguous/row_major"
            )
        workers = arch["grid"][0] * arch["grid"][1]
        if cores < 0:
            raise common.TTLoweringError(f"tt.InferSchedule: cores must be >= 0, got {cores}")
        if cores:
            workers = min(workers, cores)
        return func.with_attr(common.SCHEDULE, schedule(block_grid(name, func), workers, policy, order))

    return common.module_pass(infer, name="tt.InferSchedule")
