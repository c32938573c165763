"""How a backend's compiled kernels run in this process: the :class:`Runner` its manifest names.

Each backend gives one runner (``Backend.runner``, a ``"module:attribute"`` hook resolved on first
use): the CPU's runs C kernels on numpy arrays (:mod:`.cpu.runner`), CUDA's holds the values as torch
tensors on a GPU and launches there (:mod:`.cuda.runner`), Tenstorrent's runs nothing when called
but emulates a compile on request (:mod:`.tt.runner`). The frontend asks the runner (whether a call
runs here, where its values live, waiting for queued work, the autotuner's bench) instead of
comparing kind names. This base class is the runner of a backend whose kernels do not run here:
every question gets the answer "not here", and the refusal says why.

A runner never imports the frontend: the instances, device kernels and memories it is handed are
the frontend's objects, used through their attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import NotRunnableError

__all__ = ["NOT_HERE", "Runner", "readable"]


class Runner:
    """The runner of a backend whose kernels do not run in this process (the base of the others)."""

    #: The values of a call live in a device's memory as torch tensors (a GPU): a call takes torch
    #: tensors on that device next to numpy arrays, and its kernels run on the compiled instance
    #: (every dim bound at compile time). False: the host's numpy arrays (torch CPU tensors too).
    device_memory: bool = False

    #: The autotuner's bench class for this backend's kernels (``tessera.tuning``), or None.
    bench: type | None = None

    def runnable(self, instance: Any) -> bool:
        """Whether calling the compiled kernel (``instance``: its compiled instance, or None while
        its dims are not bound) runs here."""
        return False

    def refusal(self, name: str, config: Any) -> str:
        """Why kernel ``name`` compiled for ``config`` does not run when called here."""
        from .backend import backend_for

        reason = backend_for(config).not_runnable
        if reason is not None:
            return f"{name} was compiled for {config.name}{reason}. Compile with target='cpu' to run it here."
        return (
            f"{name} was compiled for {config.name} ({config.tvm_kind}); its kernels "
            "do not run in this process (no runtime for this target here): their source and metadata are "
            "the result (.source, .artifacts, .metadata). Compile with target='cpu' to run it here."
        )

    def check_built(self, instance: Any, build: bool) -> None:
        """Raise NotRunnableError when a kernel of ``instance`` lacks what running it needs."""

    def run(self, instance: Any, arrays: Sequence[Any], collective: Callable[..., Any] | None = None) -> Any:
        """Run every fused kernel of ``instance`` on the checked ``arrays``; returns the result(s).
        ``collective``: a sharded kernel's hook for the collectives between its kernels."""
        raise NotRunnableError(self.refusal(instance.kernel.name, instance.config))

    def synchronize(self) -> None:
        """Wait for the work a call queued (a device's; the host's runs at once)."""

    def cannot_measure(self, config: Any) -> str | None:
        """Why the autotuner cannot time ``config``'s kernels in this process; None when it can."""
        if self.bench is None:
            return f"no bench times {config.codegen_kind} kernels in this process"
        return self.bench.available(config)

    def emulator(self, name: str, config: Any, cache_dir: Any = None) -> Callable[[Any, dict[str, Any]], None]:
        """``device_run(device_kernel, named)`` running each device kernel of a compile in an
        emulator (``CompiledKernel.emulate``); raises NotRunnableError where the backend has none."""
        raise NotRunnableError(f"{name}: emulate() runs Tenstorrent compiles; this one is for {config.name}")


#: The runner of the backends whose kernels do not run here (HIP: no hipcc, no runtime).
NOT_HERE = Runner()


class _WritableAlias:
    """What numpy needs to make a writable array over a read-only one's memory (see :func:`readable`)."""

    __slots__ = ("__array_interface__", "base")

    def __init__(self, array: np.ndarray) -> None:
        self.base = array  # keeps the memory alive as long as the alias
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], False)  # (address, read-only flag)
        self.__array_interface__ = interface


def readable(array: np.ndarray) -> np.ndarray:
    """An input array as a kernel can take it: itself, or for a read-only array (``np.frombuffer``,
    a read-only memory map) a writable alias of the same memory, without a copy.

    DLPack (before 1.0, which tvm-ffi asks for) cannot mark a tensor read-only, so numpy refuses to
    export one. Kernels only read their inputs, and write their outputs into fresh arrays."""
    if array.flags.writeable:
        return array
    alias = np.asarray(_WritableAlias(array))
    return alias if alias.dtype == array.dtype else alias.view(array.dtype)  # ml_dtypes travel as void
