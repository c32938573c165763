"""A compiled Tessera kernel as one tvm-ffi module on the CPU: its device kernels plus one entry.

The entry ``__tvm_ffi_<kernel>`` is what ``tvm_ffi.load_module(path)[kernel]`` (and TVM's
``tvm.runtime.load_module``) calls. It takes DLPack tensors, the kernel's inputs then its outputs
(destination passing, as TVM's kernels do): numpy arrays through ``tvm_ffi.from_dlpack``, torch CPU
tensors as they are. It checks each argument's device, dtype, shape and strides, with an error that
names the argument, allocates the intermediates and runs the device kernels in order. The device
kernels' C sources and the entry build into one library, linked against tvm-ffi's runtime library
(the ABI TileLang's TVM, upstream TVM and tvm-ffi itself share).

:class:`~tessera_tvm.target.module.ModulePlan` says what the entry does; the frontend makes one
per compiled instance (``CompiledKernel.build_module``), so this module knows nothing of graphs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..._tvm import tvm_ffi_paths
from ..module import ModuleError, ModulePlan
from ..toolchain import (
    atomic_output_dir,
    require_tool,
    run_tool,
    tilelang_include_dirs,
    untouched_on_failure,
    validate_artifact_name,
)
from .build import DEFAULT_CPU_FLAGS, RUNTIME_INCLUDE_DIR

__all__ = ["build_module", "entry_source"]

#: Tensor dtypes the entry accepts: name -> (DLPack type code, bits, C element size in bytes).
_DLPACK = {
    "float64": ("kDLFloat", 64),
    "float32": ("kDLFloat", 32),
    "float16": ("kDLFloat", 16),
    "bfloat16": ("kDLBfloat", 16),
    "int64": ("kDLInt", 64),
    "int32": ("kDLInt", 32),
    "int16": ("kDLInt", 16),
    "int8": ("kDLInt", 8),
    "uint8": ("kDLUInt", 8),
    "bool": ("kDLBool", 8),
}


def _dtype_of(arg, kernel: str) -> tuple[str, int]:
    try:
        return _DLPACK[arg.dtype]
    except KeyError:
        raise ModuleError(
            f"{kernel}: tensor {arg.name} has dtype {arg.dtype}, which the tvm-ffi entry does not take yet "
            f"(it takes {', '.join(_DLPACK)})"
        ) from None


def entry_source(plan: ModulePlan) -> str:
    """The C++ of the entry ``__tvm_ffi_<plan.name>`` (tvm-ffi's typed-function export)."""
    name = plan.name
    lines = [
        f"// The tvm-ffi entry of Tessera kernel {name}: checks its arguments, runs its device kernels.",
        "#include <tvm/ffi/error.h>",
        "#include <tvm/ffi/function.h>",
        "",
        "#include <cstdint>",
        "#include <cstring>",
        "#include <memory>",
        "",
    ]
    declared = set()
    for call in plan.calls:
        if call.symbol not in declared:
            declared.add(call.symbol)
            params = ", ".join("void*" if isinstance(a, str) else "int32_t" for a in call.args)
            lines.append(f'extern "C" int32_t {call.symbol}({params});')
    lines += [
        "",
        "namespace {",
        "",
        "// The data of ``t`` when it is a CPU tensor of ``dtype`` and ``shape``, densely laid out.",
        "void* Checked(DLTensor* t, const char* name, DLDataTypeCode code, int bits, int ndim, const int64_t* shape) {",
        f'  const char* kernel = "{name}";',
        '  if (t == nullptr) TVM_FFI_THROW(ValueError) << kernel << ": argument " << name << " is null";',
        "  if (t->device.device_type != kDLCPU) {",
        '    TVM_FFI_THROW(ValueError) << kernel << ": argument " << name << " is on device type "',
        '                              << t->device.device_type << "; this library runs on the CPU (kDLCPU)";',
        "  }",
        "  if (t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != 1) {",
        '    TVM_FFI_THROW(TypeError) << kernel << ": argument " << name << " has DLPack dtype (code "',
        '                             << int(t->dtype.code) << ", bits " << int(t->dtype.bits) << ", lanes "',
        '                             << int(t->dtype.lanes) << "); expected (code " << int(code) << ", bits " << bits',
        '                             << ", lanes 1)";',
        "  }",
        "  if (t->ndim != ndim) {",
        '    TVM_FFI_THROW(ValueError) << kernel << ": argument " << name << " has " << t->ndim << " dims; expected "',
        "                              << ndim;",
        "  }",
        "  for (int i = 0; i < ndim; ++i) {",
        "    if (t->shape[i] != shape[i]) {",
        '      TVM_FFI_THROW(ValueError) << kernel << ": argument " << name << " has shape[" << i << "] = "',
        '                                << t->shape[i] << "; expected " << shape[i];',
        "    }",
        "  }",
        "  int64_t stride = 1;  // row-major and dense (DLPack: null strides mean exactly that)",
        "  for (int i = ndim - 1; i >= 0; --i) {",
        "    if (t->strides != nullptr && shape[i] != 1 && t->strides[i] != stride) {",
        '      TVM_FFI_THROW(ValueError) << kernel << ": argument " << name << " is not contiguous (stride["',
        '                                << i << "] = " << t->strides[i] << ", expected " << stride',
        '                                << "); pass a contiguous copy";',
        "    }",
        "    stride *= shape[i];",
        "  }",
        "  return static_cast<char*>(t->data) + t->byte_offset;",
        "}",
        "",
    ]
    tensors = [*plan.inputs, *plan.outputs]
    signature = ", ".join(f"DLTensor* {t.name}" for t in tensors)
    lines.append(f"void Run({signature}) {{")
    for t in tensors:
        code, bits = _dtype_of(t, name)
        dims = ", ".join(str(d) for d in t.shape) or "1"
        lines.append(f"  static const int64_t shape_{t.name}[] = {{{dims}}};")
        lines.append(
            f'  void* data_{t.name} = Checked({t.name}, "{t.name}", {code}, {bits}, {len(t.shape)}, shape_{t.name});'
        )
    for t in plan.intermediates:
        _, bits = _dtype_of(t, name)
        lines.append(f"  std::unique_ptr<char[]> own_{t.name}(new char[{max(1, t.numel * bits // 8)}]);")
        lines.append(f"  void* data_{t.name} = own_{t.name}.get();")
    for call in plan.calls:
        args = ", ".join(f"data_{a}" if isinstance(a, str) else str(a) for a in call.args)
        lines.append(f"  if ({call.symbol}({args}) != 0) {{")
        lines.append(f'    TVM_FFI_THROW(RuntimeError) << "{name}: device kernel {call.kernel} failed";')
        lines.append("  }")
    by_name = {t.name: t for t in tensors}
    for src, dst in plan.copies:
        _, bits = _dtype_of(by_name[src], name)
        lines.append(f"  std::memcpy(data_{dst}, data_{src}, {by_name[src].numel * bits // 8});")
    lines += ["}", "", "}  // namespace", "", f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, Run);", ""]
    return "\n".join(lines)


def build_module(
    plan: ModulePlan, out_dir: str | os.PathLike[str], flags: Sequence[str] = DEFAULT_CPU_FLAGS, timeout: float = 600
) -> Path:
    """Build ``plan`` into ``out_dir/<name>.so`` (sources kept beside it); return the library.

    Like every build here, the files appear together only on success; a failing compile raises a
    ``ToolchainError`` with the command and the compiler's first errors.
    """
    validate_artifact_name(plan.name)
    for call in plan.calls:
        validate_artifact_name(call.kernel)
    cxx = require_tool("g++")
    include, dlpack, lib = tvm_ffi_paths()
    entry = f"{plan.name}.entry.cc"
    files = {entry: entry_source(plan), **{f"{kernel}.cpp": source for kernel, source in plan.sources}}
    command = [
        cxx,
        "-std=c++17",
        "-shared",
        "-fPIC",
        *map(str, flags),
        f"-I{RUNTIME_INCLUDE_DIR}",
        f"-I{tilelang_include_dirs()[0]}",
        f"-I{include}",
        f"-I{dlpack}",
        "-o",
        f"{plan.name}.so",
        *files,
        f"-L{lib}",
        "-ltvm_ffi",
        f"-Wl,-rpath,{lib}",
    ]
    final_dir = Path(out_dir).absolute()
    with untouched_on_failure(final_dir), atomic_output_dir(final_dir) as staging:
        for file, text in files.items():
            (staging / file).write_text(text, encoding="utf-8")
        run_tool(command, cwd=staging, timeout=timeout)
    return final_dir / f"{plan.name}.so"
