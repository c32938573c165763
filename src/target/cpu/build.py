"""The CPU toolchain driver: TileLang C source -> a shared library, built with g++.

TileLang's TVM has no LLVM backend, so the CPU path is target ``c``: TileLang emits C++ such as

    extern "C" int32_t main_kernel(float* A, float* B, float* C, int32_t M);

(parameters in the PrimFunc's order, symbolic dims as trailing integer scalars, 0 on success), which
:func:`compile_cpu` builds with ``g++ -std=c++17 -shared -fPIC -O3 -march=native`` (without ``-O`` the
code runs ~60x slower), with TileLang's C prelude precompiled once per flag set
(:func:`precompiled_prelude`). Loading and calling the library is :mod:`.loader`'s part.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

from ...errors import TesseraError
from ..toolchain import (
    BuildOptionError,
    atomic_output_dir,
    file_lock,
    require_tool,
    run_tool,
    sha256_file,
    tilelang_include_dirs,
    untouched_on_failure,
    validate_artifact_name,
    write_text_atomic,
)

__all__ = [
    "DEFAULT_CPU_FLAGS",
    "aligned_local_arrays",
    "build_identity",
    "PRELUDE",
    "SPEC_KERNEL_PRAGMAS",
    "PRELUDE_INCLUDE",
    "RUNTIME_INCLUDE_DIR",
    "compile_cpu",
    "cpu_build_command",
    "instruction_sets",
    "isa_identity",
    "precompiled_prelude",
    "runtime_link",
    "runtime_mode",
    "runtime_object",
    "runtime_objects",
    "runtime_parts",
    "with_spec_pragmas",
]

#: The flags of configs/cpu.yaml (which says why -fno-tree-loop-if-convert, -fno-strict-aliasing and
#: -fno-math-errno).
DEFAULT_CPU_FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fno-tree-loop-if-convert",
    "-fno-strict-aliasing",
    "-fno-math-errno",
)

#: First in the C source of every kernel Tessera builds from its own specs (build_tile_program):
#: loop if-conversion back on, which the CPU flags turn off for everything else (GCC 12.2 miscompiles
#: selects over byte masks with it; these kernels read none, and need it to vectorise).
SPEC_KERNEL_PRAGMAS = (
    "#if defined(__GNUC__) && !defined(__clang__)",
    '#pragma GCC optimize("tree-loop-if-convert")',
    "#endif",
)

#: Tessera's CPU runtime headers (``#include <tessera/cpu.h>``: the grid's parallel region, the GEMM
#: micro-kernel), shipped as package data of ``tessera_tvm.target`` (src/target/include).
RUNTIME_INCLUDE_DIR = Path(__file__).resolve().parent.parent / "include"


# ---------------------------------------------------------------------------------------------- build


def compile_cpu(
    source: str,
    *,
    out_dir: str | os.PathLike[str],
    name: str,
    flags: Sequence[str] = DEFAULT_CPU_FLAGS,
    timeout: float = 600,
    link_runtime: bool = False,
) -> Path:
    """Build C/C++ ``source`` into ``out_dir/<name>.so`` (source kept as ``<name>.cpp``); return the .so.

    Runs ``g++ -std=c++17 -shared -fPIC <flags> -I<tessera>/include -I<tilelang>/src`` (``TESSERA_CXX``
    picks another compiler), with TileLang's prelude precompiled where it can (:func:`precompiled_prelude`).
    ``link_runtime``: ``source`` is a kernel Tessera generated, which calls tessera/cpu.h's entries only
    through cpu_api.h's declarations; with ``TESSERA_CPU_RUNTIME=linked`` they are linked from the
    runtime objects (:func:`runtime_link`) rather than compiled with it. Other sources (one's own,
    using the headers' macros and helpers) always see the whole header.
    Both files appear together only on success; a failing compile raises :class:`ToolchainError` with
    the command and the compiler's first errors, and leaves ``out_dir`` as it was.
    """
    validate_artifact_name(name)
    if isinstance(flags, str):
        raise BuildOptionError(f"flags must be a sequence of strings, e.g. ({flags!r},), not a string")
    cxx = require_tool("g++")
    flags = tuple(map(str, flags))
    cpp, so = f"{name}.cpp", f"{name}.so"
    prelude = precompiled_prelude(cxx, flags) if PRELUDE_INCLUDE in source else None
    command = cpu_build_command(cxx, flags, so, cpp, prelude) + (
        runtime_link(cxx, flags, source) if link_runtime else []
    )
    final_dir = Path(out_dir).absolute()
    with untouched_on_failure(final_dir), atomic_output_dir(final_dir) as staging:
        (staging / cpp).write_text(source, encoding="utf-8")
        run_tool(command, cwd=staging, timeout=timeout)  # relative names: errors read "gemm.cpp:12: error"
    return final_dir / so


#: Options of every CPU compile. The precompiled prelude is built with the same ones (GCC ignores
#: a prelude built with others), so they are spelled once; ``-shared`` only matters when linking.
_COMPILE_OPTIONS = ("-std=c++17", "-shared", "-fPIC")


def cpu_build_command(cxx: str, flags: Sequence[str], so: str, cpp: str, prelude: Path | None = None) -> list[str]:
    """The g++ command line that builds ``cpp`` into ``so``; ``prelude``: a directory from
    :func:`precompiled_prelude`, searched first so that g++ finds the precompiled header there."""
    return [cxx, *_COMPILE_OPTIONS, *flags, *kernel_includes(prelude), "-o", so, cpp]


def kernel_includes(prelude: Path | None = None) -> list[str]:
    """The ``-I`` options a kernel source needs (tessera/cpu.h, tl_templates), ``prelude``'s directory
    (:func:`precompiled_prelude`) first when given, so that g++ finds the precompiled header there."""
    includes = [f"-I{RUNTIME_INCLUDE_DIR}", f"-I{tilelang_include_dirs()[0]}"]
    return includes if prelude is None else [f"-I{prelude}", *includes]


#: A local array as TVM's C codegen declares it: ``  float acc[3136];`` (type, name, constant size).
_LOCAL_ARRAY = re.compile(
    r"^(\s+)(?!(?:return|case|goto|throw|delete|else|do)\b)((?:unsigned )?[A-Za-z_][A-Za-z0-9_]*) "
    r"([A-Za-z_][A-Za-z0-9_]*)\[(\d+)\];$",
    re.M,
)


def aligned_local_arrays(source: str) -> str:
    """``source`` with every local array declared 64-byte aligned.

    GCC 12.2 (-O3 -march=native -fopenmp) vectorises a loop over a local array of a parallel
    region's outlined function with aligned 32-byte stores (``vmovaps``), as if the array were
    32-byte aligned, but lays the array out 16-byte aligned in the frame: a depthwise convolution
    whose plane of accumulators rows were 56 floats crashed with SIGSEGV on the store of each row's
    tail. Declaring the alignment makes the layout match the vectoriser's assumption. A source
    without a parallel region (tessera.LowerParallelGrid) is returned as it is."""
    if "TESSERA_PARALLEL_BEGIN(" not in source:
        return source
    return _LOCAL_ARRAY.sub(r"\1\2 \3[\4] __attribute__((aligned(64)));", source)


def with_spec_pragmas(source: str) -> str:
    """``source`` with :data:`SPEC_KERNEL_PRAGMAS` just after TileLang's prelude include (so that a
    precompiled prelude, built without them, is still used), or first when it has none."""
    pragmas = "\n".join(SPEC_KERNEL_PRAGMAS)
    if PRELUDE_INCLUDE in source:
        return source.replace(PRELUDE_INCLUDE, f"{PRELUDE_INCLUDE}\n{pragmas}", 1)
    return f"{pragmas}\n{source}"


# ---------------------------------------------------------------------------------------------- prelude

#: TileLang's C prelude, included first by every CPU source its codegen writes. Parsing it (half.hpp
#: and the C++ library headers behind it) takes ~90% of a kernel's g++ time: ~0.65 of ~0.7 s here.
PRELUDE = "tl_templates/cpp/common.h"
PRELUDE_INCLUDE = f"#include <{PRELUDE}>"


def precompiled_prelude(cxx: str, flags: Sequence[str]) -> Path | None:
    """A directory holding :data:`PRELUDE` precompiled by GCC for ``flags`` (``<dir>/<PRELUDE>.gch``),
    built once and kept in the kernel cache (``$TESSERA_CACHE_DIR/pch/``, or ``$TESSERA_PCH_DIR`` where
    set, ~70 MB per flag set, also with the kernel cache off); None when the cache is off and no
    ``TESSERA_PCH_DIR`` is set, the compiler is not GCC or the header does not build.

    GCC reads ``common.h.gch`` in place of ``common.h`` when it sits in an include directory searched
    first and was built with the same options, and ignores it otherwise; kernels build ~4x faster. A
    damaged file would crash GCC, so its SHA-256 is checked (once per process) and a mismatch rebuilds it.
    """
    from tessera_tvm.kernel_store import KernelCache, cache_unusable, prelude_dir

    pch = prelude_dir(KernelCache.from_env().root)
    flags = tuple(flags)
    identity = _prelude_identity(cxx, flags)
    if pch is None or identity is None:
        return None
    directory = pch / identity
    gch = directory / f"{PRELUDE}.gch"
    if _prelude_intact(gch):
        return directory
    try:
        with file_lock(pch / f"{identity}.lock"):  # one process builds it, the others wait
            if not _prelude_intact(gch):
                _build_prelude(cxx, flags, gch)
    except OSError as exc:  # a read-only or full cache: build without it
        cache_unusable(pch, exc)
        return None
    except TesseraError:  # flags the header rejects: build without it
        return None
    return directory


_intact_preludes: dict[Path, tuple[int, int, int]] = {}


def _checksum_of(path: Path) -> Path:
    """The file holding ``path``'s SHA-256, next to it."""
    return path.with_name(path.name + ".sha256")


def recorded_sha256(path: Path) -> str | None:
    """The SHA-256 recorded next to ``path`` (:func:`_checksum_of`), or None when it is missing or is
    not one (damaged: any bytes at all)."""
    try:
        recorded = _checksum_of(path).read_bytes().strip()
    except OSError:
        return None
    return recorded.decode() if re.fullmatch(rb"[0-9a-f]{64}", recorded) else None


def _prelude_intact(gch: Path) -> bool:
    """Whether ``gch`` (a precompiled prelude or a runtime object) matches the SHA-256 recorded next to
    it (hashed once per process per file)."""
    try:
        st = gch.stat()
    except OSError:
        return False
    recorded = recorded_sha256(gch)
    if recorded is None:  # missing or damaged: rebuilt
        return False
    identity = (st.st_ino, st.st_mtime_ns, st.st_size)
    if _intact_preludes.get(gch) == identity:
        return True
    if sha256_file(gch) != recorded:
        return False
    _intact_preludes[gch] = identity
    return True


def _build_prelude(cxx: str, flags: tuple[str, ...], gch: Path) -> None:
    """Precompile :data:`PRELUDE` into ``gch``, then record its SHA-256 (readers wait for both)."""
    header = Path(tilelang_include_dirs()[0]) / PRELUDE
    _compile_checked([cxx, *_COMPILE_OPTIONS, *flags, "-x", "c++-header", str(header)], gch)


def _compile_checked(command: list[str], out: Path) -> None:
    """Run the compiler ``command`` with ``-o`` a staging file beside ``out``, move the result to ``out``,
    then record its SHA-256 next to it (:func:`_prelude_intact` accepts neither file without the other)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _checksum_of(out).unlink(missing_ok=True)
    staging = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        run_tool([*command, "-o", str(staging)], timeout=600)
        digest = sha256_file(staging)
        os.replace(staging, out)
    finally:
        staging.unlink(missing_ok=True)
    write_text_atomic(_checksum_of(out), digest + "\n")


# ---------------------------------------------------------------------------------------------- runtime

#: The include ImportCpuRuntime gives a kernel that calls into Tessera's CPU runtime.
RUNTIME_INCLUDE = "#include <tessera/cpu.h>"
#: A kernel compiled with this macro sees cpu_api.h's declarations instead of the runtime's definitions.
RUNTIME_LINKED = "-DTESSERA_CPU_RUNTIME_LINKED"

#: The runtime objects: the header each compiles (its entries, and those of the headers it includes,
#: emitted out of line and merged at the link where two objects hold one), and which of the
#: ``tessera_cpu_*`` entries a kernel calls need it. On one core: gemm ~2 s, int8 ~1 s, conv and
#: winograd ~4.5 s each, so a transformer's first build compiles only the first.
RUNTIME_PARTS = {
    "winograd": ("cpu_winograd.h", re.compile(r"winograd")),
    "conv": ("cpu_conv.h", re.compile(r"conv|depthwise")),
    "int8": ("cpu_int8.h", re.compile(r"s8x4")),
    "gemm": ("cpu_gemm.h", re.compile(r"")),  # packing, the fp32 and bf16 GEMMs, AMX, the workspace
}
_RUNTIME_CALL = re.compile(r"\btessera_cpu_(\w+)\s*\(")


def runtime_parts(source: str) -> list[str]:
    """The runtime objects (:data:`RUNTIME_PARTS`) whose entries the kernel ``source`` calls, sorted."""
    names = set(_RUNTIME_CALL.findall(source))
    return sorted({next(part for part, (_, calls) in RUNTIME_PARTS.items() if calls.search(n)) for n in names})


#: ``TESSERA_CPU_RUNTIME=linked``: kernels link the runtime objects (:func:`runtime_link`) instead of
#: compiling the entries they call; ``inline`` (the default) compiles them into each kernel. Linked,
#: a GEMM kernel's g++ takes ~0.15 s instead of ~0.45 s, but an f32 GEMM of few rows runs 2-7% slower
#: (64x768x768 on 2 threads, interleaved in one process; sizes of 128 rows and more within noise): the
#: inlined entry sees the kernel's constant sizes. The test suite links (tests/conftest.py). Part of a
#: CPU kernel's cache key (:func:`build_identity`).
RUNTIME_ENV = "TESSERA_CPU_RUNTIME"


def runtime_mode() -> str:
    """``"inline"`` or ``"linked"``: how kernels get the runtime entries (:data:`RUNTIME_ENV`)."""
    value = os.environ.get(RUNTIME_ENV, "").strip() or "inline"
    if value not in ("inline", "linked"):
        raise TesseraError(f"{RUNTIME_ENV}={value!r}: expected 'inline' (the default) or 'linked'")
    return value


def build_identity(flags: Sequence[str], compiler: str = "g++") -> str:
    """What a CPU kernel's library depends on beyond its source and flags, for its cache key: the
    instruction sets (:func:`isa_identity`) and, where kernels link them, the runtime objects."""
    identity = isa_identity(flags, compiler)
    return identity if runtime_mode() == "inline" else f"{identity}+runtime-linked"


def runtime_objects(cxx: str, flags: Sequence[str], source: str) -> list[Path] | None:
    """The runtime objects (:func:`runtime_object`) the kernel ``source`` links, compiled with
    :data:`RUNTIME_LINKED` (``[]`` when it calls none of their entries). None where kernels compile the
    entries inline (:func:`runtime_mode`), for a source that does not include tessera/cpu.h, or where
    an object cannot be had: then the kernel compiles the entries itself, as a source of one's own does."""
    if runtime_mode() != "linked" or RUNTIME_INCLUDE not in source:
        return None
    objects = [runtime_object(cxx, tuple(flags), part) for part in runtime_parts(source)]
    return None if None in objects else objects


def runtime_link(cxx: str, flags: Sequence[str], source: str) -> list[str]:
    """What a g++ command that builds the kernel ``source`` into a library adds to link the runtime
    objects it calls (:func:`runtime_objects`): the macro, the objects and ``--gc-sections`` (only the
    entries the kernel calls stay); nothing where it compiles the entries itself."""
    objects = runtime_objects(cxx, flags, source)
    if objects is None:
        return []
    return [RUNTIME_LINKED, *map(str, objects), *(["-Wl,--gc-sections"] if objects else [])]


def runtime_object(cxx: str, flags: Sequence[str], part: str) -> Path | None:
    """One of the runtime objects (:data:`RUNTIME_PARTS`): a header's entries compiled out of line for
    ``flags``, hidden in whatever links them; None where it cannot be had (no cache and no
    ``TESSERA_PCH_DIR``, a compiler that is not GCC, flags it rejects).

    Compiled inline, these entries were most of a kernel's g++ time: a GEMM kernel took ~0.45 s where
    it takes ~0.15 s against their declarations. Each object is built once per flag set, the first time
    a kernel calls into it, and kept beside the precompiled prelude (``<pch>/runtime-<identity>/``),
    its SHA-256 checked once per process as the prelude's is. The identity covers the prelude's (GCC,
    the flags, this CPU's macros, TileLang's headers) and Tessera's runtime headers.
    """
    from tessera_tvm.kernel_store import KernelCache, cache_unusable, prelude_dir

    flags = tuple(flags)
    pch = prelude_dir(KernelCache.from_env().root)
    identity = _runtime_identity(cxx, flags)
    prelude = precompiled_prelude(cxx, flags) if pch is not None and identity is not None else None
    if prelude is None:
        return None
    obj = pch / f"runtime-{identity}" / f"tessera_cpu_{part}.o"
    if _prelude_intact(obj):
        return obj
    try:
        with file_lock(pch / f"runtime-{identity}-{part}.lock"):  # one process builds it, the others wait
            if not _prelude_intact(obj):
                _build_runtime_object(cxx, flags, prelude, RUNTIME_PARTS[part][0], obj)
    except OSError as exc:  # a read-only or full cache: kernels compile the entries inline
        cache_unusable(pch, exc)
        return None
    return obj


def _runtime_source(header: str) -> str:
    """The translation unit of the runtime object of ``header``: TileLang's prelude first (cpu_gemm.h
    reads its ``half``), the declarations, then the definitions (a mismatch fails the compile)."""
    pragmas = "\n".join(SPEC_KERNEL_PRAGMAS)
    return (
        f"{PRELUDE_INCLUDE}\n{pragmas}\n#define TESSERA_CPU_RUNTIME_BUILD 1\n#include <tessera/cpu_api.h>\n"
        f"#include <tessera/{header}>\n"
    )


def _build_runtime_object(cxx: str, flags: tuple[str, ...], prelude: Path, header: str, obj: Path) -> None:
    """Compile ``header``'s runtime object into ``obj``, then record its SHA-256 (readers check both)."""
    obj.parent.mkdir(parents=True, exist_ok=True)
    source = obj.with_name(f".{obj.stem}.{os.getpid()}.cc")
    try:
        source.write_text(_runtime_source(header), encoding="utf-8")
        command = [cxx, *_COMPILE_OPTIONS, *flags, "-fvisibility=hidden", "-ffunction-sections"]
        _compile_checked([*command, *kernel_includes(prelude), "-c", str(source)], obj)
    finally:
        source.unlink(missing_ok=True)


@functools.cache
def _runtime_identity(cxx: str, flags: tuple[str, ...]) -> str | None:
    """The prelude's identity (:func:`_prelude_identity`) and Tessera's runtime headers, hashed."""
    prelude = _prelude_identity(cxx, flags)
    if prelude is None:
        return None
    digest = hashlib.sha256(f"{prelude}\0{_runtime_source('')}".encode())
    digest.update(runtime_headers())
    return digest.hexdigest()[:24]


@functools.cache
def runtime_headers() -> bytes:
    """Tessera's runtime headers (src/target/include) as one byte string to hash: each file's name, a
    NUL and its bytes, in path order. Read once per process."""
    return b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in sorted(RUNTIME_INCLUDE_DIR.rglob("*.h")))


@functools.cache
def _predefined_macros(cxx: str, flags: tuple[str, ...]) -> str | None:
    """The macros ``cxx`` defines for ``flags`` on this machine (``g++ -E -dM``), sorted, one per line:
    with ``-march=native``, what the host's instruction sets are (``__AVX512F__``, ``__AMX_BF16__``...).
    None where the compiler cannot say (not on PATH, or it rejects the flags)."""
    try:
        macros = run_tool([cxx, *_COMPILE_OPTIONS, *flags, "-E", "-dM", "-x", "c++-header", os.devnull], timeout=60)
    except TesseraError:
        return None
    return "\n".join(sorted(macros.stdout.splitlines()))


#: The predefined macros that name an x86 or Arm instruction-set extension (matrix and vector units).
_ISA_MACRO = re.compile(r"#define __(AVX\w*|AMX\w*|FMA|F16C|SSE\w*|ARM_FEATURE_\w*|ARM_NEON)__ ")


def instruction_sets(flags: Sequence[str], compiler: str = "g++") -> tuple[str, ...]:
    """The instruction-set extensions a kernel built with ``flags`` may use, as the compiler says
    (``-march=native``: this CPU's): ``("amx_bf16", "avx2", "avx512bf16", "avx512f", ...)``, sorted;
    () where the compiler is not found. Recorded in a CPU kernel's metadata."""
    macros = _macros_of(flags, compiler) or ""
    names = (m.group(1).lower() for line in macros.splitlines() if (m := _ISA_MACRO.match(line + " ")))
    return tuple(sorted(n for n in names if not n.endswith("_math")))  # __SSE_MATH__: how float math is done


def isa_identity(flags: Sequence[str], compiler: str = "g++") -> str:
    """A digest of every macro the compiler predefines for ``flags`` on this machine: part of a CPU
    kernel's cache key, so that ``-march=native`` code built on one CPU is never served on another
    (a shared cache directory, a copied one) that lacks its instructions. "" where it cannot say."""
    macros = _macros_of(flags, compiler)
    return "" if macros is None else hashlib.sha256(macros.encode()).hexdigest()[:24]


def _macros_of(flags: Sequence[str], compiler: str) -> str | None:
    try:
        cxx = require_tool(compiler) if compiler in ("g++", "gcc") else compiler
    except TesseraError:
        return None
    return _predefined_macros(cxx, tuple(flags))


@functools.cache
def _prelude_identity(cxx: str, flags: tuple[str, ...]) -> str | None:
    """What the precompiled prelude depends on, hashed: GCC's version, the flags, the macros they
    define on this machine (``-march=native`` differs from CPU to CPU, and GCC would ignore a prelude
    built for another one) and TileLang's C headers. None for a compiler that is not GCC (clang
    does not look for ``.gch`` files next to headers)."""
    try:
        version = run_tool([cxx, "--version"], timeout=60).output
    except TesseraError:
        return None
    macro_lines = _predefined_macros(cxx, flags)
    if "Free Software Foundation" not in version or macro_lines is None:
        return None
    digest = hashlib.sha256(f"{cxx}\0{version}\0{flags}\0{macro_lines}".encode())
    templates = Path(tilelang_include_dirs()[0]) / Path(PRELUDE).parent
    for path in sorted(templates.glob("*.h*")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:24]
