"""A compiled Tessera kernel as one tvm-ffi module on the CPU: its device kernels plus one entry.

The entry ``__tvm_ffi_<kernel>`` is what ``tvm_ffi.load_module(path)[kernel]`` (and TVM's
``tvm.runtime.load_module``) calls. It takes DLPack tensors, the kernel's inputs then its outputs
(destination passing, as TVM's kernels do): numpy arrays through ``tvm_ffi.from_dlpack``, torch CPU
tensors as they are. It checks each argument's device, dtype, shape and strides, with an error that
names the argument, allocates the intermediates and runs the device kernels in order. It is written
against tvm-ffi's C API (the ABI TileLang's TVM, upstream TVM and tvm-ffi itself share).

Two builds: :func:`build_module` puts the device kernels' C sources and the entry into one library
(``build_module()``, ``tessera export``); :func:`linked_entry` compiles the entry alone (a fraction
of a second) against the device kernels' own libraries in the kernel cache, and loads it: what
``ts.compile``'s calls run.

:class:`~tessera_tvm.target.module.ModulePlan` says what the entry does; the frontend makes one
per compiled instance (``CompiledKernel.build_module``), so this module knows nothing of graphs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from ..._tvm import tvm_ffi_paths
from ..module import ModulePlan, dlpack_type, entry_dispatch, entry_helpers, entry_opening
from ..toolchain import (
    atomic_output_dir,
    require_tool,
    run_tool,
    untouched_on_failure,
    validate_artifact_name,
)
from .blas_threads import share_blas_threads
from .build import DEFAULT_CPU_FLAGS, kernel_includes, precompiled_prelude, runtime_link

__all__ = ["build_module", "entry_source"]


def entry_source(plans: Sequence[ModulePlan]) -> str:
    """The C++ of the entry ``__tvm_ffi_<name>``, written against tvm-ffi's C API: one function per
    plan (``Variant<i>``, calling the plan's kernels renamed by :func:`variant_symbol`), and the
    entry that picks one by the arguments' shapes."""
    plans = list(plans)
    name = plans[0].name
    lines = [f"// The tvm-ffi entry of Tessera kernel {name}: checks its arguments, runs its device kernels."]
    lines += entry_helpers("kDLCPU", "the CPU").splitlines()
    lines.append("")
    pairs = [(plan, pair) for plan in plans for call in plan.calls for pair in (*call.converts_in, *call.converts_out)]
    fp8 = sorted({_dtype_of(plan, pair) for plan, pair in pairs})
    # Only the headers an entry uses: <memory> and <cmath> would take 3/4 of its ~0.2 s compile.
    lines += ["#include <memory>"] if any(plan.intermediates for plan in plans) else []
    lines += ["#include <cmath>"] if fp8 else []
    for dtype in fp8:
        lines += fp8_helpers(dtype)
    for i, plan in enumerate(plans):
        lines += ["", *_variant(plan, i, len(plans))]
    lines += ["", *entry_dispatch(plans, lambda i: f"Variant{i}")]
    return "\n".join(lines)


def variant_symbol(symbol: str, index: int, count: int) -> str:
    """A device kernel's C symbol in a library of ``count`` plans (renamed apart when there are several)."""
    return symbol if count == 1 else f"{symbol}_v{index}"


def _variant(plan: ModulePlan, index: int, count: int) -> list[str]:
    """``Variant<index>``: check the arguments, allocate the intermediates, run ``plan``'s kernels."""
    name = plan.name
    tensors = [*plan.inputs, *plan.outputs]
    lines = []
    declared = set()
    for call in plan.calls:
        if call.symbol not in declared:
            declared.add(call.symbol)
            params = ", ".join("void*" if isinstance(a, str) else "int32_t" for a in call.args)
            lines.append(f'extern "C" int32_t {variant_symbol(call.symbol, index, count)}({params});')
    lines += ["", "static", *entry_opening(plan, f"Variant{index}")]
    for t in plan.intermediates:
        _, bits = dlpack_type(t, name)
        lines.append(f"  std::unique_ptr<char[]> own_{t.name}(new char[{max(1, t.numel * bits // 8)}]);")
        lines.append(f"  void* data_{t.name} = own_{t.name}.get();")
    by_name = {t.name: t for t in (*tensors, *plan.intermediates)}
    for call in plan.calls:
        for fp8, wide in call.converts_in:
            lines.append(f"  Decode{_FP8[by_name[fp8].dtype]}(data_{fp8}, data_{wide}, {by_name[fp8].numel});")
        args = ", ".join(f"data_{a}" if isinstance(a, str) else str(a) for a in call.args)
        lines.append(f"  if ({variant_symbol(call.symbol, index, count)}({args}) != 0) {{")
        lines.append(f'    return Fail("RuntimeError", "%s: device kernel {call.kernel} failed", kernel);')
        lines.append("  }")
        for wide, fp8 in call.converts_out:
            lines.append(f"  Encode{_FP8[by_name[fp8].dtype]}(data_{wide}, data_{fp8}, {by_name[fp8].numel});")
    for src, dst in plan.copies:
        _, bits = dlpack_type(by_name[src], name)
        lines.append(f"  std::memcpy(data_{dst}, data_{src}, {by_name[src].numel * bits // 8});")
    lines += [
        "  result->type_index = kTVMFFINone;",
        "  result->v_int64 = 0;",
        "  return 0;",
        "}",
    ]
    return lines


#: fp8 dtype -> the suffix of its conversion helpers in the entry.
_FP8 = {"float8_e4m3fn": "E4M3FN", "float8_e5m2": "E5M2"}


def _dtype_of(plan: ModulePlan, pair: tuple[str, str]) -> str:
    """The fp8 dtype of a conversion (whichever side of ``pair`` is not float32)."""
    by_name = {t.name: t for t in (*plan.inputs, *plan.outputs, *plan.intermediates)}
    return next(by_name[n].dtype for n in pair if by_name[n].dtype in _FP8)


def fp8_helpers(dtype: str) -> list[str]:
    """C++ converting ``dtype`` (fp8) to and from float32 exactly as ml_dtypes does (what the
    kernel-by-kernel runner uses): decoding by a table of all 256 values, encoding to the nearest
    value with ties to the even code, past the largest finite value to NaN (e4m3fn) or inf (e5m2)."""
    import ml_dtypes
    import numpy as np

    values = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, dtype)).astype(np.float32)
    bits = values.view(np.uint32)
    finite = np.isfinite(values[:128])
    largest = int(np.nonzero(finite)[0].max())  # the largest finite positive code; codes ascend to it
    info = ml_dtypes.finfo(getattr(ml_dtypes, dtype))
    step = float(values[largest]) - float(values[largest - 1])
    next_code = 0x7C if dtype == "float8_e5m2" else 0x7F  # inf (e5m2) or NaN (e4m3fn): what overflow gives
    nan_code = int(np.array([np.nan], np.float32).astype(getattr(ml_dtypes, dtype)).view(np.uint8)[0])
    assert float(values[largest]) == float(info.max)
    suffix = _FP8[dtype]
    table = ", ".join(f"0x{b:08x}u" for b in bits)
    return [
        "",
        f"// {dtype} <-> float32 as ml_dtypes converts them.",
        f"const uint32_t kBits{suffix}[256] = {{{table}}};",
        f"inline float Value{suffix}(int code) {{",
        "  float value;",
        f"  std::memcpy(&value, &kBits{suffix}[code], sizeof(value));",
        "  return value;",
        "}",
        f"void Decode{suffix}(const void* in, void* out, int64_t n) {{",
        "  const uint8_t* codes = static_cast<const uint8_t*>(in);",
        "  float* values = static_cast<float*>(out);",
        f"  for (int64_t i = 0; i < n; ++i) values[i] = Value{suffix}(codes[i]);",
        "}",
        f"void Encode{suffix}(const void* in, void* out, int64_t n) {{",
        "  const float* values = static_cast<const float*>(in);",
        "  uint8_t* codes = static_cast<uint8_t*>(out);",
        "  for (int64_t i = 0; i < n; ++i) {",
        "    float x = values[i];",
        "    uint8_t sign = std::signbit(x) ? 0x80 : 0;",
        "    if (std::isnan(x)) {",
        f"      codes[i] = static_cast<uint8_t>({nan_code} | sign);",
        "      continue;",
        "    }",
        "    float a = std::fabs(x);",
        f"    int lo = 0, hi = {largest};  // the largest code whose value is <= a",
        "    while (lo < hi) {",
        "      int mid = (lo + hi + 1) / 2;",
        f"      if (Value{suffix}(mid) <= a) lo = mid; else hi = mid - 1;",
        "    }",
        f"    float below = Value{suffix}(lo);",
        f"    float above = lo < {largest} ? Value{suffix}(lo + 1) : {float(values[largest]) + step!r}f;",
        f"    int above_code = lo < {largest} ? lo + 1 : {next_code};",
        "    int code = a - below < above - a ? lo : a - below > above - a ? above_code : (lo % 2 == 0 ? lo : above_code);",
        "    codes[i] = static_cast<uint8_t>(code | sign);",
        "  }",
        "}",
    ]


def _entry_command(cxx: str, name: str, flags: Sequence[str]) -> list[str]:
    include, dlpack, _ = tvm_ffi_paths()
    return [cxx, "-std=c++17", "-shared", "-fPIC", *map(str, flags), f"-I{include}", f"-I{dlpack}", "-o", f"{name}.so"]


def _link_flags() -> list[str]:
    _, _, lib = tvm_ffi_paths()
    return [f"-L{lib}", "-ltvm_ffi", f"-Wl,-rpath,{lib}"]


def linked_entry(plan: ModulePlan, libraries: Sequence[str | os.PathLike[str]], timeout: float = 300):
    """The entry of ``plan`` built alone, linked against ``libraries`` (the device kernels' own, built
    already), loaded: a tvm-ffi Function. Kept in the kernel cache under ``modules/<hash>/`` (a
    scratch directory when the cache is off, with a manifest checked before each load), so an
    instance pays the ~0.3 s of g++ once."""
    from ..._tvm import tvm_ffi
    from ...kernel_store import cached_build

    validate_artifact_name(plan.name)
    source = entry_source([plan])
    libraries = [str(Path(p).absolute()) for p in libraries]

    def build(directory: Path) -> None:
        cxx = require_tool("g++")
        rpaths = sorted({f"-Wl,-rpath,{Path(p).parent}" for p in libraries})
        command = [*_entry_command(cxx, plan.name, ("-O2",)), f"{plan.name}.entry.cc", *libraries, *rpaths]
        (directory / f"{plan.name}.entry.cc").write_text(source, encoding="utf-8")
        run_tool([*command, *_link_flags()], cwd=directory, timeout=timeout)

    # Verified against its manifest before it is loaded: a damaged library would crash the process.
    final = cached_build(build, source, *libraries, *tvm_ffi_paths(), name=plan.name)
    share_blas_threads()  # the kernels' OpenMP threads shared with numpy's OpenBLAS (blas_threads.py)
    return tvm_ffi.load_module(str(final / f"{plan.name}.so"))[plan.name]


def build_module(
    plans: Sequence[ModulePlan],
    out_dir: str | os.PathLike[str],
    flags: Sequence[str] = DEFAULT_CPU_FLAGS,
    timeout: float = 600,
) -> Path:
    """Build ``plans`` (one kernel, one plan per set of dims) into ``out_dir/<name>.so`` (sources kept
    beside it); return the library.

    Like every build here, the files appear together only on success; a failing compile raises a
    ``ToolchainError`` with the command and the compiler's first errors.
    """
    plans = list(plans)
    name = plans[0].name
    validate_artifact_name(name)
    files = {f"{name}.entry.cc": entry_source(plans)}
    for i, plan in enumerate(plans):
        symbols = {call.symbol for call in plan.calls}
        for kernel, source in plan.sources:
            validate_artifact_name(kernel)
            for symbol in symbols:  # two plans define the same kernel names: rename each plan's apart
                source = re.sub(rf"\b{re.escape(symbol)}\b", variant_symbol(symbol, i, len(plans)), source)
            files[f"{kernel}{'' if len(plans) == 1 else f'_v{i}'}.cpp"] = source
    cxx = require_tool("g++")
    # what the kernel sources include, TileLang's prelude precompiled (~0.5 s less per kernel source)
    includes = kernel_includes(precompiled_prelude(cxx, flags))
    command = [*_entry_command(cxx, name, flags), *includes, *files, *_link_flags()]
    command += runtime_link(cxx, flags, "".join(files.values()))  # the runtime object, where a kernel calls it
    final_dir = Path(out_dir).absolute()
    with untouched_on_failure(final_dir), atomic_output_dir(final_dir) as staging:
        for file, text in files.items():
            (staging / file).write_text(text, encoding="utf-8")
        run_tool(command, cwd=staging, timeout=timeout)
    return final_dir / f"{name}.so"
