"""The toolchain process: TileLang's TVM, in its own venv, serving a user's apache-tvm process.

One process cannot hold TileLang's TVM and upstream apache-tvm (DESIGN.md §3.1), so Tessera's
compiler runs in a child process (``python -m tessera_tvm.relax.bridge``) started on first use,
reused for every later call, and ended with the user's process (its stdin closes). Requests and
answers are JSON lines; the Relax module travels as TVMScript text.

Which Python runs it: ``$TESSERA_TOOLCHAIN_PYTHON`` when set, else the ``.venv`` that
``./tessera.sh`` sets up beside this source tree, else a venv under the cache directory that the
first use makes. A toolchain that is missing, fails to start, crashes or does not answer in time
raises :class:`ToolchainProcessError` saying what to do.
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

#: Environment variables that would make a child process load another TVM than its own (TileLang sets
#: PYTHONPATH, TVM_LIBRARY_PATH and TL_* at import; DESIGN.md §3.1). Strip them for a child.
FOREIGN_ENV = (
    "PYTHONPATH",
    "PYTHONHOME",
    "LD_LIBRARY_PATH",
    "TVM_LIBRARY_PATH",
    "TVM_HOME",
    "VIRTUAL_ENV",
    "TL_CUTLASS_PATH",
    "TL_TEMPLATE_PATH",
)


def clean_environment() -> dict[str, str]:
    """This process's environment without :data:`FOREIGN_ENV`: for a child that runs the other TVM."""
    return {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}


def toolchain_python() -> Path:
    """The Python of the toolchain venv (TileLang and Tessera installed): ``$TESSERA_TOOLCHAIN_PYTHON``,
    else the checkout's ``.venv`` (``./tessera.sh setup``), else a venv under the cache directory,
    created on first use (:func:`create_toolchain_venv`). Raises ToolchainProcessError."""
    given = os.environ.get("TESSERA_TOOLCHAIN_PYTHON", "").strip()
    if given:
        candidate = Path(given).expanduser()
        if not _executable(candidate):
            raise ToolchainProcessError(
                f"Tessera's toolchain Python was not found: TESSERA_TOOLCHAIN_PYTHON={given} is not an executable "
                f"file. Point it at the python of a venv with Tessera and TileLang (`{_SOURCE_ROOT / 'tessera.sh'} "
                "setup` makes one), or unset it to use the checkout's .venv."
            )
        return candidate
    for candidate in (_SOURCE_ROOT / ".venv" / "bin" / "python", cached_toolchain_dir() / "bin" / "python"):
        if _executable(candidate):
            return candidate
    return create_toolchain_venv(cached_toolchain_dir())


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def cached_toolchain_dir() -> Path:
    """Where a toolchain venv made on first use lives: ``$TESSERA_TOOLCHAIN_DIR``, else
    ``~/.cache/tessera/toolchain``."""
    given = os.environ.get("TESSERA_TOOLCHAIN_DIR", "").strip()
    return Path(given).expanduser() if given else Path.home() / ".cache" / "tessera" / "toolchain"


def create_toolchain_venv(where: Path) -> Path:
    """Make the toolchain venv at ``where`` with the checkout's own set-up (``tessera.sh setup`` with
    ``TESSERA_VENV``: TileLang, torch CPU and Tessera; a few minutes, pip's progress on stderr).
    Returns its Python; raises ToolchainProcessError when the set-up fails."""
    script = _SOURCE_ROOT / "tessera.sh"
    if not script.is_file():
        raise ToolchainProcessError(
            f"no toolchain Python is set and there is no checkout to make one from ({script} is missing): set "
            "TESSERA_TOOLCHAIN_PYTHON to the python of a venv with Tessera and TileLang"
        )
    print(
        f"tessera: making the toolchain venv at {where} (TileLang, torch CPU, Tessera; once, a few minutes)...",
        file=sys.stderr,
        flush=True,
    )
    where.parent.mkdir(parents=True, exist_ok=True)
    env = clean_environment()
    env["TESSERA_VENV"] = str(where)
    setup = subprocess.Popen(
        ["bash", str(script), "setup"],
        cwd=str(_SOURCE_ROOT),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in setup.stdout:  # pip's progress, as it comes
        print(f"  {line.rstrip()}", file=sys.stderr, flush=True)
    status = setup.wait()
    python = where / "bin" / "python"
    if status != 0 or not _executable(python):
        raise ToolchainProcessError(
            f"making the toolchain venv at {where} failed (`tessera.sh setup` exited {status}; its output is "
            "above). Fix what it says, or set TESSERA_TOOLCHAIN_PYTHON to an existing toolchain."
        )
    return python


class Toolchain:
    """One running toolchain process; :func:`toolchain` gives the shared one."""

    def __init__(self, python: Path | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.python = python or toolchain_python()
        self.timeout = timeout
        env = clean_environment()
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
        self._stderr_reader = threading.Thread(target=self._keep_stderr, daemon=True)
        self._stderr_reader.start()
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

    def _exited(self) -> ToolchainProcessError:
        """The error for a toolchain that ended: its exit status and the end of its output."""
        try:
            status = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            status = None
        self._stderr_reader.join(timeout=5)  # the rest of what it printed
        return self._failure(f"exited (status {status}) before answering")

    def _failure(self, what: str) -> ToolchainProcessError:
        tail = "".join(self._stderr[-20:]).strip()
        return ToolchainProcessError(
            f"Tessera's toolchain ({self.python}) {what}" + (f"; its last output:\n{tail}" if tail else "")
        )

    def request(self, payload: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send one request and wait for its answer; raises ToolchainProcessError (or the bridge's error)."""
        if self.proc.poll() is not None:
            raise self._exited()
        try:
            self.proc.stdin.write(json.dumps(payload) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._exited() from None
        try:
            line = self._lines.get(timeout=timeout or self.timeout)
        except queue.Empty:
            self.proc.kill()  # it hangs: it would not read the end of its input either
            self.proc.wait()
            raise self._failure(
                f"did not answer within {timeout or self.timeout:.0f} s and was stopped "
                "(TESSERA_TOOLCHAIN_TIMEOUT sets the limit)"
            ) from None
        if line is None:
            raise self._exited()
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


def shared_toolchain() -> Toolchain:
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
