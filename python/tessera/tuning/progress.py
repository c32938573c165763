"""Progress on stderr while a search compiles and measures: a one-line bar rewritten in place on a
terminal, one line per phase elsewhere (logs), and the search's summary when it is done.
"""

from __future__ import annotations

import sys
import threading
import time


class _Progress:
    """A one-line bar on a terminal (rewritten in place); one line per phase elsewhere (logs)."""

    def __init__(self, enabled: bool, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.lock = threading.Lock()

    def start(self, label: str, total: int) -> None:
        self.label, self.total, self.done, self.began = label, total, 0, time.perf_counter()
        self._draw("")

    def step(self, note: str = "") -> None:
        with self.lock:
            self.done += 1
            self._draw(note)

    def _draw(self, note: str) -> None:
        if not self.tty:
            return
        width = 24
        filled = width * self.done // max(1, self.total)
        bar = "#" * filled + "." * (width - filled)
        line = f"\r{self.label} [{bar}] {self.done}/{self.total} {note}"[:160]
        self.stream.write(line.ljust(100))
        self.stream.flush()

    def finish(self, note: str = "") -> None:
        if not self.enabled:
            return
        took = time.perf_counter() - self.began
        end = f"{self.label}: {self.done}/{self.total} in {took:.1f} s{'; ' + note if note else ''}"
        self.stream.write(("\r" + end.ljust(100) if self.tty else end) + "\n")
        self.stream.flush()

    def write(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text)
            self.stream.flush()
