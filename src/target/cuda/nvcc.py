"""The CUDA toolchain driver: TileLang CUDA source -> ``.cu`` + ``.ptx`` + ``.cubin`` with nvcc.

Builds need nvcc but no GPU. :func:`compile_cuda` writes ``<name>.cu``, ``<name>.ptx`` and
``<name>.cubin`` into ``out_dir`` all together or not at all, and reads ptxas's resource report
(registers, static shared memory, spills) per kernel so that resource checks and kernel metadata do
not need a GPU either.

How it calls nvcc (measured with nvcc 13.0 on TileLang 0.1.15 GEMMs):

    nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -I<tilelang>/src
         -I<tilelang>/3rdparty/cutlass/include --ptx -o gemm.ptx gemm.cu          (~1.3 s)
    nvcc -O3 -gencode=arch=compute_90a,code=sm_90a --cubin --resource-usage
         -o gemm.cubin gemm.ptx                                                  (~0.1 s)

The cubin is assembled from the PTX we keep, so the C++ front end runs once, not twice; its SASS is
the same as a direct ``.cu -> .cubin`` build (only the embedded ptxas command line differs).

A portable arch (``sm_80``: no ``a``/``f`` suffix) gets a fatbin, ``<name>.fatbin``, in place of the
cubin: the SASS for that arch plus its PTX (``code=[sm_80,compute_80]``), so the driver JIT-compiles
the PTX on a newer GPU. A bare sm_80 cubin does not load on an H100 ("no kernel image is available",
seen on the first lent H100/H200, 2026-11-26). An arch-specific image (``sm_90a``) runs on that arch
alone, so it stays a plain cubin.
TileLang's headers make nvcc print ~100 lines of harmless warnings (deprecated ``longlong4``,
``__device__`` on defaulted functions): they are kept on ``CudaBuild.log``, never printed, and never
turned into errors.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..toolchain import (
    BuildOptionError,
    atomic_output_dir,
    find_tool,
    require_tool,
    run_tool,
    tilelang_include_dirs,
    untouched_on_failure,
    validate_artifact_name,
)

__all__ = [
    "CUDA_FORMATS",
    "CudaBuild",
    "compile_cuda",
    "gencode_flag",
    "nvcc_available",
    "parse_ptxas_report",
]

CUDA_FORMATS = ("cubin", "ptx")

# sm_80, sm_90a (arch-specific: wgmma/setmaxnreg), sm_100f (family-specific, CUDA 12.9+).
_ARCH = re.compile(r"sm_(\d{2,3})([af]?)")


@dataclass(frozen=True)
class CudaBuild:
    """The artifacts of one :func:`compile_cuda` call (paths are in ``out_dir``).

    ``cubin_path`` is the device image that the runtime loads: a cubin for an arch-specific target
    (``sm_90a``), a fatbin of SASS and PTX for a portable one (``sm_80``; see the module docstring).
    ``resource_usage`` maps each kernel (entry function, by its symbol name) to ptxas's report:
    ``registers`` per thread, ``shared_bytes`` of *static* shared memory (TileLang puts its tiles in
    dynamic shared memory, which ptxas cannot see and does not count), ``spill_stores`` and
    ``spill_loads`` in bytes, plus ``stack_bytes`` (stack frame) and ``barriers`` (named barriers).
    It is empty when no cubin was built.
    """

    source_path: Path
    cubin_path: Path | None
    ptx_path: Path | None
    resource_usage: dict[str, dict[str, int]]
    commands: list[list[str]]
    seconds: float
    log: str = field(default="", repr=False)  # everything nvcc/ptxas printed (warnings included)


def nvcc_available() -> bool:
    """True when nvcc can be found (``TESSERA_NVCC`` or PATH)."""
    return find_tool("nvcc") is not None


def gencode_flag(arch: str) -> str:
    """``sm_90a`` -> ``-gencode=arch=compute_90a,code=sm_90a`` (raises BuildOptionError if malformed)."""
    match = _ARCH.fullmatch(arch) if isinstance(arch, str) else None
    if match is None:
        raise BuildOptionError(
            f"CUDA arch {arch!r} is not of the form sm_<NN>[a|f], e.g. 'sm_90a' (Hopper, needed for wgmma "
            "and setmaxnreg) or 'sm_80' (Ampere)"
        )
    return f"-gencode=arch=compute_{match[1]}{match[2]},code=sm_{match[1]}{match[2]}"


def _device_image(arch: str, name: str) -> tuple[str, list[str]]:
    """The device image's file name and nvcc flags for ``arch`` (already checked by gencode_flag):
    a fatbin of SASS and PTX for a portable arch (no ``a``/``f`` suffix), so newer GPUs JIT the PTX;
    a cubin for an arch-specific one."""
    if _ARCH.fullmatch(arch)[2]:
        return f"{name}.cubin", [gencode_flag(arch), "--cubin"]
    virtual = arch.replace("sm_", "compute_")
    return f"{name}.fatbin", [f"-gencode=arch={virtual},code=[{arch},{virtual}]", "--fatbin"]


def compile_cuda(
    source: str,
    *,
    arch: str,
    out_dir: str | os.PathLike[str],
    name: str,
    formats: Iterable[str] = CUDA_FORMATS,
    extra_flags: Sequence[str] = (),
    timeout: float = 600,
) -> CudaBuild:
    """Compile CUDA ``source`` for ``arch`` with nvcc into ``out_dir``; return paths and ptxas's report.

    ``formats`` is any non-empty subset of ``("cubin", "ptx")``. ``extra_flags`` are passed to every
    nvcc call (e.g. ``-lineinfo``, ``-DNDEBUG``, ``-Xptxas=-O3``). Writes ``<name>.cu`` and the
    requested ``<name>.cubin`` / ``<name>.ptx``; if any step fails, raises :class:`ToolchainError`
    (command and first error lines in the message) and ``out_dir`` is left untouched.
    """
    validate_artifact_name(name)
    gencode = gencode_flag(arch)
    wanted = _check_formats(formats)
    nvcc = require_tool("nvcc")
    flags = [str(f) for f in extra_flags]
    includes = [f"-I{d}" for d in tilelang_include_dirs()]
    cu, ptx = f"{name}.cu", f"{name}.ptx"
    image, image_flags = _device_image(arch, name)
    base = [nvcc, "-std=c++20", "-O3"]
    common, image_common = [*base, gencode], [*base, *image_flags]
    # Relative file names + cwd=staging: error lines read "gemm.cu(137): error", and the recorded
    # commands can be re-run as they are from out_dir.
    commands: list[list[str]] = []
    if "ptx" in wanted:
        commands.append([*common, *includes, *flags, "--ptx", "-o", ptx, cu])
        if "cubin" in wanted:  # assemble the PTX we keep: the slow C++ front end runs once
            commands.append([*image_common, *flags, "--resource-usage", "-o", image, ptx])
    else:
        commands.append([*image_common, *includes, *flags, "--resource-usage", "-o", image, cu])

    start = time.perf_counter()
    final_dir = Path(out_dir).absolute()
    logs: list[str] = []
    with untouched_on_failure(final_dir), atomic_output_dir(final_dir) as staging:
        (staging / cu).write_text(source, encoding="utf-8")
        for command in commands:
            run = run_tool(command, cwd=staging, timeout=timeout)
            logs.append(run.output)
    seconds = time.perf_counter() - start
    log = "\n".join(part for part in logs if part)
    return CudaBuild(
        source_path=final_dir / cu,
        cubin_path=final_dir / image if "cubin" in wanted else None,
        ptx_path=final_dir / ptx if "ptx" in wanted else None,
        resource_usage=parse_ptxas_report(log) if "cubin" in wanted else {},
        commands=commands,
        seconds=seconds,
        log=log,
    )


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


def parse_ptxas_report(text: str) -> dict[str, dict[str, int]]:
    """Per-kernel resources from ptxas ``-v`` / nvcc ``--resource-usage`` output.

    The report looks like (nvcc 13.0)::

        ptxas info    : Compiling entry function 'main_kernel' for 'sm_90a'
        ptxas info    : Function properties for main_kernel
            0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 240 registers, used 1 barriers, 1024 bytes smem

    "N bytes smem" is absent when the kernel has no static shared memory. Only entry functions
    (kernels) are reported; properties of non-inlined device functions are skipped.
    """
    usage: dict[str, dict[str, int]] = {}
    current: str | None = None  # the entry function ptxas is compiling
    props_for: str | None = None  # the function the next "stack frame" line belongs to
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = m[1]
            usage[current] = {
                "registers": 0,
                "shared_bytes": 0,
                "spill_stores": 0,
                "spill_loads": 0,
                "stack_bytes": 0,
                "barriers": 0,
            }
            props_for = None
        elif m := _PROPERTIES.search(line):
            props_for = m[1]
        elif (m := _FRAME.search(line)) and props_for in usage:
            entry = usage[props_for]
            entry["stack_bytes"], entry["spill_stores"], entry["spill_loads"] = (int(g) for g in m.groups())
        elif (m := _USED.search(line)) and current is not None:
            entry = usage[current]
            entry["registers"] = int(m[1])
            if s := _SMEM.search(line):
                entry["shared_bytes"] = int(s[1])
            if b := _BARRIERS.search(line):
                entry["barriers"] = int(b[1])
    return usage


def _check_formats(formats: Iterable[str]) -> set[str]:
    if isinstance(formats, str):  # formats="ptx" would otherwise be read as {'p', 't', 'x'}
        formats = (formats,)
    formats = tuple(formats)
    wanted = set(formats)
    unknown = wanted - set(CUDA_FORMATS)
    if unknown or not wanted:
        raise BuildOptionError(f"formats must be a non-empty subset of {CUDA_FORMATS}, got {formats!r}")
    return wanted
