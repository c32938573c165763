"""tt.ShardToCoreMap: place every schedule entry on a worker core of the arch's grid.

Schedule entry ``core_id`` runs on logical worker core ``(core_id % grid_x, core_id // grid_x)``
of the arch's worker grid (``tt.arch.grid``: 8x8 on Wormhole n150, 14x10 on Blackhole p150),
row-major like tt-metal's ``CoreCoord`` walks. The function gets

    tt.core_map = {arch_grid: [gx, gy], grid: [used_x, used_y], cores: [[x, y], ...]}   # by core_id

where ``grid`` is the bounding box of the cores used (the host program's ``CoreRange``).
"""

from __future__ import annotations

from tessera_tvm.registry import BuildContext, register_pass

from . import common


def core_map(num_cores: int, arch_grid: list[int]) -> dict:
    gx, gy = arch_grid
    if num_cores > gx * gy:
        raise common.TTLoweringError(f"{num_cores} cores scheduled but the arch's worker grid is {gx}x{gy}")
    cores = [[core % gx, core // gx] for core in range(num_cores)]
    used = [min(num_cores, gx), -(-num_cores // gx)]
    return {"arch_grid": [gx, gy], "grid": used, "cores": cores}


@register_pass("tt.ShardToCoreMap", doc="map schedule entries to worker core coordinates from the arch table")
def shard_to_core_map(ctx: BuildContext):
    def place(name, func):
        arch = common.require_attr(func, common.ARCH, name, "tt.ApplyTTDefaults")
        sched = common.require_attr(func, common.SCHEDULE, name, "tt.InferSchedule")
        return func.with_attr(common.CORE_MAP, core_map(sched["num_cores"], arch["grid"]))

    return common.module_pass(place, name="tt.ShardToCoreMap")
