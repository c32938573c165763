"""Error classes shared by Tessera and tessera_tvm.

Every failure a user can cause ends in a subclass of :class:`TesseraError` whose message names
the file or kernel, the value found and the value expected. Catch ``TesseraError`` to catch them all.
"""

from __future__ import annotations


class TesseraError(Exception):
    """Base class of every error Tessera raises on purpose."""


class ConfigError(TesseraError, ValueError):
    """A target config YAML is missing, malformed or names something unknown."""

    def __init__(self, source: str, key: str | None, message: str, line: int | None = None):
        self.source = source
        self.key = key
        self.line = line
        where = source if line is None else f"{source}:{line}"
        what = f"{key}: " if key else ""
        super().__init__(f"{where}: {what}{message}")


class PassNotFoundError(TesseraError, KeyError):
    """A pass name is not in the registry."""

    def __init__(self, name: str, suggestions: list[str]):
        self.name = name
        self.suggestions = suggestions
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        super().__init__(f"unknown pass {name!r}{hint} (`tessera passes --list` shows every registered pass)")

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return self.args[0]


class ResourceError(TesseraError):
    """A kernel needs more of a hardware resource than the target config allows."""

    def __init__(self, kernel: str, resource: str, amount: int, limit: int, config: str, hint: str = ""):
        self.kernel = kernel
        self.resource = resource
        self.amount = amount
        self.limit = limit
        msg = f"kernel {kernel!r} needs {amount} {resource} but target {config!r} allows at most {limit}"
        super().__init__(msg + (f"; {hint}" if hint else ""))


class LoweringError(TesseraError):
    """A pass failed while lowering a kernel; the message names the pass and the kernel."""


class ToolchainError(TesseraError):
    """An external compiler (nvcc, g++) failed or is missing; the message holds its command and output."""

    def __init__(self, command: list[str], output: str, message: str | None = None):
        self.command = command
        self.output = output
        cmd = " ".join(command)
        super().__init__(message or f"command failed: {cmd}\n{output.strip()}")


class ToolchainMissingError(ToolchainError):
    """The external compiler a step needs is not on PATH."""


class ToolchainProcessError(TesseraError):
    """Tessera's toolchain process (TileLang's TVM, serving an upstream apache-tvm process) is
    missing, failed to start, crashed, timed out or refused a request; the message says what to do."""


class OutputFileError(TesseraError, OSError):
    """A file Tessera was asked to write (a trace, a metrics file) cannot be written, or is not a
    regular file it may replace or append to; the message names the file and what was found."""


class NotRunnableError(TesseraError, RuntimeError):
    """A kernel compiled for a GPU target was called on this machine (its artifacts are the result)."""


class AutotuneError(TesseraError, RuntimeError):
    """Autotuning found nothing to measure (every candidate pruned or failed) or cannot measure here."""


class TesseraWarning(UserWarning):
    """Something Tessera worked around without failing (a damaged cache entry rebuilt, an unusable
    cache or metrics file skipped); filter it with ``warnings.simplefilter(..., TesseraWarning)``."""
