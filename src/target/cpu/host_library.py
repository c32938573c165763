"""The compile step of ``export_library`` for a CPU config: TVM's host C and TileLang's kernels, one
object each, then one link.

TVM's default (``tvm.contrib.cc.create_shared``) hands every C source of a Relax executable to one g++
call: the host code (``lib0.c``, often 0.5 MB), one source per Tessera kernel and the packed imports
(``devc.c``). Each kernel source parses TileLang's C prelude again (~90% of its compile), nothing is
reused between builds of the same model, and one g++ process works alone. :func:`build_host_library`
instead compiles the sources into objects in parallel: each big kernel alone, the small kernels
several to an object (:func:`_translation_units`: g++ starting and loading the prelude was most of a
small kernel's compile), TVM's host C in one piece per core where it is big (:func:`_host_parts`); kernel sources get the
precompiled prelude (:func:`.build.precompiled_prelude`, their absolute include of it spelt as the
``<tl_templates/...>`` include g++ looks up next to the ``.gch``); each object is kept in the kernel
cache (``objects/``) under the SHA-256 of its source, its command line and the toolchain (GCC, flags,
this CPU's macros, TileLang's and Tessera's headers), with its own SHA-256 checked before it is
linked; a damaged or missing object is compiled again. Without a cache (TESSERA_DISABLE_CACHE) the
objects are compiled in the export's workspace.

The executable's packed imports (its bytecode and constants: a model's weights) are not C at all:
:func:`pack_imports` assembles their bytes into an object (``.incbin``) instead of TVM's ``devc.c``,
a hex C array that g++ took 84 s to parse for ResNet-18 (235 MB of source for 47 MB of weights).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ...errors import TesseraError, ToolchainError
from ..toolchain import require_tool, run_tool, sha256_file, write_text_atomic
from .build import (
    PRELUDE,
    PRELUDE_INCLUDE,
    RUNTIME_LINKED,
    _checksum_of,
    _prelude_identity,
    cpu_build_command,
    precompiled_prelude,
    recorded_sha256,
    runtime_headers,
    runtime_objects,
)

__all__ = ["build_host_library", "pack_imports"]

#: TileLang's C codegen includes the prelude by absolute path; g++ only finds a precompiled header
#: for an include searched through -I, so kernel sources are compiled with this line rewritten.
_ABSOLUTE_PRELUDE = re.compile(rf'^#include "[^"\n]*/{re.escape(PRELUDE)}"$', re.M)
_SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx")
#: Macros for TVM's host C only: they rename words TileLang's prelude uses (``half``), so a kernel
#: source compiled with them could not use the precompiled prelude (GCC rejects it when a macro
#: it saw is defined differently).
_HOST_ONLY_MACROS = ("-Dhalf=",)


#: ``TESSERA_HOST_C_OPT=-O<n>``: the optimisation level of TVM's host C (the operators left to TVM, the
#: argument checks and the calls into the kernels) in place of the config's. Unset (users, the
#: benchmarks): the config's flags, -O3. The test suite sets -O0 (tests/conftest.py): the values are
#: the same (ISO C++ mode contracts no multiply-add and nothing is reassociated at any level), and
#: TVM's host C was most of a model build's g++ time (-O3: 9.2 s for half the torch-import cases
#: model's 7.7 MB; -O0: 2.6 s). The kernels keep the config's flags.
HOST_OPT_ENV = "TESSERA_HOST_C_OPT"


def host_optimization() -> list[str]:
    """The flag :data:`HOST_OPT_ENV` asks for, checked, or nothing."""
    value = os.environ.get(HOST_OPT_ENV, "").strip()
    if not value:
        return []
    if not re.fullmatch(r"-O[0-3s]|-Og", value):
        raise TesseraError(f"{HOST_OPT_ENV}={value!r}: expected an optimisation level, -O0 to -O3, -Os or -Og")
    return [value]


def build_host_library(output: str, files: Sequence[str], options: Sequence[str], flags: Sequence[str]) -> None:
    """Compile ``files`` (C/C++ sources and objects from ``export_library``) into the shared library
    ``output``. ``options`` are export_library's (the config's flags, TVM's include paths, the host
    macros), ``flags`` the config's compiler flags without ``-D`` (what the kernels are built with)."""
    from tessera_tvm.kernel_store import KernelCache, _damaged

    cxx = require_tool("g++")
    options, flags = list(options), tuple(flags)
    root = KernelCache.from_env().root
    workspace = Path(output).parent if root is None else None
    cores = os.cpu_count() or 1
    objects: list[str] = []
    pending: list[_Source] = []
    reused = 0
    runtime: set[str] = set()  # the runtime objects the kernels call into

    def cached(unit: _Source) -> Path:
        """Where ``unit``'s object is kept: under its key in the cache, or in the workspace."""
        key = _object_key(cxx, flags, unit.command, unit.source)
        return (
            workspace / f"{unit.stem}.{key[:12]}.o" if root is None else Path(root) / "objects" / key[:2] / f"{key}.o"
        )

    for name in files:
        path = Path(name)
        if path.suffix not in _SOURCE_SUFFIXES:
            objects.append(str(path))
            continue
        source = path.read_text(encoding="utf-8", errors="surrogateescape")
        kernel = bool(_ABSOLUTE_PRELUDE.search(source))
        if kernel:
            source = _ABSOLUTE_PRELUDE.sub(PRELUDE_INCLUDE, source)
            kernel_options = [o for o in options if not o.startswith(_HOST_ONLY_MACROS)]
            command = _kernel_command(cxx, flags, kernel_options)
            linked = runtime_objects(cxx, flags, source)  # against the runtime objects' declarations
            if linked is not None:
                command += [RUNTIME_LINKED]
                runtime.update(map(str, linked))
        else:
            command = [cxx, "-fPIC", *options, *host_optimization()]
        # g++ reads .c as C++ too; say so, the source may move to a .cc file
        unit = _Source((*command, "-x", "c++"), source, path.suffix, path.stem)
        parts = None if kernel else _host_parts(source, cores)
        if parts is not None:  # TVM's host C, in pieces compiled side by side
            pending.extend(_Source(unit.command, part, unit.suffix, f"{path.stem}.{i}") for i, part in enumerate(parts))
            continue
        alone = cached(unit)
        if root is not None and _intact(alone):  # compiled alone before (by this model or another)
            objects.append(str(alone))
            reused += 1
            continue
        if root is not None and alone.exists():
            _damaged(alone, "its SHA-256 does not match")
            alone.unlink()  # it may be compiled with others now, not rewritten: removed with its SHA-256
            _checksum_of(alone).unlink(missing_ok=True)
        pending.append(unit)
    jobs = []
    for members in _translation_units(pending, cores):
        unit = _together(members)
        target = cached(unit)
        if root is not None and _intact(target):
            objects.append(str(target))
            reused += 1
            continue
        if root is not None and target.exists():
            _damaged(target, "its SHA-256 does not match")
        jobs.append((unit, members, target))
    if jobs:
        staging = workspace if root is None else Path(root) / "objects"
        workers = min(len(jobs), cores)
        progress = _Progress(Path(output).name, len(jobs), reused, workers)
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            futures = [pool.submit(_compile_unit, *job, staging, cached) for job in jobs]
            for future in concurrent.futures.as_completed(futures):
                # the first failure raises (a ToolchainError naming the command)
                objects.extend(map(str, future.result()))
                progress.step()
        progress.finish()
    run_tool([cxx, "-shared", "-fPIC", "-o", output, *objects, *sorted(runtime), *options], timeout=600)


#: Kernel sources up to this size are compiled together, several to a translation unit (see
#: :func:`_translation_units`); a bigger one (an attention kernel: ~6 KB, 0.8 s of g++) alone, so
#: that its object is reused by any model that has it.
TOGETHER_MAX_BYTES = 4096
#: Sources per translation unit at least, before a group is split between the compile workers.
TOGETHER_PER_UNIT = 8
#: A preprocessor directive other than the ``extern "C"`` guards of TileLang's declarations.
_DIRECTIVE = re.compile(r"^[ \t]*#(?!ifdef __cplusplus$|endif$)", re.M)


@dataclasses.dataclass(frozen=True)
class _Source:
    """One translation unit: its g++ command (without ``-c -o``), text, file suffix and a name."""

    command: tuple[str, ...]
    source: str
    suffix: str
    stem: str


def _translation_units(pending: list[_Source], workers: int) -> list[list[_Source]]:
    """``pending`` sources as the lists compiled together, one translation unit each.

    A small kernel's object was mostly g++ starting and loading the 70 MB precompiled prelude: 63
    kernels of one model took 7.3 s one by one and 0.7 s as two files. Kernel sources are compiled
    together where that means exactly what compiling each alone would: the same command and the
    same preamble (every line before the first declaration: the prelude and runtime includes, the
    pragmas), and no directive after it (a ``#define`` or ``#pragma`` could not leak into the next
    source; two sources defining one name make g++ fail, and :func:`_compile_unit` then compiles
    them alone). Each group is split round-robin (by key order, so a second build forms the same
    units) between up to ``workers`` units of at least :data:`TOGETHER_PER_UNIT` sources. TVM's
    host C and big kernels stay alone."""
    units: list[list[_Source]] = []
    groups: dict[tuple[tuple[str, ...], str], list[_Source]] = {}
    for unit in pending:
        split = _preamble(unit.source) if len(unit.source) <= TOGETHER_MAX_BYTES else None
        if split is None or PRELUDE_INCLUDE not in split[0]:
            units.append([unit])
        else:
            groups.setdefault((unit.command, split[0]), []).append(unit)
    for members in groups.values():
        members.sort(key=lambda m: hashlib.sha256(m.source.encode("utf-8", "surrogateescape")).digest())
        count = max(1, min(workers, len(members) // TOGETHER_PER_UNIT))
        units.extend(members[i::count] for i in range(count))
    return units


def _preamble(source: str) -> tuple[str, str] | None:
    """``source`` as (its preamble, the rest), or None where a directive follows the preamble."""
    lines = source.splitlines(keepends=True)
    end = 0
    while end < len(lines):
        line = lines[end]
        if line.startswith("#ifdef __cplusplus") or not (line.startswith(("#", "//")) or not line.strip()):
            break
        end += 1
    body = "".join(lines[end:])
    if _DIRECTIVE.search(body) or re.search(r"^static\b", body, re.M):
        return None
    return "".join(lines[:end]), body


def _together(members: list[_Source]) -> _Source:
    """One translation unit of ``members`` (one preamble, then each body), or the one member."""
    if len(members) == 1:
        return members[0]
    preamble, _ = _preamble(members[0].source)
    bodies = [f"// ---- {m.stem}\n{_preamble(m.source)[1]}" for m in members]
    return _Source(
        members[0].command, preamble + "\n".join(bodies), members[0].suffix, f"{members[0].stem}+{len(members) - 1}"
    )


#: TVM's host C is compiled in pieces of at least this many bytes, one per core at most: it is the
#: longest compile of a model (the packed wrapper of every PrimFunc, with its argument checks, and the
#: ops left to TVM: 15 s of g++ for a 6.9 MB source) and a single g++ process otherwise.
HOST_PART_BYTES = 128 * 1024
#: A function TVM's C host codegen defines: its packed wrapper, closed by a ``}`` alone on a line.
_HOST_FUNCTION = re.compile(r"^TVM_DLL int32_t __tvm_ffi_\w+\(.*\) \{$")
#: The one variable TVM's host C defines; every other piece declares it.
_LIBRARY_CTX = "void* __tvm_ffi__library_ctx = NULL;"
#: The lines before each definition (C linkage when compiled as C++).
_C_LINKAGE = ("#ifdef __cplusplus", 'extern "C"', "#endif")


def _guarded(lines: list[str], definition: int) -> bool:
    """Whether the lines before ``lines[definition]`` are :data:`_C_LINKAGE`."""
    before = lines[max(0, definition - len(_C_LINKAGE)) : definition]
    return [line.rstrip("\n") for line in before] == list(_C_LINKAGE)


def _host_parts(source: str, workers: int) -> list[str] | None:
    """TVM's host C ``source`` as up to ``workers`` sources that together define what it does, or
    None to compile it whole (small, or not laid out as expected).

    The layout relied on, checked line by line: a preamble (includes, the definition of
    ``__tvm_ffi__library_ctx``, ``static`` caches of looked-up functions, declarations), then only
    function definitions, each opened by ``TVM_DLL int32_t __tvm_ffi_<name>(...) {`` (after the
    ``extern "C"`` lines of :data:`_C_LINKAGE`, or not) and closed by ``}`` on a line of its own,
    and blank lines. Each piece gets the whole preamble (its own caches,
    filled on first use) and a share of the definitions, balanced by size; all but the first declare
    the context variable instead of defining it."""
    count = min(workers, len(source) // HOST_PART_BYTES)
    if count < 2:
        return None
    lines = source.splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines) if _HOST_FUNCTION.match(line)), None)
    if first is None:
        return None
    first -= len(_C_LINKAGE) if _guarded(lines, first) else 0
    if sum(line.rstrip("\n") == _LIBRARY_CTX for line in lines[:first]) != 1:
        return None
    functions, i = [], first
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        start = i
        i += len(_C_LINKAGE) if _guarded(lines, i + len(_C_LINKAGE)) and lines[i].startswith("#ifdef") else 0
        if not _HOST_FUNCTION.match(lines[i]):
            return None
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip("\n") == "}"), None)
        if end is None:
            return None
        functions.append("".join(lines[start : end + 1]))
        i = end + 1
    if len(functions) < count:
        return None
    shares: list[list[str]] = [[] for _ in range(count)]
    sizes = [0] * count
    for function in sorted(functions, key=len, reverse=True):
        smallest = sizes.index(min(sizes))
        shares[smallest].append(function)
        sizes[smallest] += len(function)
    preamble = "".join(lines[:first])
    declared = preamble.replace(_LIBRARY_CTX, "extern void* __tvm_ffi__library_ctx;", 1)
    return [(preamble if n == 0 else declared) + "\n".join(share) for n, share in enumerate(shares)]


class _Progress:
    """What a build is compiling, on stderr (TESSERA_PROGRESS=0: nothing): a line when it starts and
    one when it is done; on a terminal, a count rewritten in place between them."""

    def __init__(self, library: str, total: int, reused: int, workers: int) -> None:
        self.enabled = os.environ.get("TESSERA_PROGRESS", "1") != "0"
        self.stream = sys.stderr
        self.tty = self.enabled and self.stream.isatty()
        self.total, self.done, self.began = total, 0, time.perf_counter()
        reuse = f"; {reused} reused from the kernel cache" if reused else ""
        self._write(f"tessera: compiling {total} object(s) of {library} with g++, {workers} at a time{reuse}\n")

    def step(self) -> None:
        self.done += 1
        if self.tty:
            self._write(f"\rtessera: {self.done}/{self.total} compiled")

    def finish(self) -> None:
        took = time.perf_counter() - self.began
        self._write(f"{chr(13) if self.tty else ''}tessera: {self.total} object(s) compiled in {took:.1f} s\n")

    def _write(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text)
            self.stream.flush()


#: The symbol TVM's loader reads the packed imports (the VM executable: bytecode and constants) from.
LIBRARY_BIN = "__tvm_ffi__library_bin"


def pack_imports(module, is_system_lib: bool, prefix: str, workspace_dir: str) -> str:
    """``export_library``'s ``fpack_imports`` for a CPU config: the module's imports (a Relax VM
    executable, its weights included) as an object assembled from their bytes with ``.incbin``.
    TVM's own packing (without LLVM) writes them as a C array in hex, ``devc.c``, which g++ parses:
    ResNet-18's 47 MB of weights made a 235 MB source and 84 of a 107 s build. A system library (not
    what Tessera exports) keeps TVM's packing."""
    from tessera_tvm._tvm import tvm

    workspace = Path(workspace_dir)
    if is_system_lib or prefix:
        path = workspace / f"{prefix}devc.c"
        path.write_text(tvm.get_global_func("runtime.ModulePackImportsToC")(module, is_system_lib, prefix))
        return str(path)
    blob = workspace / "imports.bin"
    tvm.get_global_func("runtime.ModulePackImportsToTensor")(module).numpy().tofile(blob)
    quoted = str(blob.resolve()).replace("\\", "\\\\").replace('"', '\\"')
    assembly = workspace / "imports.S"
    assembly.write_text(
        "\n".join(
            [
                '    .section .rodata.tessera_imports,"a"',
                f"    .globl {LIBRARY_BIN}",
                f"    .type {LIBRARY_BIN}, @object",
                "    .balign 16",
                f"{LIBRARY_BIN}:",
                f'    .incbin "{quoted}"',
                f"    .size {LIBRARY_BIN}, . - {LIBRARY_BIN}",
                '    .section .note.GNU-stack,"",@progbits',
                "",
            ]
        )
    )
    obj = workspace / "imports.o"
    run_tool([require_tool("g++"), "-c", "-o", str(obj), str(assembly)], timeout=600)
    return str(obj)


def _kernel_command(cxx: str, flags: tuple[str, ...], options: list[str]) -> list[str]:
    """How compile_cpu builds a kernel (its options, the precompiled prelude's directory first),
    with export_library's extra options after them."""
    command = cpu_build_command(cxx, flags, "", "", precompiled_prelude(cxx, flags))[:-3]  # no -o/file
    extra = [o for o in options if o not in command]
    return [*command, *extra]


def _object_key(cxx: str, flags: tuple[str, ...], command: list[str], source: str) -> str:
    digest = hashlib.sha256()
    for part in (_toolchain_identity(cxx, flags), *command, source):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()[:32]


@functools.cache
def _toolchain_identity(cxx: str, flags: tuple[str, ...]) -> str:
    """GCC, the flags, this CPU's macros and TileLang's headers (the prelude's identity), Tessera's
    runtime headers and TVM's version (its headers, which the host code includes)."""
    from tessera_tvm._tvm import tvm

    digest = hashlib.sha256(f"{_prelude_identity(cxx, flags)}\0{cxx}\0{tvm.__version__}".encode())
    digest.update(runtime_headers())
    return digest.hexdigest()


def _intact(obj: Path) -> bool:
    recorded = recorded_sha256(obj)
    return recorded is not None and obj.is_file() and sha256_file(obj) == recorded


def _compile_unit(unit: _Source, members: list[_Source], target: Path, staging: Path, cached) -> list[Path]:
    """Compile ``unit`` into ``target`` and return the objects to link: ``[target]``, or, where g++
    rejects sources it was given together (two that define one name), each member compiled alone, so
    that an error names the one source that has it."""
    if len(members) == 1:
        _compile(unit, target, staging)
        return [target]
    try:
        _compile(unit, target, staging)
        return [target]
    except ToolchainError:
        alone = [cached(m) for m in members]
        for member, path in zip(members, alone, strict=True):
            _compile(member, path, staging)
        return alone


def _compile(unit: _Source, target: Path, staging: Path) -> None:
    """Compile ``unit`` into ``target`` (written whole or not at all, its SHA-256 beside it), in a
    directory under ``staging`` that this process holds: the cache's stale-file cleanup removes it
    if the process dies mid-compile.

    The SHA-256 is written before the object is moved into place: another process that builds a
    model with the same kernel (two xdist workers did) and finds the object there without its
    SHA-256 takes it for damaged and removes it, and this process's link then failed with "cannot
    find ... .o". The same source and command give the same bytes, so two processes that compile
    it at once write the same SHA-256."""
    from tessera_tvm.kernel_store import held_directory

    staging.mkdir(parents=True, exist_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    with held_directory(staging, f".{target.stem[:12]}.") as work:
        src, obj = work / f"source{unit.suffix}", work / "object.o"
        src.write_text(unit.source, encoding="utf-8", errors="surrogateescape")
        run_tool([*unit.command, "-c", "-o", str(obj), str(src)], timeout=600)
        write_text_atomic(_checksum_of(target), sha256_file(obj) + "\n")
        os.replace(obj, target)
