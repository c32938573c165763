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

__all__ = ["Call", "ModuleError", "ModulePlan", "TensorArg"]


class ModuleError(TesseraError):
    """A compiled kernel that cannot become a tvm-ffi module (yet)."""


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
