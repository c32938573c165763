"""What tt.Tensorize's recogniser records per statement: the tiles pushed into CBs (``_Event``), where
a value lives (``_Operand``), each statement's reads, ops and writes (``_Record``), and the refusal of
a statement it cannot map (``_Unsupported``)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Spilled tiles get ids from here until ``finish`` assigns physical CBs.
VIRTUAL = 1000


class _Unsupported(Exception):
    def __init__(self, op: str, reason: str):
        super().__init__(reason)
        self.op = op
        self.reason = reason


# ---------------------------------------------------------------------------------------------
# The per-tile analysis
# ---------------------------------------------------------------------------------------------


@dataclass
class _Event:
    """One tile pushed into a CB (a reader push or a spill); its uses decide wait and pop."""

    cb: int
    loops: tuple
    uses: list = field(default_factory=list)


@dataclass
class _Operand:
    kind: str  # "cb", "dst" or "const" (a filled tile not yet materialised: a constant CB when read)
    event: _Event | None = None
    bcast: str = "none"
    const_cb: int | None = None
    slot: int = 0  # the DST tile of a value in DST (a GEMM sub-block keeps one accumulator per tile)

    @property
    def cb(self) -> int:
        return self.event.cb if self.event is not None else self.const_cb

    def as_bcast(self, bcast: str) -> _Operand:
        return _Operand(self.kind, self.event, bcast, self.const_cb, self.slot)


@dataclass
class _Record:
    tile_op: str
    loops: tuple = ()
    reads: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    writes: list = field(default_factory=list)
    unsupported: tuple[str, str] | None = None


def _mode_key(mode: dict) -> tuple:
    """FPU modes differ by kind/fn/broadcast/transpose/reduce type (CB ids of one format need no re-init)."""
    return (mode["kind"], mode.get("fn"), mode.get("bcast"), mode.get("transpose"), mode.get("type"))
