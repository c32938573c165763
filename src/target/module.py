"""A compiled Tessera kernel as one library with a tvm-ffi entry: the plan the backends build.

A :class:`ModulePlan` is what the entry ``__tvm_ffi_<kernel>`` does, in order: check its inputs and
outputs (DLPack tensors, destination passing), allocate the intermediates, call each device kernel,
copy an output that is an input. The frontend makes one per compiled instance
(``tessera.module.module_plan``); a backend with a ``module`` hook builds it
(:mod:`tessera_tvm.target.cpu.module` on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TesseraError

__all__ = ["DLPACK_CODE_NAMES", "Call", "ModuleError", "ModulePlan", "TensorArg", "dlpack_type", "entry_header"]

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
}

#: dlpack.h's names of those codes (what generated C++ spells).
DLPACK_CODE_NAMES = {0: "kDLInt", 1: "kDLUInt", 2: "kDLFloat", 4: "kDLBfloat", 6: "kDLBool"}


class ModuleError(TesseraError):
    """A compiled kernel that cannot become a tvm-ffi module (yet)."""


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
class Call:
    """One device kernel run: its C symbol and arguments, tensor names (buffers) or ints (scalars)."""

    kernel: str  # the fused kernel's name, for errors
    symbol: str
    args: tuple[str | int, ...]


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


def entry_header(plan: ModulePlan, note: str = "") -> str:
    """A C header declaring ``plan``'s tvm-ffi entry, its arguments listed in order (for C hosts)."""
    guard = "TESSERA_EXPORT_" + "".join(c if c.isalnum() else "_" for c in plan.name.upper()) + "_H_"
    macro = "TESSERA_" + "".join(c if c.isalnum() else "_" for c in plan.name.upper())
    width = max(len(t.name) for t in (*plan.inputs, *plan.outputs))
    rows = [
        f" *   args[{i}]  {t.name:<{width}}  {t.dtype} [{', '.join(map(str, t.shape))}]  {role}"
        for i, (t, role) in enumerate(
            [(t, "input") for t in plan.inputs] + [(t, "output, written by the kernel") for t in plan.outputs]
        )
    ]
    lines = [
        f"/* {plan.name}: a Tessera kernel exported as a tvm-ffi library ({plan.name}.so).{note}",
        " *",
        f" * Call __tvm_ffi_{plan.name} with {len(rows)} arguments, each a DLTensor* passed as a TVMFFIAny of",
        " * type_index kTVMFFIDLTensorPtr, CPU memory, dense row-major:",
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
        f"#define {macro}_NUM_ARGS {len(rows)}",
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
