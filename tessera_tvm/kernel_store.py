"""The kernel cache's directory: verified entries, written atomically, and what dead processes left.

The directory of :class:`KernelCache` is ``$TESSERA_CACHE_DIR`` (default ``~/.cache/tessera/kernels``;
``TESSERA_DISABLE_CACHE=1`` turns it off). What an entry is keyed on is the driver's business
(``tessera_tvm.cache``: the program, the config, the ``PassContext``, the versions); this module only
stores and checks, so that the backends (``tessera_tvm.target``), which keep their built libraries
here too (:func:`cached_build`), need nothing above them.

- Writes are atomic: an entry is assembled in a private temporary directory and renamed into place,
  so readers never see half an entry. One process compiles a key at a time (a ``filelock`` per key
  under ``locks/``): the others wait and load what it stored.
- Integrity: ``manifest.json`` records the SHA-256 of every file and of itself (its other fields,
  canonical JSON); an entry that fails any check is removed and rebuilt with one
  :class:`~tessera_tvm.errors.TesseraWarning`, never loaded. The libraries built from entries
  (``modules/<hash>/``, :func:`cached_build`) have the same manifest.
- A cache that cannot be read or written (read-only, on a full disk) is not an error: the compile
  happens in a temporary directory, with one warning per process.
- What killed processes leave (staging directories, ``tessera_build_*`` directories in the temporary
  directory, half-written precompiled preludes) is removed by the next process that opens the cache.
  Each live build holds an ``flock`` on its directory, so only a dead process's files go.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import TesseraWarning
from .output_files import sha256_file

MANIFEST = "manifest.json"

#: How long a directory a live build made may go before it holds its lock (mkdtemp, then flock).
_STALE_AFTER_S = 60.0
#: How long a file may wait for another process's compile of the same key before compiling itself.
_LOCK_TIMEOUT_S = 1800.0


@dataclass
class CacheEntry:
    """A verified entry: its directory, its manifest's record and its files by artifact name."""

    path: Path
    record: dict[str, Any]
    files: dict[str, Path]


class DamagedEntry(ValueError):
    """An entry that fails its checks (internal: the entry is removed and rebuilt)."""


# --------------------------------------------------------------------------------------- warnings

_warned: set[str] = set()


def warn_once(topic: str, message: str) -> None:
    """A :class:`TesseraWarning`, once per process per ``topic``."""
    if topic not in _warned:
        _warned.add(topic)
        warnings.warn(message, TesseraWarning, stacklevel=3)


def cache_unusable(root: Path | None, exc: OSError) -> None:
    """Say once per process that the cache at ``root`` cannot be used and compiles go elsewhere."""
    where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
    warn_once(
        f"unusable:{root}",
        f"kernel cache {root}: cannot use it ({exc.strerror or exc}{where}); compiling in a temporary "
        "directory instead (set TESSERA_CACHE_DIR to a writable directory, or TESSERA_DISABLE_CACHE=1)",
    )


def _damaged(path: Path, why: str) -> None:
    warn_once(f"damaged:{path}", f"kernel cache entry {path} is damaged ({why}); it is removed and rebuilt")


# --------------------------------------------------------------------------------------- manifests


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def write_manifest(directory: Path, record: dict[str, Any], files: dict[str, str]) -> None:
    """``directory/manifest.json``: ``record``, the SHA-256 of each of ``files`` (name -> file name in
    ``directory``) and the SHA-256 of all that, so a changed byte anywhere is seen."""
    body = {**record, "files": {name: {"file": f, "sha256": sha256_file(directory / f)} for name, f in files.items()}}
    body = json.loads(json.dumps(body))  # as it reads back (tuples as lists, keys as strings)
    body["manifest_sha256"] = hashlib.sha256(_canonical(body)).hexdigest()
    (directory / MANIFEST).write_bytes(json.dumps(body, indent=1).encode())


def read_manifest(directory: Path) -> tuple[dict[str, Any], dict[str, Path]]:
    """The record and files of ``directory``'s manifest, every digest checked; raises
    :class:`DamagedEntry` saying what is wrong, OSError when it cannot be read, FileNotFoundError
    when there is no manifest."""
    raw = (directory / MANIFEST).read_bytes()
    try:
        body = json.loads(raw.decode("utf-8"))
        recorded = body.pop("manifest_sha256")
        files = body["files"]
        if not isinstance(recorded, str) or not isinstance(files, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DamagedEntry(f"{MANIFEST} is not a manifest") from None
    if hashlib.sha256(_canonical(body)).hexdigest() != recorded:
        raise DamagedEntry(f"{MANIFEST} does not match its own checksum")
    found = {}
    for name, info in files.items():
        file = directory / str(info["file"])
        if file.parent != directory:
            raise DamagedEntry(f"{MANIFEST} names {info['file']!r}, outside the entry")
        try:
            digest = sha256_file(file)
        except FileNotFoundError:
            raise DamagedEntry(f"{file.name} is missing") from None
        if digest != info["sha256"]:
            raise DamagedEntry(f"{file.name} does not match its checksum")
        found[name] = file
    return body, found


# ----------------------------------------------------------------------------- scratch directories

#: The directories :func:`scratch_directory` made, removed when the process that made them exits.
_SCRATCH: list[tuple[int, Path]] = []


def scratch_directory(prefix: str) -> Path:
    """A new directory in the temporary directory for artifacts nobody asked to keep (no ``out_dir``,
    no cache), removed when this process exits: a long-running process that compiles kernels does
    not fill the temporary directory with one directory per compile."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if not _SCRATCH:
        atexit.register(_remove_scratch)
    _SCRATCH.append((os.getpid(), path))
    return path


def _remove_scratch() -> None:
    for pid, path in _SCRATCH:
        if pid == os.getpid():  # a forked child that exits normally leaves its parent's alone
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def held_directory(parent: str | os.PathLike[str] | None, prefix: str) -> Iterator[Path]:
    """A new directory ``<parent>/<prefix><pid>.<random>`` held under an ``flock`` (on the directory)
    for the block and removed after it, unless the block moved it away. The lock tells
    :func:`clean_stale` that its process is alive; a killed process's directory is removed there."""
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.", dir=parent))
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)


def _abandoned(path: Path, now: float, min_age: float = _STALE_AFTER_S) -> bool:
    """Whether nobody holds ``path``'s lock (its process is dead) and it is old enough not to be a
    directory a live process has just made and not yet locked."""
    try:
        if now - path.lstat().st_mtime < min_age:
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: a live build
    finally:
        os.close(fd)
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


_cleaned: set[str] = set()


def clean_stale(root: Path | None) -> None:
    """Remove what dead processes left (once per process per cache): the cache's staging and trash
    directories (``<xx>/.*``, ``modules/.*``), half-written precompiled preludes (``pch/``), and
    ``tessera_build_*`` directories in the temporary directory. A file a live process holds is kept."""
    tmp = tempfile.gettempdir()
    if f"{root}|{tmp}" in _cleaned:
        return
    _cleaned.add(f"{root}|{tmp}")
    now = time.time()
    dead: list[Path] = []
    candidates = []
    for path in Path(tmp).glob(f"{BUILD_PREFIX}*"):
        if _BUILD_DIR.fullmatch(path.name):  # tessera_build_<pid>.<random>: held while its compile runs
            candidates.append(path)
        elif _OLD_BUILD_DIR.fullmatch(path.name) and _abandoned(path, now, min_age=86400):  # before locks
            dead.append(path)
    if root is not None:
        with contextlib.suppress(OSError):
            for sub in Path(root).iterdir():
                if sub.name in ("pch", "locks", "repro") or not sub.is_dir() or sub.is_symlink():
                    continue
                candidates += [p for p in sub.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]
        pch = prelude_dir(Path(root))
        with contextlib.suppress(OSError):
            for lock in pch.glob("*.lock"):  # the prelude's builder holds pch/<identity>.lock
                partial = list((pch / lock.stem).rglob(".*.gch.*.tmp"))
                if partial and _abandoned(lock, now, min_age=0):
                    dead += partial
    dead += [path for path in candidates if _abandoned(path, now)]
    for path in dead:
        _remove(path)


def prelude_dir(root: Path | None) -> Path | None:
    """Where the precompiled C preludes of the cache at ``root`` live: ``$TESSERA_PCH_DIR`` where set
    (several caches then share one, ~70 MB per flag set: the test suite builds it once per run; it
    serves with the kernel cache off too), else ``<root>/pch`` (None: the cache is off)."""
    shared = os.environ.get("TESSERA_PCH_DIR", "").strip()
    if shared:
        return Path(shared)
    return None if root is None else Path(root) / "pch"


#: The prefix of the directories compiles build in (in the temporary directory).
BUILD_PREFIX = "tessera_build_"
_BUILD_DIR = re.compile(rf"{BUILD_PREFIX}\d+\.[a-z0-9_]{{8}}")
_OLD_BUILD_DIR = re.compile(rf"{BUILD_PREFIX}[a-z0-9_]{{8}}")


# ------------------------------------------------------------------------------------------- cache


class KernelCache:
    """A directory of compiled kernels, one subdirectory per key."""

    def __init__(self, root: str | Path | None):
        self.root = Path(root) if root is not None else None

    @classmethod
    def from_env(cls) -> KernelCache:
        if os.environ.get("TESSERA_DISABLE_CACHE", "").strip().lower() in {"1", "true", "yes", "on"}:
            return cls(None)
        root = os.environ.get("TESSERA_CACHE_DIR") or Path.home() / ".cache" / "tessera" / "kernels"
        clean_stale(Path(root))
        return cls(root)

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def _entry_dir(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / key

    def load(self, key: str) -> CacheEntry | None:
        """The entry for ``key`` if present and intact; a damaged entry is removed (with a warning),
        a cache that cannot be read is a miss (with a warning)."""
        if not self.enabled:
            return None
        return self._load_dir(self._entry_dir(key), key)

    def _load_dir(self, path: Path, key: str) -> CacheEntry | None:
        try:
            record, files = read_manifest(path)
            if record.get("key") != key:
                raise DamagedEntry(f"its manifest is for key {str(record.get('key'))[:16]}...")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except DamagedEntry as exc:
            _damaged(path, str(exc))
            self.discard(path)
            return None
        except OSError as exc:
            cache_unusable(self.root, exc)
            return None
        return CacheEntry(path, record, files)

    def store(self, key: str, record: dict[str, Any], files: dict[str, Path]) -> CacheEntry | None:
        """Copy ``files`` and ``record`` into a new entry, atomically; returns the entry now in place,
        or None (with a warning) when the cache cannot be written: the caller keeps its own files."""
        if not self.enabled:
            return None
        return self._store_dir(self._entry_dir(key), key, record, lambda staging: _copy_into(files, staging))

    def _store_dir(self, final: Path, key: str, record: dict[str, Any], fill) -> CacheEntry | None:
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            with held_directory(final.parent, f".{final.name[:12]}.") as staging:
                names = fill(staging)
                write_manifest(staging, {**record, "key": key}, names)
                try:
                    os.rename(staging, final)
                except OSError:
                    # Another process stored the same key first (or a damaged entry is in the way).
                    if self._load_dir(final, key) is None:
                        self.discard(final)
                        os.rename(staging, final)
        except OSError as exc:  # read-only, full, gone: compile without the cache
            cache_unusable(self.root, exc)
            return None
        return self._load_dir(final, key)

    @contextlib.contextmanager
    def lock(self, key: str | None) -> Iterator[None]:
        """Hold the lock of ``key`` across processes (``locks/<key>.lock``): one compiles it, the
        others wait, then find its entry. Without a cache, or where no lock file can be made (a
        read-only cache), or after waiting too long (a hung compile), the block runs unlocked."""
        if not self.enabled or key is None:
            yield
            return
        from filelock import FileLock, Timeout

        lock = FileLock(self.root / "locks" / f"{key}.lock", timeout=_LOCK_TIMEOUT_S)
        try:
            (self.root / "locks").mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except Timeout:
            warn_once(f"lock:{key}", f"kernel cache {self.root}: waited {_LOCK_TIMEOUT_S:g} s for "
                      f"another process's compile of {key[:16]}...; compiling here too")  # fmt: skip
            yield
            return
        except OSError as exc:
            cache_unusable(self.root, exc)
            yield
            return
        try:
            yield
        finally:
            lock.release()

    @staticmethod
    def discard(path: Path) -> None:
        """Remove an entry: moved aside first so a concurrent reader never sees half of it."""
        with contextlib.suppress(OSError):
            trash = path.with_name(f".trash.{path.name}.{os.getpid()}")
            os.rename(path, trash)
            path = trash
        shutil.rmtree(path, ignore_errors=True)

    _discard = discard


def _copy_into(files: dict[str, Path], staging: Path) -> dict[str, str]:
    names = {}
    for name, src in files.items():
        dest = staging / Path(src).name
        shutil.copy2(src, dest)
        names[name] = dest.name
    return names


def cached_build(build: Callable[[Path], None], *parts: str | bytes, name: str = "module") -> Path:
    """A directory holding what ``build(directory)`` writes, kept in the kernel cache under
    ``modules/<hash of parts>/`` with a verified manifest (a library built from cache entries: the
    CPU's linked entry). A damaged directory is rebuilt (with a warning); without a usable cache
    (off, read-only, full) it is built in a new temporary directory."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    cache = KernelCache.from_env()
    if cache.enabled:
        key = digest.hexdigest()[:24]
        final = cache.root / "modules" / key

        def fill(staging: Path) -> dict[str, str]:
            build(staging)
            return {f.name: f.name for f in sorted(staging.iterdir()) if f.is_file()}

        if cache._load_dir(final, key) is not None:
            return final
        with cache.lock(f"module-{key}"):  # one process builds it, the others wait and load it
            if cache._load_dir(final, key) is not None or cache._store_dir(final, key, {"name": name}, fill):
                return final
    scratch = scratch_directory(f"tessera_{name}_")
    build(scratch)
    return scratch
