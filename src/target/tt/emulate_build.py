"""Building the tt emulator's executables: the runner and every kernel, compiled with g++ and cached.

:func:`build_runner` compiles the emulator runner (``emulator/src``) once per content hash of its
sources, the API headers (``include``), the g++ version and the flags; ``_build_kernel`` compiles
one tt kernel source (wrapped with ``TT_EMU_DEFINE_ENTRY``) against the API headers into its own
shared object, keyed by the hash of the kernel and the headers it includes, its role, compile-time
args and defines. Both live under :func:`emulator_cache_dir` and are written atomically, so
concurrent builders never see a torn file; a g++ failure raises :class:`KernelCompileError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

from tessera_tvm.errors import ToolchainError, ToolchainMissingError

from ..toolchain import file_lock
from . import EMULATOR_SRC_DIR, INCLUDE_DIR

__all__ = ["KernelCompileError", "build_runner", "emulator_cache_dir"]

_CXX_FLAGS = ["-std=c++17", "-O2"]


class KernelCompileError(ToolchainError):
    """g++ rejected a kernel (or the emulator runner) when building it for the emulator."""


# ---------------------------------------------------------------------------------------------
# Building the runner and the kernels (cached by content hash)
# ---------------------------------------------------------------------------------------------

_build_lock = threading.Lock()
_runner_memo: dict[str, Path] = {}


def emulator_cache_dir() -> Path:
    """``$TESSERA_TT_EMU_CACHE``, else ``$XDG_CACHE_HOME/tessera/tt_emu``, else ``~/.cache/...``."""
    env = os.environ.get("TESSERA_TT_EMU_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tessera" / "tt_emu"


def _cxx() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if not cxx:
        raise ToolchainMissingError(["g++"], "", "the tt emulator needs g++ on PATH (or $CXX)")
    return cxx


_cxx_version_memo: dict[str, str] = {}


def _cxx_version(cxx: str) -> str:
    if cxx not in _cxx_version_memo:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
        _cxx_version_memo[cxx] = out.stdout.splitlines()[0] if out.stdout else cxx
    return _cxx_version_memo[cxx]


def _tree_digest(*roots: Path) -> str:
    h = hashlib.sha256()
    for root in roots:
        for f in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in {".h", ".hpp", ".cpp"}):
            h.update(str(f.relative_to(root.parent)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _compile(cmd: list[str], out: Path, what: str) -> None:
    tmp = out.with_name(out.name + f".tmp{os.getpid()}.{threading.get_ident()}")
    proc = subprocess.run([*cmd, "-o", str(tmp)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise KernelCompileError(cmd, proc.stderr, f"{what}: g++ failed:\n{proc.stderr.strip()}")
    os.replace(tmp, out)


def build_runner(cache_dir: Path | None = None) -> Path:
    """Build (once per content hash) and return the emulator runner executable."""
    cache = Path(cache_dir) if cache_dir else emulator_cache_dir()
    cxx = _cxx()
    key = hashlib.sha256(
        "|".join([_tree_digest(INCLUDE_DIR, EMULATOR_SRC_DIR), _cxx_version(cxx), *_CXX_FLAGS]).encode()
    ).hexdigest()[:20]
    memo_key = f"{cache}:{key}"
    with _build_lock:
        if memo_key in _runner_memo and _runner_memo[memo_key].exists():
            return _runner_memo[memo_key]
        out = cache / f"runner-{key}" / "ttemu_runner"
        if not out.exists():
            with file_lock(cache / "runner.lock"):
                if not out.exists():
                    out.parent.mkdir(parents=True, exist_ok=True)
                    sources = [str(EMULATOR_SRC_DIR / "runtime.cpp"), str(EMULATOR_SRC_DIR / "runner.cpp")]
                    cmd = [
                        cxx,
                        *_CXX_FLAGS,
                        "-Wall",
                        "-I",
                        str(INCLUDE_DIR),
                        "-I",
                        str(EMULATOR_SRC_DIR),
                        *sources,
                        "-rdynamic",
                        "-pthread",
                        "-ldl",
                    ]
                    _compile(cmd, out, "building the tt emulator runner")
        _runner_memo[memo_key] = out
        return out


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def _kernel_digest(source: Path) -> str:
    """Hash of a kernel source and the headers it includes from its own directory (recursively)."""
    h = hashlib.sha256()
    seen: set[Path] = set()
    stack = [source]
    while stack:
        f = stack.pop()
        if f in seen or not f.is_file():
            continue
        seen.add(f)
        text = f.read_bytes()
        h.update(str(f.name).encode())
        h.update(text)
        for inc in _LOCAL_INCLUDE.findall(text.decode(errors="replace")):
            stack.append((f.parent / inc).resolve())
    return h.hexdigest()


def _build_kernel(
    source: Path, role: str, ct_args: list[int], defines: dict[str, str], cache: Path, plan_label: str
) -> Path:
    cxx = _cxx()
    include_digest = _emulator_include_digest()
    key = hashlib.sha256(
        json.dumps(
            [
                _kernel_digest(source),
                include_digest,
                role == "compute",
                ct_args,
                sorted(defines.items()),
                _cxx_version(cxx),
                _CXX_FLAGS,
            ]
        ).encode()
    ).hexdigest()[:24]
    out = cache / "kernels" / f"{source.stem}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    wrapper = out.with_suffix(".cpp")
    tmp = wrapper.with_name(wrapper.name + f".tmp{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(f"// emulator wrapper for {source}\n#include {json.dumps(str(source))}\nTT_EMU_DEFINE_ENTRY\n")
    os.replace(tmp, wrapper)  # concurrent builders write identical text; never a torn file
    cmd = [
        cxx,
        *_CXX_FLAGS,
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-I",
        str(INCLUDE_DIR),
        "-I",
        str(source.parent),
    ]
    if ct_args:
        cmd.append("-DKERNEL_COMPILE_TIME_ARGS=" + ",".join(str(a) for a in ct_args))
    cmd += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    cmd.append(str(wrapper))
    _compile(cmd, out, f"plan {plan_label}: {role} kernel '{source.name}'")
    return out


_include_digest_memo: list[str] = []


def _emulator_include_digest() -> str:
    if not _include_digest_memo:
        _include_digest_memo.append(_tree_digest(INCLUDE_DIR))
    return _include_digest_memo[0]
