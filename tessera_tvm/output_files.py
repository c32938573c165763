"""Writing the files observability produces (traces, metrics) without harming what is at their path,
and the digest of a file (:func:`sha256_file`: kernel-cache manifests, build outputs).

Tessera's writers append to or replace regular files only: a symbolic link, a device, a FIFO or a
socket at the path is refused with :class:`~tessera_tvm.errors.OutputFileError` naming the file (as
root, replacing a device node under /dev would break the machine). What cannot be written where the
program did not ask for it explicitly (an environment variable) is a warning, never an exception.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
import warnings
from pathlib import Path
from typing import Any

from .errors import OutputFileError, TesseraWarning

__all__ = ["check_writable", "file_kind", "refuse_special", "replace_regular_file", "sha256_file", "warn"]


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, in words."""
    for test, kind in (
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return kind
    return "special file"


def refuse_special(path: Path, what: str) -> None:
    """Raise :class:`OutputFileError` when ``path`` exists and is not a regular file (a link is
    not followed)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputFileError(f"{what} {path}: cannot look at it: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise OutputFileError(
            f"{what} {path}: found a {file_kind(mode)}, expected a regular file (or none); Tessera "
            "writes only regular files: remove it or choose another path"
        )


def check_writable(path: Path, what: str) -> None:
    """Raise :class:`OutputFileError` naming ``path`` unless a file can be written there now: it is
    a regular file or none, and its directory exists (made if needed) and takes a new file."""
    refuse_special(path, what)
    probe = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.probe")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        probe.unlink()
    except OSError as exc:
        raise OutputFileError(f"{what} {path}: cannot write there: {exc.strerror or exc}") from None


def replace_regular_file(path: Path, payload: Any, what: str) -> Path:
    """Write ``payload`` as JSON to ``path`` through a fresh temporary file renamed over it (readers
    see the old file or the whole new one); raises :class:`OutputFileError` naming ``path``."""
    refuse_special(path, what)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL | O_NOFOLLOW: never write through something planted at the temporary name.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(payload, out)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        refuse_special(path, what)  # again: something may have appeared meanwhile
        os.replace(tmp, path)
    except OutputFileError:
        tmp.unlink(missing_ok=True)
        raise
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputFileError(f"{what} {path}: cannot write it: {exc.strerror or exc}") from None
    return path


def warn(message: str) -> None:
    """One :class:`TesseraWarning` (callers say each thing once)."""
    warnings.warn(message, TesseraWarning, stacklevel=3)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
