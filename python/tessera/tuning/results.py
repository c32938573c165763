"""The result types of a search: :class:`Candidate` (one point of the space and what became of it),
:class:`KernelTuning` (the search for one fused kernel: its candidates, the best one, the spread) and
:class:`AutotuneResult` (what :func:`~tessera.tuning.autotune` returns, one :class:`KernelTuning` per
fused kernel), with the tables and summary lines they print and the dicts the tuning cache stores.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..schedule import Schedule, TuningSummary, _ms

#: The statuses a candidate ends in.
STATUSES = {
    "measured": "compiled and timed",
    "pruned": "rejected by the resource model; not compiled",
    "same": "the same schedule as an earlier candidate; measured once",
    "skipped": "left out by max_candidates",
    "failed": "failed to compile or run, or disagreed with the default schedule's result",
    "planned": "passes the resource model (measure=False: not compiled)",
}


@dataclass(frozen=True)
class Candidate:
    """One point of the search space for one fused kernel, and what became of it."""

    index: int
    fields: tuple[tuple[str, int], ...]  # the space's values (empty: the config's default schedule)
    status: str  # a key of STATUSES
    reason: str = ""  # why pruned/failed/same/skipped
    schedule: Schedule | None = None  # None when pruned
    seconds: float | None = None  # seconds per call, its fastest timed sample (measured candidates)
    compile_seconds: float | None = None

    @property
    def default(self) -> bool:
        """The config's default schedule (candidate #0, the reference every result is checked against)."""
        return self.index == 0

    @property
    def overrides(self) -> dict[str, int]:
        return dict(self.fields)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "fields": [list(f) for f in self.fields],
            "status": self.status,
            "reason": self.reason,
            "schedule": self.schedule.as_dict() if self.schedule is not None else None,
            "seconds": self.seconds,
            "compile_seconds": self.compile_seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        schedule = Schedule.from_json(data["schedule"]) if data["schedule"] is not None else None
        fields = tuple((str(k), int(v)) for k, v in data["fields"])
        return cls(
            data["index"], fields, data["status"], data["reason"], schedule, data["seconds"], data["compile_seconds"]
        )


@dataclass
class KernelTuning:
    """The search for one fused kernel: its candidates, the best one and the spread."""

    kernel: str  # the fused kernel's name
    family: str
    space: tuple[str, ...]  # the fields searched, in column order
    candidates: list[Candidate]
    best_index: int | None = None
    summary: TuningSummary | None = None  # None with measure=False
    key: str = ""  # of the tuning cache

    @property
    def best(self) -> Schedule | None:
        """The chosen schedule, with its ``sched.autotune`` summary."""
        if self.best_index is None:
            return None
        return dataclasses.replace(self.candidates[self.best_index].schedule, autotune=self.summary)

    @property
    def default(self) -> Candidate:
        return self.candidates[0]

    @property
    def overrides(self) -> dict[str, int]:
        """The schedule fields that select the best candidate (empty: the config's default won)."""
        return self.candidates[self.best_index].overrides if self.best_index is not None else {}

    @property
    def cached(self) -> bool:
        return self.summary is not None and self.summary.cached

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.candidates)

    def table(self) -> str:
        """One row per candidate: its fields, status, time and note."""
        columns = list(self.space)
        rows = [["#", *columns, "status", "time", "note"]]
        for c in self.candidates:
            values = dict(c.fields)
            if c.schedule is not None:
                values = {k: _field(c.schedule, k) for k in columns}
            note = "default" if c.default else ""
            if c.index == self.best_index:
                note = "best" + (" (default)" if c.default else "")
            if c.reason:
                note = f"{note}; {c.reason}" if note else c.reason
            time_text = _ms(c.seconds) if c.seconds is not None else ""
            rows.append([str(c.index), *(str(values.get(k, "")) for k in columns), c.status, time_text, note])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
        return f"{self.kernel} ({self.family})\n" + "\n".join("  " + line.rstrip() for line in lines) + "\n"

    def summary_line(self) -> str:
        counts = ", ".join(f"{self.count(s)} {s}" for s in STATUSES if self.count(s))
        if self.summary is None:
            return f"{self.kernel}: {counts} (not measured)"
        best = self.candidates[self.best_index]
        fields = " ".join(f"{k}={_field(best.schedule, k)}" for k in self.space)
        return f"{self.kernel}: {fields} ({'the default' if best.default else f'#{best.index}'}); {self.summary.text()}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "family": self.family,
            "space": list(self.space),
            "candidates": [c.as_dict() for c in self.candidates],
            "best_index": self.best_index,
            "summary": self.summary.as_dict() if self.summary is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], key: str = "") -> KernelTuning:
        summary = TuningSummary(**data["summary"]) if data["summary"] is not None else None
        return cls(
            data["kernel"],
            data["family"],
            tuple(data["space"]),
            [Candidate.from_dict(c) for c in data["candidates"]],
            data["best_index"],
            summary,
            key,
        )


@dataclass
class AutotuneResult:
    """What :func:`autotune` returns: one :class:`KernelTuning` per fused kernel."""

    kernel: str
    target: str
    shapes: dict[str, int]
    kernels: list[KernelTuning]
    seconds: float = 0.0  # wall time of this call
    compile_seconds: float = 0.0  # wall time of the parallel compiles
    measure_seconds: float = 0.0
    workers: int = 0

    @property
    def best(self) -> dict[str, Schedule]:
        """The chosen schedule of every fused kernel (each shows ``sched.autotune``)."""
        return {t.kernel: t.best for t in self.kernels if t.best is not None}

    @property
    def schedule(self) -> dict[str, dict[str, int]]:
        """Overrides that select the chosen schedules: ``ts.compile(..., schedule=result.schedule)``."""
        return {t.kernel: t.overrides for t in self.kernels if t.overrides}

    @property
    def cached(self) -> bool:
        """Whether every fused kernel came from the tuning cache (nothing compiled or measured)."""
        return all(t.cached for t in self.kernels)

    def table(self) -> str:
        return "\n".join(t.table() for t in self.kernels)

    def summary(self) -> str:
        bound = ", ".join(f"{k}={v}" for k, v in self.shapes.items())
        head = f"autotune {self.kernel} on {self.target} ({bound}): {len(self.kernels)} fused kernel(s)"
        if self.cached:
            head += ", from the tuning cache"
        else:
            head += (
                f" in {self.seconds:.1f} s (compile {self.compile_seconds:.1f} s in {self.workers} worker(s), "
                f"measure {self.measure_seconds:.1f} s)"
            )
        return head + "\n" + "\n".join("  " + t.summary_line() for t in self.kernels) + "\n"

    def __str__(self) -> str:
        return self.table() + "\n" + self.summary()

    def to_json(self) -> str:
        return json.dumps(
            {
                "kernel": self.kernel,
                "target": self.target,
                "shapes": self.shapes,
                "seconds": self.seconds,
                "kernels": [t.as_dict() for t in self.kernels],
                "schedule": self.schedule,
            },
            indent=2,
        )


def _field(schedule: Schedule, name: str) -> int:
    return getattr(schedule, "swizzle" if name == "rasterize" else name)
