"""Tenstorrent architecture table: the facts passes and the emulator read, never constants in code.

Sources (see ``API.md`` next to this file for the evidence trail):

* worker grids, L1 size per worker and DRAM bank counts come from tt-metal's SoC descriptors
  (``tt_metal/soc_descriptors/wormhole_b0_80_arch.yaml`` lists 12 DRAM banks and
  ``worker_l1_size: 1499136``; ``blackhole_140_arch.yaml`` lists 8 DRAM banks, a 14x10 functional
  worker grid and the same ``worker_l1_size``);
* the n150 worker grid is 8x8 (the board's harvested 8x9 Tensix grid minus one row for dispatch);
* 32 circular-buffer ids per core (``NUM_CIRCULAR_BUFFERS``), DST = 16 tiles of 32x32
  (``reg_api.h``: "an array of 16 tiles"); with ``fp32_dest_acc_en`` the same register holds 8.

``l1_bytes`` is the physical SRAM per worker; ``l1_budget_bytes`` is what tt-metal's allocator
hands out (``worker_l1_size``) and is the number resource checks compare against.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TTArch", "ARCHS", "ALIASES", "get_arch", "arch_names"]

TILE_HEIGHT = 32
TILE_WIDTH = 32


@dataclass(frozen=True)
class TTArch:
    """One Tenstorrent chip/board configuration as seen by a single-device tt-metal program."""

    name: str  # canonical name used in plans and configs ("wormhole_b0", "blackhole")
    board: str  # the board this row describes ("n150", "p150")
    metal_arch: str  # tt-metal's ARCH_NAME ("wormhole_b0", "blackhole")
    worker_grid_x: int  # logical worker columns usable by programs
    worker_grid_y: int  # logical worker rows usable by programs
    l1_bytes: int  # physical L1 SRAM per worker core
    l1_budget_bytes: int  # L1 bytes per worker tt-metal's allocator manages (worker_l1_size)
    l1_alignment: int  # byte alignment of L1 allocations (circular buffers)
    dram_banks: int  # interleaved DRAM banks (pages round-robin over these)
    dram_alignment: int  # byte alignment of DRAM pages
    dram_bank_bytes: int  # bytes per DRAM bank
    num_cbs: int  # circular-buffer ids per core (0 .. num_cbs-1)
    dst_tiles_bf16: int  # DST capacity in 32x32 tiles, 16-bit accumulation
    dst_tiles_fp32: int  # DST capacity in 32x32 tiles with fp32_dest_acc_en
    max_runtime_args: int  # unique + common runtime args per kernel per core
    tile_height: int = TILE_HEIGHT
    tile_width: int = TILE_WIDTH

    @property
    def num_workers(self) -> int:
        return self.worker_grid_x * self.worker_grid_y

    @property
    def worker_grid(self) -> tuple[int, int]:
        """(x, y): columns, rows — the order tt-metal's ``CoreCoord`` uses."""
        return (self.worker_grid_x, self.worker_grid_y)

    def dst_tiles(self, fp32_dest_acc_en: bool = False) -> int:
        return self.dst_tiles_fp32 if fp32_dest_acc_en else self.dst_tiles_bf16

    def contains_core(self, x: int, y: int) -> bool:
        return 0 <= x < self.worker_grid_x and 0 <= y < self.worker_grid_y


WORMHOLE_N150 = TTArch(
    name="wormhole_b0",
    board="n150",
    metal_arch="wormhole_b0",
    worker_grid_x=8,
    worker_grid_y=8,
    l1_bytes=1_499_136,
    l1_budget_bytes=1_499_136,
    l1_alignment=16,
    dram_banks=12,
    dram_alignment=32,
    dram_bank_bytes=1 << 30,
    num_cbs=32,
    dst_tiles_bf16=16,
    dst_tiles_fp32=8,
    max_runtime_args=341,
)

BLACKHOLE_P150 = TTArch(
    name="blackhole",
    board="p150",
    metal_arch="blackhole",
    worker_grid_x=14,
    worker_grid_y=10,
    l1_bytes=1_572_864,  # 1.5 MiB
    l1_budget_bytes=1_499_136,
    l1_alignment=16,
    dram_banks=8,
    dram_alignment=64,
    dram_bank_bytes=4_278_190_080,
    num_cbs=32,
    dst_tiles_bf16=16,
    dst_tiles_fp32=8,
    max_runtime_args=341,
)

ARCHS: dict[str, TTArch] = {a.name: a for a in (WORMHOLE_N150, BLACKHOLE_P150)}

# Other spellings users (and tt-metal) use for the same rows.
ALIASES: dict[str, str] = {
    "wormhole": "wormhole_b0",
    "wormhole_n150": "wormhole_b0",
    "n150": "wormhole_b0",
    "blackhole_p150": "blackhole",
    "p150": "blackhole",
}


def arch_names() -> list[str]:
    return sorted(ARCHS)


def get_arch(name: str | TTArch) -> TTArch:
    """Return the arch row for ``name`` (case-insensitive; aliases accepted).

    Raises ``KeyError`` naming the known architectures when ``name`` is not one of them.
    """
    if isinstance(name, TTArch):
        return name
    if not isinstance(name, str):
        raise TypeError(f"Tenstorrent arch name must be a string, got {type(name).__name__}")
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    try:
        return ARCHS[key]
    except KeyError:
        known = ", ".join(arch_names())
        aliases = ", ".join(sorted(ALIASES))
        raise UnknownArchError(f"unknown Tenstorrent arch {name!r}; known: {known} (aliases: {aliases})") from None


class UnknownArchError(KeyError, ValueError):
    """``get_arch`` was given a name that is neither an arch nor an alias."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return self.args[0]
