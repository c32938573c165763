"""What a pipeline run records: one :class:`PassRecord` per pass, the IR after each pass when
dumping, the first failure, and the status a running pass reports (:func:`report_status`).

The driver (``tessera_tvm.pipeline``) fills a :class:`PassRecorder` while it runs a phase; the passes
themselves (graph, TIR) only call :func:`report_status`, so they need nothing above this module.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class PassRecord:
    index: int
    phase: str
    name: str
    seconds: float
    status: str = "ran"  # "ran" or "skipped (ir.<predicate> is false)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "phase": self.phase,
            "name": self.name,
            "seconds": round(self.seconds, 6),
            "status": self.status,
        }


@dataclass
class PassRecorder:
    """Collects what the pipeline did; one per lowering."""

    dump_dir: Path | None = None
    records: list[PassRecord] = field(default_factory=list)
    error: BaseException | None = None
    failed: tuple[str, str, Any] | None = None  # (pass, phase, the IR it received) of the first failure
    metadata: list[dict[str, Any]] | None = None  # the kernel metadata, once the codegen made it

    def dump(self, name: str, mod) -> None:
        if self.dump_dir is None:
            return
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        index = len(self.records)
        (self.dump_dir / f"{index:03d}_{name}.py").write_text(mod.script())

    def timing_table(self) -> str:
        width = max([len(r.name) for r in self.records] + [4])
        lines = [f"{'#':>3}  {'phase':<19} {'pass':<{width}} {'ms':>9}  status"]
        for r in self.records:
            lines.append(f"{r.index:>3}  {r.phase:<19} {r.name:<{width}} {r.seconds * 1e3:>9.3f}  {r.status}")
        total = sum(r.seconds for r in self.records)
        lines.append(f"{'':>3}  {'total':<19} {'':<{width}} {total * 1e3:>9.3f}")
        return "\n".join(lines) + "\n"


_RECORDER: contextvars.ContextVar[PassRecorder | None] = contextvars.ContextVar("tessera_recorder", default=None)
_STATUS: contextvars.ContextVar[str | None] = contextvars.ContextVar("tessera_pass_status", default=None)


def report_status(detail: str) -> None:
    """Called by a running pass to say what it did (``"4 rewrites"``); the pass log shows
    ``ran (4 rewrites)``."""
    _STATUS.set(detail)


@contextmanager
def recording(recorder: PassRecorder | None = None) -> Iterator[PassRecorder]:
    """Make ``recorder`` (or a new one) receive the records of the passes run inside the block."""
    recorder = recorder or PassRecorder()
    token = _RECORDER.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)
