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
- The directory (atomic writes, one compile per key across processes, verified manifests, what dead
  processes left) is :mod:`tessera_tvm.kernel_store`'s; its names are re-exported here.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from ._tvm import tilelang, tvm
from .config import TargetConfig
from .kernel_store import (  # noqa: F401  (the directory's names, as before)
    BUILD_PREFIX,
    MANIFEST,
    CacheEntry,
    DamagedEntry,
    KernelCache,
    cache_unusable,
    cached_build,
    clean_stale,
    held_directory,
    prelude_dir,
    read_manifest,
    warn_once,
    write_manifest,
)
from .target.backend import backend_for
from .version import __version__

# 2: CUDA entries carry the runtime library and the program's buffer order; 3: its buffer shapes;
# 4: the manifest's own digest, CPU parameters say whether the kernel writes them
_FORMAT = 4


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
    found = {
        "format": str(_FORMAT),
        "tessera": __version__,
        "tilelang": str(tilelang.__version__),
        "tvm": str(tvm.__version__),
        "compiler": _compiler_version(config.codegen_dict["compiler"]),
    }
    found["code"] = _code_digest()
    isa = backend_for(config).hook("isa_identity")
    if isa is not None:  # what -march=native means here: a kernel for another CPU's instructions is another kernel
        found["isa"] = isa(tuple(config.codegen_dict["flags"]), config.codegen_dict["compiler"])
    return found


@functools.cache
def _code_digest() -> str:
    """SHA-256 over the code that lowers and builds: tessera_tvm's Python files (passes, tile
    programs, codegen, toolchain drivers) and the headers kernels include (``tessera/cpu.h``...).

    A release bumps ``tessera.__version__``; this covers the edits in between, so a changed pass
    never gets an old entry served. Read once per process.
    """
    from . import target, transform

    roots = sorted({Path(__file__).resolve().parent, *(Path(m.__file__).resolve().parent for m in (target, transform))})
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
