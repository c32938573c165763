"""The persistent compiled-kernel cache.

An entry holds everything ``tessera_tvm.lower`` produced for one (tile program, target config,
versions) key: the device source, the host and device IR, the metadata, the pass log and the
toolchain's files (cubin/PTX, the CPU shared library). A hit skips lowering and the toolchain.

- Location: ``$TESSERA_CACHE_DIR`` (default ``~/.cache/tessera/kernels``); ``TESSERA_DISABLE_CACHE=1``
  turns it off.
- Key: the tile program's serialised IR; the config's fingerprint (the config as loaded: every
  phase's expanded pass list with its arguments and conditions, so an edit of
  ``configs/shared/lower_and_legalize.yaml`` changes it); the current ``PassContext``'s opt_level,
  config (TileLang's pass configs), disabled and required passes; the build flag; the versions of
  Tessera, TileLang, TVM and the config's compiler (``nvcc --version`` / ``g++ --version``), and a
  digest of Tessera's own lowering code and of the headers kernels include (``tessera/cpu.h``).
  A lowering under a ``PassContext`` with instruments, or with ``dump_dir``, is not looked up
  (its passes must run) but is stored.
- Writes are atomic: an entry is assembled in a private temporary directory and renamed into place,
  so readers never see half an entry and two processes compiling the same kernel both succeed
  (the second rename loses and its copy is discarded).
- Integrity: the manifest records the SHA-256 of every file; an entry that fails the check is
  removed and recompiled, never loaded.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._tvm import tilelang, tvm
from .config import TargetConfig
from .target.toolchain import sha256_file

MANIFEST = "manifest.json"
_FORMAT = 3  # 2: CUDA entries carry the runtime library and the program's buffer order; 3: its buffer shapes


def _compiler_version(compiler: str) -> str:
    """The version line of the config's compiler ('' when it is absent); looked up per resolved path."""
    from .target.toolchain import find_tool

    tool = {"nvcc": "nvcc", "g++": "g++"}.get(compiler)
    path = find_tool(tool) if tool else None
    return _version_of(path, compiler) if path else ""


@functools.cache
def _version_of(path: str, compiler: str) -> str:
    from .target.toolchain import run_tool

    try:
        out = run_tool([path, "--version"], timeout=60).output
    except Exception:  # a broken compiler fails later, where the error says what happened
        return ""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if not lines:
        return ""
    return f"{path}: {lines[-1] if compiler == 'nvcc' else lines[0]}"


def versions(config: TargetConfig) -> dict[str, str]:
    """Everything outside the program and the config that changes what a compile produces."""
    import tessera

    found = {
        "format": str(_FORMAT),
        "tessera": tessera.__version__,
        "tilelang": str(tilelang.__version__),
        "tvm": str(tvm.__version__),
        "compiler": _compiler_version(config.codegen_dict["compiler"]),
    }
    found["code"] = _code_digest()
    return found


@functools.cache
def _code_digest() -> str:
    """SHA-256 over the code that lowers and builds: tessera_tvm's Python files (passes, tile
    programs, codegen, toolchain drivers) and the headers kernels include (``tessera/cpu.h``...).

    A release bumps ``tessera.__version__``; this covers the edits in between, so a changed pass
    never gets an old entry served. Read once per process.
    """
    import tessera_tvm
    import tessera_tvm.target
    import tessera_tvm.transform

    roots = sorted(
        {Path(m.__file__).resolve().parent for m in (tessera_tvm, tessera_tvm.target, tessera_tvm.transform)}
    )
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".h", ".hpp", ".cpp") and p.is_file()):
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def pass_context_settings(pass_ctx=None) -> dict[str, Any]:
    """What a ``PassContext`` (the current one by default) changes about a compile: its opt_level,
    its config (TileLang's pass configs, e.g. ``tl.disable_tma_lower``), its disabled and required
    passes. Its instruments only observe; ``lower`` does not look such a compile up."""
    pass_ctx = pass_ctx if pass_ctx is not None else tvm.transform.PassContext.current()
    return {
        "opt_level": int(pass_ctx.opt_level),
        "config": sorted((str(k), str(v)) for k, v in pass_ctx.config.items()),
        "disabled_pass": sorted(str(p) for p in pass_ctx.disabled_pass),
        "required_pass": sorted(str(p) for p in pass_ctx.required_pass),
    }


def cache_key(mod, config: TargetConfig, *, build: bool, pass_ctx=None) -> str:
    """The key of one compile: program IR + expanded config + PassContext + build flag + versions."""
    payload = json.dumps(
        {
            "program": hashlib.sha256(tvm.ir.save_json(mod).encode()).hexdigest(),
            "config": config.fingerprint(),
            "pass_context": pass_context_settings(pass_ctx),
            "build": build,
            "versions": versions(config),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass
class CacheEntry:
    """A verified entry: its directory, its manifest's record and its files by artifact name."""

    path: Path
    record: dict[str, Any]
    files: dict[str, Path]


class KernelCache:
    """A directory of compiled kernels, one subdirectory per key."""

    def __init__(self, root: str | Path | None):
        self.root = Path(root) if root is not None else None

    @classmethod
    def from_env(cls) -> KernelCache:
        if os.environ.get("TESSERA_DISABLE_CACHE", "").strip().lower() in {"1", "true", "yes", "on"}:
            return cls(None)
        root = os.environ.get("TESSERA_CACHE_DIR") or Path.home() / ".cache" / "tessera" / "kernels"
        return cls(root)

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def _entry_dir(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / key

    def load(self, key: str) -> CacheEntry | None:
        """The entry for ``key`` if present and intact; a damaged entry is removed."""
        if not self.enabled:
            return None
        path = self._entry_dir(key)
        manifest = path / MANIFEST
        if not manifest.is_file():
            return None
        try:
            record = json.loads(manifest.read_text())
            files = {}
            for name, info in record["files"].items():
                file = path / info["file"]
                if sha256_file(file) != info["sha256"]:
                    raise ValueError(f"{file} does not match its checksum")
                files[name] = file
            if record.get("key") != key:
                raise ValueError("manifest key mismatch")
        except (OSError, ValueError, KeyError, TypeError):
            self._discard(path)
            return None
        return CacheEntry(path, record, files)

    def store(self, key: str, record: dict[str, Any], files: dict[str, Path]) -> CacheEntry | None:
        """Copy ``files`` and ``record`` into a new entry, atomically; returns the entry now in place."""
        if not self.enabled:
            return None
        final = self._entry_dir(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key[:12]}.", dir=final.parent))
        try:
            manifest_files = {}
            for name, src in files.items():
                dest = staging / Path(src).name
                shutil.copy2(src, dest)
                manifest_files[name] = {"file": dest.name, "sha256": sha256_file(dest)}
            (staging / MANIFEST).write_text(json.dumps({**record, "key": key, "files": manifest_files}, indent=1))
            try:
                os.rename(staging, final)
            except OSError:
                # Another process stored the same key first (or a damaged entry is in the way).
                if self.load(key) is None:
                    self._discard(final)
                    os.rename(staging, final)
        finally:
            if staging.exists():
                self._discard(staging)
        return self.load(key)

    @staticmethod
    def _discard(path: Path) -> None:
        # Move aside first so a concurrent reader never sees a half-deleted entry.
        with contextlib.suppress(OSError):
            trash = path.with_name(f".trash.{path.name}.{os.getpid()}")
            os.rename(path, trash)
            path = trash
        shutil.rmtree(path, ignore_errors=True)
