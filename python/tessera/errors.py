"""Errors a Tessera user can cause. All derive from ``TesseraError`` (shared with ``tessera_tvm``).

A mistake inside a kernel body is a :class:`KernelError` whose message starts with the user's
``file:line`` and the op, e.g.

    linear.py:12: ops.matmul: A is [M, K] = [128, 64] but W is [K, N] = [32, 256]; K differs (64 vs 32)
"""

from __future__ import annotations

import os
import sys

# NotRunnableError and AutotuneError are raised by the backends' runners too (tessera_tvm.target).
from tessera_tvm.errors import AutotuneError, NotRunnableError, ResourceError, TesseraError

__all__ = [
    "ArgumentError",
    "AutotuneError",
    "DTypeError",
    "KernelError",
    "NotRunnableError",
    "ResourceError",
    "ScheduleError",
    "ShapeError",
    "TesseraError",
    "user_location",
]

_PACKAGE_DIRS = tuple(
    os.path.dirname(os.path.abspath(p)) + os.sep for p in (__file__, sys.modules["tessera_tvm"].__file__)
)


def user_frame():
    """The innermost frame outside tessera and tessera_tvm (the user's code), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if not os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIRS):
            return frame
        frame = frame.f_back
    return None


def user_location() -> tuple[str, int]:
    """(file, line) of the user's innermost frame."""
    frame = user_frame()
    return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("<unknown>", 0)


class KernelError(TesseraError):
    """A mistake in a kernel body or its annotations, reported at the user's file and line."""

    def __init__(self, message: str, *, op: str | None = None, location: tuple[str, int] | None = None):
        self.filename, self.lineno = location or user_location()
        self.op = op
        self.detail = message
        where = f"{os.path.basename(self.filename)}:{self.lineno}: "
        super().__init__(where + (f"{op}: " if op else "") + message)


class ShapeError(KernelError, ValueError):
    """Shapes that do not fit an op (contraction dims, broadcasting, axes, ranks)."""


class DTypeError(KernelError, TypeError):
    """Dtypes that do not fit an op (mixed operands, integer input to a float op, ...)."""


class ArgumentError(TesseraError, TypeError):
    """A compiled kernel was called with arrays that do not match its annotations."""


class ScheduleError(TesseraError, ValueError):
    """A schedule override is malformed or cannot be held by the target.

    ``reason`` says why in a few words (``shared memory 264 KiB > 227 KiB``): the autotuner lists it
    next to each candidate it pruned.
    """

    def __init__(self, message: str, *, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message
