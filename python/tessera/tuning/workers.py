"""Compiling candidates, in parallel worker processes: :func:`compile_candidate` (one candidate built
and lowered into the persistent kernel cache), the worker's entry point :func:`worker_main` (started
as ``from tessera.tuning import worker_main; worker_main()`` in a fresh interpreter), the
:class:`WorkerPool` that feeds the workers one job at a time and kills a worker (with the compilers it
started) past the compile time limit, and the step of the search that compiles every live candidate.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import tessera_tvm
from tessera_tvm import capture

from ..errors import AutotuneError
from .progress import _Progress
from .space import _Plan


def compile_candidate(job: Mapping[str, Any]) -> dict[str, Any]:
    """Build and lower one candidate (in a worker); its build lands in the persistent kernel cache."""
    from ..compiler import tile_program

    start = time.perf_counter()
    try:
        with capture.disabled():  # a candidate's failure is a table row, not a crash
            tile, _ = tile_program(job["name"], job["describe"], job["spec"], job["schedule"], job["config"])
            lowered = tessera_tvm.lower(tile, job["config"])
    except Exception as exc:  # one candidate's failure is its own, reported in the table
        return {"ok": False, "error": _one_line(exc), "seconds": time.perf_counter() - start}
    return {"ok": True, "seconds": time.perf_counter() - start, "from_cache": lowered.from_cache}


def _one_line(exc: BaseException) -> str:
    """``exc`` for a table cell; a compiler failure shows its first error line, not its command line."""
    from tessera_tvm.errors import ToolchainError

    text = str(exc)
    if isinstance(exc, ToolchainError):
        errors = [ln.strip() for ln in exc.output.splitlines() if "error" in ln.lower()]
        tool = os.path.basename(exc.command[0]) if exc.command else "the compiler"
        text = f"{tool} failed: {errors[0] if errors else exc.output.strip()[:200]}"
    text = " ".join(text.split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(exc).__name__}: {text}"


#: Seconds one candidate may compile in a worker before the worker, and the compilers it started,
#: are killed and the candidate fails (``ts.autotune(compile_timeout=...)``).
COMPILE_TIMEOUT_S = 300.0
#: Seconds a fresh worker may take to start (import TVM and Tessera); not counted in the compile limit.
WORKER_START_TIMEOUT_S = 120.0
_READY = "ready"  # a worker's first message: started, imports done


def worker_main() -> None:
    """A compile worker: pickled jobs on stdin, pickled answers on stdout, until stdin closes."""
    from .. import compiler  # noqa: F401  (imported before saying ready: the compile limit counts compiles)

    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints (TVM, g++) go to stderr, never into the answers
    sys.stdout = sys.stderr
    pickle.dump(_READY, answers)
    answers.flush()
    jobs = sys.stdin.buffer
    while True:
        try:
            job = pickle.load(jobs)
        except EOFError:
            return
        pickle.dump(compile_candidate(job), answers)
        answers.flush()


# The child takes the parent's sys.path, so it imports the same tessera the parent did.
_WORKER_BOOT = (
    "import json, os, sys; sys.path[:] = json.loads(os.environ['TESSERA_TUNE_SYS_PATH']); "
    "from tessera.tuning import worker_main; worker_main()"
)


def _kill(proc: subprocess.Popen) -> None:
    """``proc`` and the compilers it started (g++, nvcc): it leads its own process group."""
    if proc.returncode is not None:  # already reaped: its id may belong to another process now
        return
    try:
        if hasattr(os, "killpg"):  # the group, and compilers run_tool started in sessions of their own
            from tessera_tvm.target.toolchain import kill_process_tree

            kill_process_tree(proc.pid)
        else:  # pragma: no cover - Windows: no process groups
            proc.kill()
    except OSError:  # gone already
        pass


class WorkerPool:
    """``workers`` compile processes fed from one queue. A job that kills its worker, or compiles longer
    than ``timeout`` seconds (None: no limit), fails alone: its worker is killed with the compilers it
    started, and a fresh worker takes the slot's next job."""

    def __init__(self, workers: int, env: Mapping[str, str] | None = None, timeout: float | None = None):
        self.workers = workers
        self.timeout = timeout
        self.env = {**os.environ, **dict(env or {}), "TESSERA_TUNE_SYS_PATH": json.dumps(sys.path)}
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen] = set()
        self._stopped = False

    def _start(self, stderr) -> subprocess.Popen | None:
        with self._lock:
            if self._stopped:
                return None
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_BOOT],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=self.env,
                start_new_session=True,  # a process group of its own: a timeout kills its g++/nvcc too
            )
            self._live.add(proc)
            return proc

    def run(self, jobs: list[tuple[Any, dict]], done: Callable[[Any, dict], None]) -> None:
        """Compile every ``(tag, job)``; ``done(tag, answer)`` is called (from a worker thread) for each."""
        todo: queue.Queue = queue.Queue()
        for item in jobs:
            todo.put(item)
        threads = [threading.Thread(target=self._serve, args=(todo, done), daemon=True) for _ in range(self.workers)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        finally:  # interrupted (Ctrl-C does not reach workers in their own process groups): none outlives us
            with self._lock:
                self._stopped = True
                live = list(self._live)
            for proc in live:
                _kill(proc)

    def _ask(self, proc: subprocess.Popen, job: dict | None, limit: float | None) -> tuple[Any, bool]:
        """``job`` sent to ``proc`` (None: nothing, read its ready message) and its answer; past ``limit``
        seconds ``proc`` is killed. (the answer, None when the worker died or was killed; whether killed)."""
        expired = threading.Event()

        def expire():
            expired.set()
            _kill(proc)

        timer = threading.Timer(limit, expire) if limit is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            if job is not None:
                pickle.dump(job, proc.stdin)
                proc.stdin.flush()
            answer = pickle.load(proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            answer = None
        finally:
            if timer is not None:
                timer.cancel()
                timer.join()  # a kill under way has been sent by now
        return answer, expired.is_set()

    def _reap(self, proc: subprocess.Popen, stderr) -> str:
        """Wait for a worker that died or was killed: ``(exit code N): <the end of its stderr>``."""
        code = proc.wait()
        with self._lock:
            self._live.discard(proc)
        stderr.seek(0)
        tail = " ".join(stderr.read().decode(errors="replace").split())[-300:]
        return f"(exit code {code}): {tail}"

    def _serve(self, todo: queue.Queue, done) -> None:
        with tempfile.TemporaryFile() as stderr:
            proc = None
            try:
                while True:
                    try:
                        tag, job = todo.get_nowait()
                    except queue.Empty:
                        return
                    if proc is None:
                        stderr.seek(0)
                        stderr.truncate()
                        proc = self._start(stderr)
                        if proc is None:  # the pool was stopped
                            return
                        ready, expired = self._ask(proc, None, WORKER_START_TIMEOUT_S)
                        if ready != _READY:
                            why = f"did not start in {WORKER_START_TIMEOUT_S:g} s" if expired else "died starting"
                            done(tag, {"ok": False, "error": f"the compile worker {why} {self._reap(proc, stderr)}"})
                            proc = None
                            continue
                    answer, expired = self._ask(proc, job, self.timeout)
                    if answer is None or expired:  # the worker is gone: the next job starts a fresh one
                        died = self._reap(proc, stderr)
                        proc = None
                        if answer is None and expired:
                            answer = {
                                "ok": False,
                                "error": f"compile exceeded {self.timeout:g} s (its worker was killed)",
                                "seconds": self.timeout,
                            }
                        elif answer is None:
                            answer = {"ok": False, "error": f"the compile worker died {died}"}
                    done(tag, answer)
            finally:
                if proc is not None:
                    proc.stdin.close()
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        _kill(proc)
                        proc.wait()
                    with self._lock:
                        self._live.discard(proc)


class _InProcess:
    """Compiles the jobs one after the other in this process (``workers=0``), where nothing can stop a compile."""

    def run(self, jobs: list[tuple[Any, dict]], done: Callable[[Any, dict], None]) -> None:
        for tag, job in jobs:
            done(tag, compile_candidate(job))


def _compile_jobs(plans: list[_Plan], config) -> list[tuple[tuple[int, int], dict]]:
    """Every live candidate as a ``((plan number, candidate index), job)`` for a pool."""
    return [((i, c.index), p.job(c, config)) for i, p in enumerate(plans) for c in p.live]


def _compile_with(
    pool, jobs: list[tuple[tuple[int, int], dict]], plans: list[_Plan], show: _Progress, how: str
) -> None:
    """``jobs`` compiled by ``pool`` (a :class:`WorkerPool`, or any object with its ``run``), the bar
    advancing as each answer arrives; the answers recorded on the plans."""
    show.start(f"autotune: compiling {len(jobs)} candidates ({how})", len(jobs))

    def done(tag, answer):
        plans[tag[0]].compiled[tag[1]] = answer
        show.step(f"{plans[tag[0]].name} #{tag[1]}")

    pool.run(jobs, done)
    failed = sum(not a["ok"] for p in plans for a in p.compiled.values())
    show.finish(f"{failed} failed" if failed else "")


def _compile_all(
    plans: list[_Plan], config, workers: int | None, env: dict[str, str], show: _Progress, timeout: float | None
) -> tuple[int, float]:
    """Every live candidate compiled (in parallel, each within ``timeout`` seconds; workers=0: in this
    process, unbounded); answers recorded on the plans. (workers, seconds)."""
    start = time.perf_counter()
    jobs = _compile_jobs(plans, config)
    if workers is None:
        workers = os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise AutotuneError(f"workers is {workers!r}; expected an int >= 0 (0: compile in this process)")
    workers = min(workers, len(jobs))
    pool = WorkerPool(workers, env, timeout) if workers else _InProcess()
    _compile_with(pool, jobs, plans, show, f"{workers or 'no'} worker processes")
    return workers, time.perf_counter() - start
