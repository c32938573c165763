"""Chrome trace-event files of what Tessera did (issue #18, part 1).

    TESSERA_TRACE=trace.json python my_script.py      # the whole process, written at exit
    with tessera.trace("trace.json"): ...              # one block, written when it ends

The file opens in Perfetto (ui.perfetto.dev) and chrome://tracing. Each span is a complete event
("ph": "X") on the thread that ran it, its category one of seed 004's phases (:data:`PHASES`):

- compiles: ``compile <kernel>`` with the stages inside (``graph``, ``sched <k>``, ``tile <k>``,
  ``target <k>``), every pass of the config's pass lists as a span of its own (``args.pass_list``:
  lower_and_legalize, optimize_for_target, ...), and each toolchain call (``g++``, ``nvcc``);
- calls: ``call <kernel>`` with ``check arguments`` and, on the CPU, each device kernel (a GEMM
  under ``mma``, a norm, softmax or reduction under ``reduce``, element-wise under ``copy``). A
  traced call runs its device kernels one by one so that each gets a span.

On a GPU each span is also an NVTX range (through torch's ``torch.cuda.nvtx``), so Nsight Systems
shows the same names. When no trace is active a span costs one module-global read: the call path
checks :func:`active` itself and takes its untraced route.

A trace never breaks the program it watches: ``TESSERA_TRACE`` naming a path that cannot be
written warns (:class:`~tessera_tvm.errors.TesseraWarning`) and the trace is off or lost, while
``tracing(path)`` raises :class:`~tessera_tvm.errors.OutputFileError` naming the file. The file is
written through a temporary file renamed over it, and never over a symbolic link, a device or a
FIFO (refused).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import OutputFileError
from .output_files import check_writable, replace_regular_file, warn

#: The standard phases (seed 004): the category of every span.
PHASES = ("copy", "mma", "reduce", "comm", "host")

#: The phase of a device kernel, by its kernel family.
FAMILY_PHASE = {
    "gemm": "mma",
    "attention": "mma",
    "softmax": "reduce",
    "norm": "reduce",
    "reduce": "reduce",
    "elementwise": "copy",
}


class Trace:
    """The spans of one trace file; :meth:`write` writes them (atomically, as JSON)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._origin = time.perf_counter_ns()
        self._nvtx = _nvtx()

    def add(self, name: str, phase: str, start_ns: int, end_ns: int, args: dict[str, Any]) -> None:
        if phase not in PHASES:
            raise ValueError(f"span {name!r}: phase {phase!r} is not one of {PHASES}")
        event = {
            "name": name,
            "cat": phase,
            "ph": "X",
            "ts": (start_ns - self._origin) / 1e3,  # microseconds
            "dur": (end_ns - start_ns) / 1e3,
            "pid": os.getpid(),
            "tid": threading.get_ident(),
            "args": {k: _plain(v) for k, v in args.items()},
        }
        with self._lock:
            self.events.append(event)

    def write(self) -> Path:
        """Write the file (a temporary file renamed into place: never half-written, never over
        anything but a regular file); raises :class:`OutputFileError` naming it."""
        with self._lock:
            events = sorted(self.events, key=lambda e: (e["ts"], -e["dur"]))
        payload = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"producer": "tessera"}}
        return replace_regular_file(self.path, payload, "trace file")

    def write_or_warn(self) -> None:
        """:meth:`write`, with a warning instead of an error (at exit, or when the traced block raised)."""
        try:
            self.write()
        except OutputFileError as exc:
            warn(f"the trace was not written: {exc}")


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


def _nvtx():
    """torch's NVTX ranges when a CUDA device is in use, else None (no import of torch here)."""
    torch = __import__("sys").modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.nvtx
    except Exception:  # noqa: BLE001 - NVTX is a bonus
        return None
    return None


_ACTIVE: Trace | None = None


def active() -> Trace | None:
    """The trace spans go to, or None when tracing is off."""
    return _ACTIVE


@contextlib.contextmanager
def span(name: str, phase: str = "host", **args: Any) -> Iterator[None]:
    """Record the block as one span (nothing when no trace is active)."""
    trace = _ACTIVE
    if trace is None:
        yield
        return
    nvtx = trace._nvtx
    if nvtx is not None:
        nvtx.range_push(name)
    start = time.perf_counter_ns()
    try:
        yield
    finally:
        trace.add(name, phase, start, time.perf_counter_ns(), args)
        if nvtx is not None:
            nvtx.range_pop()


@contextlib.contextmanager
def tracing(path: str | os.PathLike[str]) -> Iterator[Trace]:
    """Trace the block into ``path`` (written when the block ends, also when it raises).

    A path holding something other than a regular file is refused at once, and a file that cannot
    be written raises :class:`OutputFileError` naming it (a warning when the block itself raised:
    its error is the one to see)."""
    global _ACTIVE
    check_writable(Path(path), "trace file")
    previous, _ACTIVE = _ACTIVE, Trace(path)
    trace = _ACTIVE
    try:
        yield trace
    except BaseException:
        _ACTIVE = previous
        trace.write_or_warn()
        raise
    _ACTIVE = previous
    trace.write()


def _from_environment() -> None:
    """``TESSERA_TRACE=path``: trace the whole process, written at exit. A path that cannot be
    written warns (now, or at exit) and never fails the program."""
    global _ACTIVE
    path = os.environ.get("TESSERA_TRACE", "").strip()
    if path and _ACTIVE is None:
        try:
            check_writable(Path(path), "trace file")
        except OutputFileError as exc:
            warn(f"TESSERA_TRACE={path}: tracing is off: {exc}")
            return
        _ACTIVE = Trace(path)
        atexit.register(_ACTIVE.write_or_warn)


_from_environment()
