"""A compiled Tessera kernel as one library with a tvm-ffi entry: the plan the backends build.

A :class:`ModulePlan` is what the entry ``__tvm_ffi_<kernel>`` does, in order: check its inputs and
outputs (DLPack tensors, destination passing), allocate the intermediates, call each device kernel,
copy an output that is an input. The frontend makes one per compiled instance
(``tessera.module.module_plan``); a backend with a ``module`` hook builds it
(:mod:`tessera_tvm.target.cpu.module` on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import TesseraError

__all__ = [
    "DLPACK_CODE_NAMES",
    "Call",
    "GpuLaunch",
    "ModuleError",
    "ModulePlan",
    "TensorArg",
    "TensorMap",
    "call_library",
    "dlpack_type",
    "check_variants",
    "entry_dispatch",
    "entry_header",
    "entry_helpers",
    "entry_opening",
    "module_cache_dir",
    "varying_dims",
]

#: The dtypes an entry takes: dtype -> (DLPack type code, bits), codes as dlpack.h's DLDataTypeCode.
_DLPACK_TYPES = {
    "float64": (2, 64),
    "float32": (2, 32),
    "float16": (2, 16),
    "bfloat16": (4, 16),
    "int64": (0, 64),
    "int32": (0, 32),
    "int16": (0, 16),
    "int8": (0, 8),
    "uint8": (1, 8),
    "bool": (6, 8),
    "float8_e4m3fn": (10, 8),
    "float8_e5m2": (12, 8),
}

#: dlpack.h's names of those codes (what generated C++ spells).
DLPACK_CODE_NAMES = {
    0: "kDLInt",
    1: "kDLUInt",
    2: "kDLFloat",
    4: "kDLBfloat",
    6: "kDLBool",
    10: "kDLFloat8_e4m3fn",
    12: "kDLFloat8_e5m2",
}


class ModuleError(TesseraError):
    """A compiled kernel that cannot become a tvm-ffi module (yet)."""


def module_cache_dir(*parts: str | bytes) -> Path:
    """Where a library built from ``parts`` (its sources, what it links) is kept: the kernel cache's
    ``modules/<hash>/``, or a scratch directory when the cache is off."""
    import hashlib

    from ..kernel_store import KernelCache, scratch_directory

    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    root = KernelCache.from_env().root
    if root is None:
        return scratch_directory("tessera_")
    return Path(root) / "modules" / digest.hexdigest()[:24]


def dlpack_type(arg: TensorArg, kernel: str) -> tuple[int, int]:
    """``arg``'s (DLPack type code, bits); a dtype the entry does not take is a :class:`ModuleError`."""
    try:
        return _DLPACK_TYPES[arg.dtype]
    except KeyError:
        raise ModuleError(
            f"{kernel}: tensor {arg.name} has dtype {arg.dtype}, which the tvm-ffi entry does not take yet "
            f"(it takes {', '.join(_DLPACK_TYPES)})"
        ) from None


@dataclass(frozen=True)
class TensorArg:
    """A tensor the entry takes or allocates: its name, dtype and static shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        count = 1
        for d in self.shape:
            count *= d
        return count


@dataclass(frozen=True)
class TensorMap:
    """A TMA descriptor the host encodes before a launch: ``cuTensorMapEncodeTiled``'s arguments.

    Dims, box and element strides run innermost first, as the driver takes them; ``strides`` are
    the byte strides of dims 1.. (dim 0 is dense). ``buffer`` indexes the call's ``args``."""

    buffer: int
    data_type: int  # CUtensorMapDataType
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int


@dataclass(frozen=True)
class GpuLaunch:
    """One launch of a device function of a cubin: its parameters in order, grid, block, shared memory.

    A parameter is ``("tensormap", i)`` (the i-th of ``tensormaps``, passed by value),
    ``("pointer", i)`` (the data of the call's ``args[i]``) or ``("int32"|"int64", value)``."""

    function: str
    params: tuple[tuple[str, int], ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    tensormaps: tuple[TensorMap, ...] = ()


@dataclass(frozen=True)
class Call:
    """One device kernel run: its C symbol and arguments, tensor names (buffers) or ints (scalars).

    On a GPU, ``args`` are the kernel's buffers in the tile program's order, ``launches`` what its
    host code launches (in order) and ``binary`` the cubin holding their functions."""

    kernel: str  # the fused kernel's name, for errors
    symbol: str
    args: tuple[str | int, ...]
    launches: tuple[GpuLaunch, ...] = ()
    binary: str | None = None
    # (fp8 tensor, its float32 copy) decoded before the call, (float32 result, fp8 tensor) encoded
    # after it: a kernel that holds fp8 values as float32 (the CPU's tile programs).
    converts_in: tuple[tuple[str, str], ...] = ()
    converts_out: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ModulePlan:
    """What one compiled kernel's entry does, in order."""

    name: str
    inputs: tuple[TensorArg, ...]
    outputs: tuple[TensorArg, ...]
    intermediates: tuple[TensorArg, ...]
    calls: tuple[Call, ...]
    copies: tuple[tuple[str, str], ...]  # (input, output): an output that is an input, copied
    sources: tuple[tuple[str, str], ...]  # (device kernel name, its C source)
    device: str = "cpu"  # where its tensors live: "cpu" or "cuda"
    bound: tuple[tuple[str, int], ...] = ()  # the dims this plan was compiled for, (symbol, value)


def varying_dims(plans) -> list[tuple[int | None, ...]]:
    """Each argument's dims over ``plans``: the value where all plans agree, None where they differ."""
    columns = [[*p.inputs, *p.outputs] for p in plans]
    return [
        tuple(dims[0] if len(set(dims)) == 1 else None for dims in zip(*(t.shape for t in ts), strict=True))
        for ts in zip(*columns, strict=True)
    ]


def entry_header(plans, note: str = "") -> str:
    """A C header declaring the entry of ``plans`` (one kernel, a plan per set of dims), its
    arguments listed in order (for C hosts); a dim that differs between plans shows as ``?``."""
    plans = list(plans)
    plan = plans[0]
    guard = "TESSERA_EXPORT_" + "".join(c if c.isalnum() else "_" for c in plan.name.upper()) + "_H_"
    macro = "TESSERA_" + "".join(c if c.isalnum() else "_" for c in plan.name.upper())
    width = max(len(t.name) for t in (*plan.inputs, *plan.outputs))
    memory = "memory of one CUDA device" if plan.device == "cuda" else "CPU memory"
    dims = varying_dims(plans)
    tensors = [(t, "input") for t in plan.inputs] + [(t, "output, written by the kernel") for t in plan.outputs]
    rows = [
        f" *   args[{i}]  {t.name:<{width}}  {t.dtype} [{', '.join('?' if d is None else str(d) for d in dims[i])}]  {role}"
        for i, (t, role) in enumerate(tensors)
    ]
    if len(plans) > 1:
        built = " | ".join(_binding_text(p) for p in plans)
        rows += [" *", f" * Built for {built}: the entry takes the dims from the arguments' shapes."]
    lines = [
        f"/* {plan.name}: a Tessera kernel exported as a tvm-ffi library ({plan.name}.so).{note}",
        " *",
        f" * Call __tvm_ffi_{plan.name} with {len(tensors)} arguments, each a DLTensor* passed as a TVMFFIAny of",
        f" * type_index kTVMFFIDLTensorPtr, {memory}, dense row-major:",
        *rows,
        " * It returns 0, or -1 with the error kept for TVMFFIErrorMoveFromRaised. tvm_ffi.load_module and",
        " * TVM's tvm.runtime.load_module find the same entry by the kernel's name.",
        " */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "#include <tvm/ffi/c_api.h>",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        f"#define {macro}_NUM_ARGS {len(tensors)}",
        "",
        f"int __tvm_ffi_{plan.name}(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);",
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "",
        f"#endif  /* {guard} */",
        "",
    ]
    return "\n".join(lines)


#: The entry's helpers: tvm-ffi's C API only, so an entry compiles in a fraction of a second.
#: ``@DEVICE@`` is the DLPack device type its tensors must be on, ``@WHERE@`` says where in words.
_HELPERS = r"""
#include <tvm/ffi/c_api.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

int Fail(const char* kind, const char* format, ...) {
  char message[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  TVMFFIErrorSetRaisedFromCStr(kind, message);
  return -1;
}

// The data of argument ``a`` when it is a tensor on @DEVICE@ of ``dtype`` and ``shape``, densely laid
// out (its device id in ``*device``); null (with the error raised) otherwise. Tensors come as DLTensor*
// (C hosts, from_dlpack) or as tvm-ffi Tensor objects (torch and numpy passed to a tvm-ffi Function).
void* Checked(const char* kernel, const TVMFFIAny* a, const char* name, int code, int bits, int ndim,
              const int64_t* shape, int* device) {
  DLTensor* t = nullptr;
  if (a->type_index == kTVMFFIDLTensorPtr) t = static_cast<DLTensor*>(a->v_ptr);
  if (a->type_index == kTVMFFITensor) t = reinterpret_cast<DLTensor*>(reinterpret_cast<char*>(a->v_obj) + sizeof(TVMFFIObject));
  if (t == nullptr) {
    Fail("TypeError", "%s: argument %s is not a tensor (tvm-ffi type index %d)", kernel, name, a->type_index);
    return nullptr;
  }
  if (t->device.device_type != @DEVICE@) {
    Fail("ValueError", "%s: argument %s is on device type %d; this library runs on @WHERE@ (@DEVICE@)", kernel, name,
         static_cast<int>(t->device.device_type));
    return nullptr;
  }
  *device = t->device.device_id;
  if (t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != 1) {
    Fail("TypeError", "%s: argument %s has DLPack dtype (code %d, bits %d, lanes %d); expected (code %d, bits %d, lanes 1)",
         kernel, name, t->dtype.code, t->dtype.bits, t->dtype.lanes, code, bits);
    return nullptr;
  }
  if (t->ndim != ndim) {
    Fail("ValueError", "%s: argument %s has %d dims; expected %d", kernel, name, t->ndim, ndim);
    return nullptr;
  }
  for (int i = 0; i < ndim; ++i) {
    if (t->shape[i] != shape[i]) {
      Fail("ValueError", "%s: argument %s has shape[%d] = %lld; expected %lld", kernel, name, i,
           static_cast<long long>(t->shape[i]), static_cast<long long>(shape[i]));
      return nullptr;
    }
  }
  int64_t stride = 1;  // row-major and dense (DLPack: null strides mean exactly that)
  for (int i = ndim - 1; i >= 0; --i) {
    if (t->strides != nullptr && shape[i] != 1 && t->strides[i] != stride) {
      Fail("ValueError", "%s: argument %s is not contiguous (stride[%d] = %lld, expected %lld); pass a contiguous copy",
           kernel, name, i, static_cast<long long>(t->strides[i]), static_cast<long long>(stride));
      return nullptr;
    }
    stride *= shape[i];
  }
  return static_cast<char*>(t->data) + t->byte_offset;
}

// Whether argument ``a`` is a tensor of ``ndim`` dims equal to ``shape`` (no error raised).
bool Shaped(const TVMFFIAny* a, int ndim, const int64_t* shape) {
  DLTensor* t = nullptr;
  if (a->type_index == kTVMFFIDLTensorPtr) t = static_cast<DLTensor*>(a->v_ptr);
  if (a->type_index == kTVMFFITensor) t = reinterpret_cast<DLTensor*>(reinterpret_cast<char*>(a->v_obj) + sizeof(TVMFFIObject));
  if (t == nullptr || t->ndim != ndim) return false;
  for (int i = 0; i < ndim; ++i) {
    if (t->shape[i] != shape[i]) return false;
  }
  return true;
}

}  // namespace
"""


def entry_helpers(device: str, where: str) -> str:
    """The C++ helpers every entry starts with (``Fail``, ``Checked``), for tensors on DLPack ``device``."""
    return _HELPERS.strip("\n").replace("@DEVICE@", device).replace("@WHERE@", where)


def check_variants(plans) -> None:
    """Plans one library holds (one per set of dims) must take the same arguments: names, dtypes, ranks."""
    first = plans[0]
    for plan in plans[1:]:
        if plan.name != first.name or plan.device != first.device:
            raise ModuleError(f"one library holds one kernel on one device, not {first.name} and {plan.name}")
        mine, theirs = [*first.inputs, *first.outputs], [*plan.inputs, *plan.outputs]
        same = len(mine) == len(theirs) and all(
            (a.name, a.dtype, len(a.shape)) == (b.name, b.dtype, len(b.shape))
            for a, b in zip(mine, theirs, strict=False)
        )
        if not same:
            raise ModuleError(
                f"{first.name}: the shapes given compile to kernels with different arguments "
                f"({_binding_text(first)}: {mine}; {_binding_text(plan)}: {theirs}); build one library per argument list"
            )
    bindings = [plan.bound for plan in plans]
    if len(set(bindings)) != len(bindings):
        raise ModuleError(f"{first.name}: the same dims were given twice: {bindings}")


def _binding_text(plan: ModulePlan) -> str:
    return ",".join(f"{k}={v}" for k, v in plan.bound) or "static shapes"


def entry_dispatch(plans, variant) -> list[str]:
    """The public entry ``__tvm_ffi_<name>`` over ``plans`` (one per set of dims): it binds the dims
    from the arguments' shapes and calls ``variant(i)``, the function of the plan they match."""
    check_variants(plans)
    name = plans[0].name
    lines = [
        f'extern "C" __attribute__((visibility("default"))) int __tvm_ffi_{name}(',
        "    void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {",
    ]
    if len(plans) == 1:  # one set of dims: its function checks every argument itself
        return [*lines, f"  return {variant(0)}(self, args, num_args, result);", "}", ""]
    tensors = [*plans[0].inputs, *plans[0].outputs]
    lines += [
        f"  if (num_args == {len(tensors)}) {{",
    ]
    for i, plan in enumerate(plans):
        shapes = []
        for j, t in enumerate((*plan.inputs, *plan.outputs)):
            lines.append(f"    static const int64_t shape{i}_{j}[] = {{{', '.join(map(str, t.shape)) or '1'}}};")
            shapes.append(f"Shaped(&args[{j}], {len(t.shape)}, shape{i}_{j})")
        lines.append(f"    if ({' && '.join(shapes)}) return {variant(i)}(self, args, num_args, result);")
    built = " | ".join(_binding_text(plan) for plan in plans)
    lines += [
        "  }",
        f"  if (num_args != {len(tensors)}) return {variant(0)}(self, args, num_args, result);  // its error",
        f'  return Fail("ValueError", "{name}: the arguments\' shapes match none of the dims this library was '
        f'built for ({built})");',
        "}",
        "",
    ]
    return lines


def entry_opening(plan: ModulePlan, function: str) -> list[str]:
    """The signature of ``function`` (one plan's entry) and its argument checks: ``data_<name>`` for
    every input and output, their device ids in ``device_<name>``."""
    name = plan.name
    tensors = [*plan.inputs, *plan.outputs]
    lines = [
        f"int {function}(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {{",
        f'  const char* kernel = "{name}";',
        f"  if (num_args != {len(tensors)}) {{",
        f'    return Fail("TypeError", "%s: takes {len(tensors)} tensors ({", ".join(t.name for t in tensors)}), '
        'got %d", kernel, num_args);',
        "  }",
    ]
    for i, t in enumerate(tensors):
        code, bits = dlpack_type(t, name)
        dims = ", ".join(str(d) for d in t.shape) or "1"
        lines += [
            f"  static const int64_t shape_{t.name}[] = {{{dims}}};",
            f"  int device_{t.name} = 0;",
            f'  void* data_{t.name} = Checked(kernel, &args[{i}], "{t.name}", {DLPACK_CODE_NAMES[code]}, {bits}, '
            f"{len(t.shape)}, shape_{t.name}, &device_{t.name});",
            f"  if (data_{t.name} == nullptr) return -1;",
        ]
    return lines


def call_library(path: str | Path, entry: str, arrays) -> None:
    """Call ``entry`` of the tvm-ffi library at ``path`` on numpy arrays (inputs, then the outputs it
    writes): what ``tessera replay --run`` does with a pack's prebuilt library."""
    import tvm_ffi

    try:
        function = tvm_ffi.load_module(str(path))[entry]
    except Exception as exc:
        raise ModuleError(f"{path}: cannot load entry {entry!r} of this library: {exc}") from None
    function(*[tvm_ffi.from_dlpack(a) for a in arrays])
