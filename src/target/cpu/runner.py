"""The CPU backend's runner: its kernels run here, on numpy arrays (or torch CPU tensors), in order.

A call runs the compiled instance the frontend binds from the arrays' dims (``Instance.run``: one
call of the kernel's tvm-ffi entry where it can, else kernel by kernel through ctypes), and the
autotuner times a candidate's library on numpy arrays (:class:`CpuBench`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..runner import Runner

__all__ = ["HOST_RUNNER", "CpuBench", "HostRunner", "block_note"]


class CpuBench:
    """Runs CPU kernels in this process: numpy arrays, the shared library called through ctypes."""

    on_gpu = False  # a Ray worker that measures these kernels needs no GPU

    def __init__(self, spec, seed: int = 0):
        from .loader import numpy_dtype

        rng = np.random.default_rng(seed)
        self.spec = spec
        self.arrays: dict[str, np.ndarray] = {}
        for p in spec.inputs():
            dtype = numpy_dtype(p.dtype)
            if np.issubdtype(dtype, np.integer):
                data = rng.integers(-3, 4, size=p.shape)
            else:
                data = rng.uniform(-1.0, 1.0, size=p.shape)
            self.arrays[p.name] = np.ascontiguousarray(data.astype(dtype))
        (self.out,) = spec.outputs()

    @staticmethod
    def available(config) -> str | None:
        """None when CPU kernels of ``config`` can be timed here, else why not (a library must be built)."""
        if config.codegen_dict["compiler"] == "none":
            return "the config builds no library (codegen.compiler: none)"
        return None

    def prepare(self, lowered) -> tuple[Callable[[], Any], np.ndarray]:
        """A call of ``lowered`` on this bench's arrays, and the output of its first (warm-up) run."""
        from .loader import numpy_dtype

        out = np.empty(self.out.shape, dtype=numpy_dtype(self.out.dtype))
        out.fill(np.nan if np.issubdtype(out.dtype, np.floating) else 0)  # an unwritten output shows
        run = functools.partial(
            lowered, *[out if p.name == self.out.name else self.arrays[p.name] for p in self.spec.params()]
        )
        run()  # warm-up: page faults, first touch, the library's lazy binding
        return run, out.copy()

    @staticmethod
    def sample(run: Callable[[], Any], number: int) -> float:
        """Seconds per call, over ``number`` back-to-back calls."""
        start = time.perf_counter()
        for _ in range(number):
            run()
        return (time.perf_counter() - start) / number


class HostRunner(Runner):
    """Runs a compiled instance on the host: numpy arrays in order, intermediates in numpy."""

    bench = CpuBench

    def runnable(self, instance: Any) -> bool:
        return True  # the dims may stay unbound: a call binds them from its arrays

    def run(self, instance: Any, arrays: Sequence[Any], collective: Callable[..., Any] | None = None) -> Any:
        if collective is None:  # a plain call, as the frontend made it before the runners
            return instance.run(arrays)
        return instance.run(arrays, collective=collective)


HOST_RUNNER = HostRunner()


def block_note(schedule: Any) -> str:
    """What sched.pipeline says of a CPU block (a grid not shared among threads)."""
    return " (CPU: blocks run as serial loops)"
