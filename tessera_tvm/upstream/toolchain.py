"""The toolchain process: TileLang's TVM, in its own venv, serving a user's apache-tvm process.

One process cannot hold TileLang's TVM and upstream apache-tvm (DESIGN.md §3.1), so Tessera's
compiler runs in a child process (``python -m tessera_tvm.relax.bridge``) started on first use,
reused for every later call, and ended with the user's process (its stdin closes). Requests and
answers are JSON lines; the Relax module travels as TVMScript text.

Which Python runs it: ``$TESSERA_TOOLCHAIN_PYTHON`` when set, else the ``.venv`` that
``./tessera.sh`` sets up beside this source tree. A toolchain that is missing, fails to start,
crashes or does not answer in time raises :class:`ToolchainProcessError` saying what to do.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from ..errors import ToolchainProcessError

#: The bridge's protocol version this client speaks (tessera_tvm/relax/bridge.py PROTOCOL).
PROTOCOL = 1

#: Seconds a request may take (partitioning and compiling a model's kernels with g++).
DEFAULT_TIMEOUT = float(os.environ.get("TESSERA_TOOLCHAIN_TIMEOUT", "900"))

_SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the checkout holding tessera_tvm/

#: Environment variables that would make the child load this process's TVM (DESIGN.md §3.1).
_FOREIGN_ENV = (
    "PYTHONPATH",
    "PYTHONHOME",
    "LD_LIBRARY_PATH",
    "TVM_LIBRARY_PATH",
    "TVM_HOME",
    "VIRTUAL_ENV",
    "TL_CUTLASS_PATH",
    "TL_TEMPLATE_PATH",
)


def toolchain_python() -> Path:
    """The Python of the toolchain venv (TileLang and Tessera installed); raises ToolchainProcessError."""
    given = os.environ.get("TESSERA_TOOLCHAIN_PYTHON", "").strip()
    candidate = Path(given).expanduser() if given else _SOURCE_ROOT / ".venv" / "bin" / "python"
    if not candidate.is_file() or not os.access(candidate, os.X_OK):
        where = f"TESSERA_TOOLCHAIN_PYTHON={given}" if given else f"{candidate} (the default)"
        raise ToolchainProcessError(
            f"Tessera's toolchain Python was not found: {where} is not an executable file. The compiler "
            f"runs in its own venv with TileLang: run `{_SOURCE_ROOT / 'tessera.sh'} setup` once, or set "
            "TESSERA_TOOLCHAIN_PYTHON to the python of a venv where `pip install tessera` (with tilelang) "
            "succeeded."
        )
    return candidate


class Toolchain:
    """One running toolchain process; :func:`toolchain` gives the shared one."""

    def __init__(self, python: Path | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.python = python or toolchain_python()
        self.timeout = timeout
        env = {k: v for k, v in os.environ.items() if k not in _FOREIGN_ENV}
        env["PYTHONUNBUFFERED"] = "1"
        try:
            self.proc = subprocess.Popen(
                [str(self.python), "-m", "tessera_tvm.relax.bridge"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=str(_SOURCE_ROOT),
            )
        except OSError as exc:
            raise ToolchainProcessError(f"could not start Tessera's toolchain ({self.python}): {exc}") from None
        self._lines: queue.Queue = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines), daemon=True).start()
        threading.Thread(target=self._keep_stderr, daemon=True).start()
        self.info = self.request({"op": "hello"}, timeout=min(self.timeout, 300.0))
        if self.info.get("protocol") != PROTOCOL:
            self.close()
            raise ToolchainProcessError(
                f"Tessera's toolchain at {self.python} speaks protocol {self.info.get('protocol')}, this "
                f"client {PROTOCOL}: install the same Tessera version in both environments"
            )

    @staticmethod
    def _pump(stream, lines: queue.Queue) -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)  # the process closed its stdout: it exited

    def _keep_stderr(self) -> None:
        for line in self.proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-200]  # the last 200 lines say why it failed

    def _failure(self, what: str) -> ToolchainProcessError:
        tail = "".join(self._stderr[-20:]).strip()
        return ToolchainProcessError(
            f"Tessera's toolchain ({self.python}) {what}" + (f"; its last output:\n{tail}" if tail else "")
        )

    def request(self, payload: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send one request and wait for its answer; raises ToolchainProcessError (or the bridge's error)."""
        if self.proc.poll() is not None:
            raise self._failure(f"is not running (exit status {self.proc.returncode})")
        try:
            self.proc.stdin.write(json.dumps(payload) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._failure("closed its input (it crashed)") from None
        try:
            line = self._lines.get(timeout=timeout or self.timeout)
        except queue.Empty:
            self.close()
            raise self._failure(
                f"did not answer within {timeout or self.timeout:.0f} s and was stopped "
                "(TESSERA_TOOLCHAIN_TIMEOUT sets the limit)"
            ) from None
        if line is None:
            self.proc.wait(timeout=10)
            raise self._failure(f"exited (status {self.proc.returncode}) before answering")
        answer = json.loads(line)
        if not answer.pop("ok", False):
            raise ToolchainProcessError(f"Tessera's toolchain: {answer.get('type')}: {answer.get('error')}")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # the bridge exits when its input ends
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


_SHARED: Toolchain | None = None
_LOCK = threading.Lock()


def toolchain() -> Toolchain:
    """The process's toolchain, started on first use and restarted if it died."""
    global _SHARED
    with _LOCK:
        if _SHARED is None or _SHARED.proc.poll() is not None:
            print("tessera: starting the toolchain process (TileLang's TVM)...", file=sys.stderr, flush=True)
            _SHARED = Toolchain()
        return _SHARED


@atexit.register
def _stop() -> None:
    if _SHARED is not None:
        _SHARED.close()
