"""Tessera's embeddable runtime (seed 004 §3.5): the ``tsr*`` C ABI, its images and its build.

``include/tessera/tsr.h`` is the ABI; ``tsr.cc`` implements it over tvm-ffi's C API, and over the
CUDA driver API for CUDA kernels when the CUDA headers are there to build it with.
:func:`write_image` packs an exported kernel (its tvm-ffi library, argument list and launch) into
the image ``tsrLoadModule`` takes; :func:`build_runtime` builds ``libtessera_rt.so`` with g++ (with
AddressSanitizer and UndefinedBehaviorSanitizer when ``sanitize``), linked against tvm-ffi.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Any

from ..._tvm import tvm_ffi_paths
from ..cpu.build import RUNTIME_INCLUDE_DIR
from ..module import dlpack_type, varying_dims
from ..toolchain import atomic_output_dir, require_tool, run_tool, untouched_on_failure

__all__ = ["ABI_MAJOR", "ABI_MINOR", "SOURCE", "build_runtime", "image_bytes", "image_metadata", "write_image"]

#: The ABI version images are written for (``TSR_ABI_MAJOR`` / ``TSR_ABI_MINOR`` in tsr.h).
ABI_MAJOR, ABI_MINOR = 3, 0  # 3.0: the image carries a SHA-256 of its bytes (2.0 had none)

SOURCE = Path(__file__).resolve().parent / "tsr.cc"


def image_metadata(plans, launches: list[dict[str, Any]]) -> str:
    """The image's metadata text (tsr.cc documents the format): the kernel, its device, its arguments
    in order (-1 for a dim that differs between ``plans``, one per set of dims), and its launch when it
    runs one device kernel (``launches``: each device kernel's metadata launch)."""
    plans = list(plans)
    plan = plans[0]
    args = [(t, "input") for t in plan.inputs] + [(t, "output") for t in plan.outputs]
    lines = [f"kernel {plan.name} __tvm_ffi_{plan.name} {len(args)}", f"device {plan.device}"]
    for i, ((t, role), dims) in enumerate(zip(args, varying_dims(plans), strict=True)):
        code, bits = dlpack_type(t, plan.name)
        shape = " ".join(str(-1 if d is None else d) for d in dims)
        lines.append(f"arg {i} {t.name} {role} {code} {bits} {len(t.shape)} {shape}".rstrip())
    if len(launches) == 1 and all(isinstance(v, int) for v in (*launches[0]["grid"], *launches[0]["block"])):
        launch = launches[0]
        dims = [*launch["grid"], *launch["block"], int(launch.get("smem_bytes", 0))]
        lines.append("launch " + " ".join(str(int(d)) for d in dims))
    else:
        lines.append("launch none")
    return "\n".join(lines) + "\n"


def write_image(path: str | os.PathLike[str], metadata: str, library: str | os.PathLike[str]) -> Path:
    """Write the image ``tsrLoadModule`` takes: header, ABI version, SHA-256, metadata text, library."""
    lib = Path(library).read_bytes()
    Path(path).write_bytes(image_bytes(metadata.encode(), lib))
    return Path(path)


def image_bytes(metadata: bytes, library: bytes) -> bytes:
    """An image's bytes (tsr.cc documents the layout): its SHA-256 covers every other byte."""
    head = b"TSRB" + struct.pack("<II", ABI_MAJOR, ABI_MINOR)
    body = struct.pack("<Q", len(metadata)) + metadata + struct.pack("<Q", len(library)) + library
    return head + hashlib.sha256(head + body).digest() + body


def build_runtime(
    out_dir: str | os.PathLike[str], *, sanitize: bool = False, cuda: bool | None = None, timeout: float = 600
) -> Path:
    """Build ``out_dir/libtessera_rt.so`` from tsr.cc (``sanitize``: with ASan and UBSan); return it.
    A C host compiles against ``include/tessera/tsr.h`` (:data:`RUNTIME_INCLUDE_DIR`) and links it.

    ``cuda``: build the CUDA path in (it needs the CUDA headers, not a GPU: the driver is opened when
    first used); None builds it in when the headers are found. Without it, CUDA images and device
    memory are ``TSR_ENODEVICE``."""
    from ...errors import TesseraError
    from ..cuda.module import cuda_include_dir

    cxx = require_tool("g++")
    include, dlpack, lib = tvm_ffi_paths()
    flags = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"] if sanitize else ["-O2"]
    if cuda is not False:
        try:
            flags += ["-DTSR_WITH_CUDA", f"-I{cuda_include_dir()}"]
        except TesseraError:
            if cuda:
                raise
    command = [
        cxx, "-std=c++17", "-shared", "-fPIC", "-Wall", "-Werror", *flags,
        f"-I{RUNTIME_INCLUDE_DIR}", f"-I{include}", f"-I{dlpack}",
        "-o", "libtessera_rt.so", str(SOURCE),
        f"-L{lib}", "-ltvm_ffi", f"-Wl,-rpath,{lib}", "-ldl",
    ]  # fmt: skip
    final = Path(out_dir).absolute()
    with untouched_on_failure(final), atomic_output_dir(final) as staging:
        run_tool(command, cwd=staging, timeout=timeout)
    return final / "libtessera_rt.so"
