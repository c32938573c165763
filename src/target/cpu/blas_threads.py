"""One set of threads: the process's OpenBLAS runs its parallel work on the CPU kernels' OpenMP threads.

numpy and scipy ship a pthreads build of OpenBLAS whose worker threads keep spinning for about 0.1 s
after each threaded call. A Tessera kernel launched in that time shares the cores with them: a 1024^3
f32 GEMM ran at 0.68-0.85x of its time alone right after a few numpy matmuls on 2 cores (bench/
``threads``). OpenBLAS 0.3.27 and later let the caller run a call's jobs
(``openblas_set_threads_callback_function``); :func:`share_blas_threads` hands them to
``blas_threads.c``, which runs them as one OpenMP team, the threads the kernels use. The kernels then
run as fast after numpy as alone, and numpy's own BLAS is as fast as on its threads.

It is called whenever a CPU kernel or a Relax library with CPU kernels is loaded (cheap after the
first time: it looks for newly loaded OpenBLAS libraries only when modules were imported since).
``TESSERA_SHARE_BLAS_THREADS=0`` leaves OpenBLAS alone. Only pthreads builds are switched (an OpenMP
build already uses OpenMP threads; a sequential one has none).

Forks: GNU OpenMP does not survive one (a parallel region of more than one thread in the child of a
process that ran one waits forever for threads the child does not have; before this module a kernel
called in a forked child after one ran in the parent hung). In a forked child of a process that loaded
CPU kernels, the kernels run on one thread and OpenBLAS goes back to its own threads, which it
restarts after a fork.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import threading
import warnings
from pathlib import Path

from ...errors import TesseraWarning
from ..toolchain import require_tool, run_tool

__all__ = [
    "SOURCE",
    "BlasLibrary",
    "calls_on_kernel_threads",
    "share_blas_threads",
    "shared_blas_libraries",
    "stop_sharing_blas_threads",
]

#: The callback's C source (package data beside this module).
SOURCE = Path(__file__).with_name("blas_threads.c")

#: How OpenBLAS builds name their exports: numpy's wheels ``scipy_openblas_<name>64_`` (64-bit
#: integers), scipy's ``scipy_openblas_<name>``, a system OpenBLAS ``openblas_<name>`` (``<name>64_``
#: for its 64-bit-integer build).
_NAMINGS = (("", ""), ("scipy_", "64_"), ("scipy_", ""), ("", "64_"))

#: openblas_get_parallel(): 0 sequential, 1 pthreads, 2 OpenMP.
_PTHREADS = 1


class BlasLibrary:
    """An OpenBLAS library loaded in this process whose threads callback Tessera set."""

    __slots__ = ("path", "_set_callback")

    def __init__(self, path: str, set_callback) -> None:
        self.path = path
        self._set_callback = set_callback

    def set_callback(self, address: int | None) -> None:
        self._set_callback(ctypes.c_void_p(address))

    def __repr__(self) -> str:
        return f"BlasLibrary({self.path!r})"


_lock = threading.Lock()
_shared: dict[str, BlasLibrary] = {}  # path -> library switched to the kernels' threads
_seen: set[str] = set()  # OpenBLAS paths already looked at (switched or not)
_modules_at_scan = -1  # len(sys.modules) at the last scan of the loaded libraries
_callback: ctypes.CDLL | None = None  # the built blas_threads.c, loaded for the process's lifetime
_after_fork_registered = False
_forked_child = False
_unbuildable = False  # the callback failed to build: OpenBLAS keeps its threads in this process


def share_blas_threads() -> list[BlasLibrary]:
    """Called when CPU kernels are loaded: switch every OpenBLAS (pthreads build, 0.3.27 or later)
    loaded in this process to running its parallel work on the kernels' OpenMP threads, and make
    sure a forked child runs the kernels on one thread (see the module's text); return the libraries
    switched so far.

    Idempotent and thread-safe. Never raises: where the callback cannot be built (no compiler, a
    compile error) or a library cannot be read, it warns once and leaves OpenBLAS as it is."""
    global _modules_at_scan, _unbuildable
    _register_after_fork()
    if os.environ.get("TESSERA_SHARE_BLAS_THREADS", "").strip() == "0" or _forked_child or _unbuildable:
        return shared_blas_libraries()
    if len(sys.modules) == _modules_at_scan:  # nothing imported since the last scan: nothing new loaded
        return shared_blas_libraries()
    with _lock:
        _modules_at_scan = len(sys.modules)
        try:
            _switch_new_libraries()
        except Exception as exc:  # a speed-up only: never the reason a kernel fails to load
            _unbuildable = True
            warnings.warn(
                f"OpenBLAS keeps its own threads: {type(exc).__name__}: {exc} "
                "(set TESSERA_SHARE_BLAS_THREADS=0 to leave it alone)",
                TesseraWarning,
                stacklevel=2,
            )
    return shared_blas_libraries()


def _switch_new_libraries() -> None:
    for path in _loaded_openblas():
        if path in _seen:
            continue
        _seen.add(path)
        library = _switchable(path)
        if library is None:
            continue
        library.set_callback(_callback_address())
        _shared[path] = library


def shared_blas_libraries() -> list[BlasLibrary]:
    """The OpenBLAS libraries whose parallel work runs on the kernels' threads."""
    return list(_shared.values())


def stop_sharing_blas_threads() -> None:
    """Give every switched OpenBLAS back its own threads (the bench's comparison). Only safe while no
    BLAS call runs in another thread; the next :func:`share_blas_threads` switches them again."""
    global _modules_at_scan
    with _lock:
        for library in _shared.values():
            library.set_callback(None)
        _shared.clear()
        _seen.clear()
        _modules_at_scan = -1


def calls_on_kernel_threads() -> int:
    """Threaded OpenBLAS calls run on the kernels' threads so far in this process (0 before any)."""
    return int(_callback.tessera_blas_calls_run()) if _callback is not None else 0


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    found: dict[str, None] = {}
    for line in lines:
        fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
        path = fields[5].strip() if len(fields) == 6 else ""
        name = os.path.basename(path)
        if "openblas" in name.lower() and ".so" in name:
            found[path] = None
    return list(found)


def _switchable(path: str) -> BlasLibrary | None:
    """The library at ``path`` if it is a pthreads OpenBLAS with the threads callback, else None."""
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # already loaded: no new mapping
    except OSError:
        return None
    for prefix, suffix in _NAMINGS:
        setter = getattr(lib, f"{prefix}openblas_set_threads_callback_function{suffix}", None)
        parallel = getattr(lib, f"{prefix}openblas_get_parallel{suffix}", None)
        if setter is None or parallel is None:
            continue
        parallel.restype = ctypes.c_int
        parallel.argtypes = []
        if parallel() != _PTHREADS:
            return None
        setter.restype = None
        setter.argtypes = [ctypes.c_void_p]
        return BlasLibrary(path, setter)
    return None


def _callback_address() -> int:
    """The address of ``tessera_blas_run_jobs``, built (once per compiler and source, in the kernel
    cache) and loaded on first use."""
    global _callback
    if _callback is None:
        path = _build()
        library = ctypes.CDLL(str(path), mode=os.RTLD_NOW)
        if path.parent.name.startswith("tessera_blas_threads_"):  # built without a cache: a scratch copy
            shutil.rmtree(path.parent, ignore_errors=True)  # (the loaded library stays mapped)
        for name in ("tessera_blas_calls_run", "tessera_blas_jobs_spawned"):
            getattr(library, name).restype = ctypes.c_uint64
        _callback = library
    return ctypes.cast(_callback.tessera_blas_run_jobs, ctypes.c_void_p).value


def _build() -> Path:
    from ...kernel_store import cached_build

    cxx = require_tool("g++")
    source = SOURCE.read_text(encoding="utf-8")
    command = [cxx, "-x", "c", "-O2", "-fopenmp", "-shared", "-fPIC", "-o", "libtessera_blas_threads.so", SOURCE.name]

    def build(directory: Path) -> None:
        (directory / SOURCE.name).write_text(source, encoding="utf-8")
        run_tool(command, cwd=directory, timeout=120)

    stat = os.stat(cxx)
    compiler = f"{os.path.realpath(cxx)}:{stat.st_size}:{stat.st_mtime_ns}"
    return cached_build(build, source, compiler, *command, name="blas_threads") / "libtessera_blas_threads.so"


def _register_after_fork() -> None:
    global _after_fork_registered
    if not _after_fork_registered:
        _after_fork_registered = True
        os.register_at_fork(after_in_child=_after_fork_in_child)


def _after_fork_in_child() -> None:
    """A forked child of a process that loaded CPU kernels: GNU OpenMP's threads did not survive the
    fork, and a parallel region of more than one thread would wait for them forever. So the kernels
    run on one thread here (``TESSERA_NUM_THREADS=1``: the kernels read it at every launch), and
    OpenBLAS goes back to its own threads, which it restarts after a fork."""
    global _forked_child
    _forked_child = True
    os.environ["TESSERA_NUM_THREADS"] = "1"
    for library in _shared.values():
        library.set_callback(None)
    _shared.clear()
