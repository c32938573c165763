"""Per-call metrics of compiled kernels (issue #18, part 2).

    TESSERA_METRICS=calls.jsonl python my_script.py   # or calls.csv; the whole process
    with tessera.metrics("calls.jsonl"): ...            # one block
    tessera metrics calls.jsonl [--prometheus out.prom] # p50/p95/max per kernel

Each call of a compiled kernel appends one row as it finishes (so a crashed process keeps the rows
before the crash): ``time`` (Unix seconds at the end of the call), ``kernel``, ``target``,
``shapes``, ``seconds`` (wall time of the call), ``flops`` and ``bytes`` (the work of its device
kernels, computed at compile time and kept in ``metadata.json``), ``tflops`` and ``gbps`` (from
those over ``seconds``; ``tflops`` is null for kernels without a FLOP count) and ``grids`` (each
device kernel's launch grid). When no metrics file is active the call path reads one module global.

Metrics never break the program they watch: ``TESSERA_METRICS`` naming a file that cannot be opened
warns once (:class:`~tessera_tvm.errors.TesseraWarning`) and leaves metrics off; a row that cannot be
written (a full disk) warns once and stops the recording. Rows are appended only to a regular file:
a symbolic link, a device or a FIFO at the path is refused (``metrics(path)`` raises
:class:`~tessera_tvm.errors.OutputFileError` naming the file; the variable warns).
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import io
import json
import math
import os
import stat
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .errors import OutputFileError
from .output_files import file_kind, refuse_special, warn

#: The columns of a row, in the CSV's order.
COLUMNS = ("time", "kernel", "target", "shapes", "seconds", "flops", "bytes", "tflops", "gbps", "grids")


class MetricsFile:
    """Rows appended to one JSONL or CSV file (by its suffix), one line per call.

    Opening raises :class:`OutputFileError` naming the file when it cannot be appended to; a row
    that cannot be written later warns once and stops the recording (the kernel call goes on)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.suffix not in (".jsonl", ".csv"):
            raise ValueError(f"metrics file {self.path}: expected a .jsonl or .csv path")
        self._lock = threading.Lock()
        self.failed = False
        refuse_special(self.path, "metrics file")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW and the fstat below: a link or a FIFO put there meanwhile is refused, not
            # followed or waited on (O_NONBLOCK).
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(self.path, flags, 0o666)
        except OSError as exc:
            raise OutputFileError(
                f"metrics file {self.path}: cannot open it to append rows: {exc.strerror or exc}"
            ) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise OutputFileError(
                f"metrics file {self.path}: found a {file_kind(info.st_mode)}, expected a regular file"
            )
        self._file = os.fdopen(fd, "a", buffering=1)  # line-buffered: each row is on disk when written
        if self.path.suffix == ".csv" and info.st_size == 0:
            self._write(",".join(COLUMNS) + "\n")

    def _write(self, line: str) -> None:
        if self.failed:
            return
        try:
            self._file.write(line)
        except OSError as exc:  # a full disk, a file system gone read-only: stop, never fail the call
            self.failed = True
            warn(
                f"metrics file {self.path}: cannot write a row ({exc.strerror or exc}); no more rows are recorded there"
            )

    def record(self, row: dict[str, Any]) -> None:
        if self.path.suffix == ".jsonl":
            line = json.dumps({c: row.get(c) for c in COLUMNS}) + "\n"
        else:
            buffer = io.StringIO()
            values = [json.dumps(row.get(c)) if c in ("shapes", "grids") else row.get(c) for c in COLUMNS]
            csv.writer(buffer, lineterminator="\n").writerow(["" if v is None else v for v in values])
            line = buffer.getvalue()
        with self._lock:
            self._write(line)

    def close(self) -> None:
        with self._lock:
            try:
                self._file.close()
            except OSError:  # the last buffered bytes could not be written: said by _write already
                pass


_ACTIVE: MetricsFile | None = None


def active() -> MetricsFile | None:
    """The file calls are recorded to, or None when metrics are off."""
    return _ACTIVE


@contextlib.contextmanager
def metrics(path: str | os.PathLike[str]) -> Iterator[MetricsFile]:
    """Record every kernel call inside the block to ``path`` (.jsonl or .csv)."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, MetricsFile(path)
    recorder = _ACTIVE
    try:
        yield recorder
    finally:
        _ACTIVE = previous
        recorder.close()


def call_row(kernel: str, target: str, shapes: dict[str, int], seconds: float, flops: int, nbytes: int, grids):
    """One row of a call: the rates from the work and the wall time."""
    return {
        "kernel": kernel,
        "target": target,
        "shapes": dict(shapes),
        "seconds": seconds,
        "flops": flops,
        "bytes": nbytes,
        "tflops": flops / seconds / 1e12 if flops and seconds > 0 else None,
        "gbps": nbytes / seconds / 1e9 if seconds > 0 else None,
        "grids": [list(g) for g in grids],
    }


# ---------------------------------------------------------------------------------------------
# Reading and summarising
# ---------------------------------------------------------------------------------------------


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a metrics file (JSONL or CSV); raises ValueError naming the line that is not one."""
    path = Path(path)
    text = path.read_text()
    rows: list[dict[str, Any]] = []
    if path.suffix == ".csv":
        for number, record in enumerate(csv.DictReader(io.StringIO(text)), start=2):
            try:
                rows.append({"kernel": record["kernel"], "seconds": float(record["seconds"]),
                             "tflops": float(record["tflops"]) if record.get("tflops") else None,
                             "gbps": float(record["gbps"]) if record.get("gbps") else None})  # fmt: skip
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{path}:{number}: not a metrics row: {record}") from None
        return rows
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            float(row["seconds"]), str(row["kernel"])
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{path}:{number}: not a metrics row: {line[:200]}") from None
        rows.append(row)
    return rows


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between the closest ranks (numpy's
    default method)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kernel: calls, p50/p95/max seconds, and the median TFLOP/s and GB/s (None when unknown)."""
    by_kernel: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_kernel.setdefault(str(row["kernel"]), []).append(row)
    out = {}
    for kernel, calls in sorted(by_kernel.items()):
        seconds = [float(c["seconds"]) for c in calls]
        rates = {k: [float(c[k]) for c in calls if c.get(k) is not None] for k in ("tflops", "gbps")}
        out[kernel] = {
            "calls": len(calls),
            "p50_seconds": percentile(seconds, 50),
            "p95_seconds": percentile(seconds, 95),
            "max_seconds": max(seconds),
            "sum_seconds": sum(seconds),
            "p50_tflops": percentile(rates["tflops"], 50) if rates["tflops"] else None,
            "p50_gbps": percentile(rates["gbps"], 50) if rates["gbps"] else None,
        }
    return out


def summary_table(summary: dict[str, dict[str, Any]]) -> str:
    width = max([len(k) for k in summary] + [6])
    lines = [
        f"{'kernel':<{width}} {'calls':>6} {'p50 ms':>10} {'p95 ms':>10} {'max ms':>10} {'TFLOP/s':>8} {'GB/s':>8}"
    ]
    for kernel, s in summary.items():
        tflops = f"{s['p50_tflops']:.3f}" if s["p50_tflops"] is not None else "-"
        gbps = f"{s['p50_gbps']:.1f}" if s["p50_gbps"] is not None else "-"
        lines.append(
            f"{kernel:<{width}} {s['calls']:>6} {s['p50_seconds'] * 1e3:>10.3f} {s['p95_seconds'] * 1e3:>10.3f} "
            f"{s['max_seconds'] * 1e3:>10.3f} {tflops:>8} {gbps:>8}"
        )
    return "\n".join(lines) + "\n"


def prometheus_text(summary: dict[str, dict[str, Any]]) -> str:
    """The summary in Prometheus' text exposition format (a summary metric per kernel)."""
    lines = [
        "# HELP tessera_kernel_call_seconds Wall time of Tessera kernel calls.",
        "# TYPE tessera_kernel_call_seconds summary",
    ]
    for kernel, s in summary.items():
        label = kernel.replace("\\", "\\\\").replace('"', '\\"')
        for quantile, key in (("0.5", "p50_seconds"), ("0.95", "p95_seconds"), ("1", "max_seconds")):
            lines.append(f'tessera_kernel_call_seconds{{kernel="{label}",quantile="{quantile}"}} {s[key]!r}')
        lines.append(f'tessera_kernel_call_seconds_sum{{kernel="{label}"}} {s["sum_seconds"]!r}')
        lines.append(f'tessera_kernel_call_seconds_count{{kernel="{label}"}} {s["calls"]}')
    return "\n".join(lines) + "\n"


def _from_environment() -> None:
    """``TESSERA_METRICS=path``: record the whole process; a path that cannot be used warns and
    leaves metrics off (an import never fails because of it)."""
    global _ACTIVE
    path = os.environ.get("TESSERA_METRICS", "").strip()
    if path and _ACTIVE is None:
        try:
            _ACTIVE = MetricsFile(path)
        except (OutputFileError, ValueError) as exc:
            warn(f"TESSERA_METRICS={path}: metrics are off: {exc}")
            return
        atexit.register(_ACTIVE.close)


_from_environment()
