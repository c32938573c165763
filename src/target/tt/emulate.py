"""Run a ``tt.plan.json`` on the host: compile its kernels against the tt-metal emulator and execute.

:func:`run_plan` validates the plan (:func:`validate_plan`: JSON schema + cross-field rules such
as the L1 budget), builds the emulator runner once (cached by content hash) and every kernel as its
own shared object (``g++ -O2``, cached by source + args hash), writes the inputs to emulated DRAM
in tile layout (padded to 32x32 with zeros, bfloat16 and float16 rounded to nearest even), runs all
cores and returns the outputs (padding dropped) with the emulator's counters::

    from tessera_tvm.target.tt.emulate import run_plan
    result = run_plan("tests/target/tt/plans/gemm_single_core.json", Path("tests/target/tt/kernels"), {"A": a, "B": b})
    c = result["C"]                      # float32 array of the buffer's logical shape
    result.counters["cores"][0]["cbs"]   # per-CB pages pushed/popped, per-kernel NoC traffic, ...

Every failure is a :class:`~tessera_tvm.errors.TesseraError` naming the plan, and where it applies
the kernel, the core and the circular buffer: :class:`PlanError` (invalid plan or inputs),
:class:`KernelCompileError` (g++ rejected a kernel), :class:`EmulatorError` (a kernel misused the
API, deadlocked, stalled or crashed; or, with ``strict=True``, CB pushes != pops or an output tile
not written exactly once).

The code lives in three modules, re-exported here: :mod:`.emulate_plan` (loading and validating a
plan), :mod:`.emulate_build` (compiling the runner and the kernels) and :mod:`.emulate_run`
(:func:`run_plan` and its result).
"""

from __future__ import annotations

from . import DATA_FORMATS, TT_METAL_VERSION, as_2d_shape
from .emulate_build import KernelCompileError, build_runner, emulator_cache_dir
from .emulate_plan import PlanError, load_plan, validate_plan
from .emulate_plan import plan_schema as plan_schema  # importable from here too; not in __all__, as before
from .emulate_run import ROLES, TENSOR_ACCESSOR_INTERLEAVED_DRAM_ARGS, EmulatorError, EmulatorResult, run_plan

__all__ = [
    "PlanError",
    "KernelCompileError",
    "EmulatorError",
    "EmulatorResult",
    "load_plan",
    "validate_plan",
    "run_plan",
    "build_runner",
    "emulator_cache_dir",
    "ROLES",
    "TENSOR_ACCESSOR_INTERLEAVED_DRAM_ARGS",
]

# Re-exported for callers that only import this module.
__all__ += ["TT_METAL_VERSION", "DATA_FORMATS", "as_2d_shape"]
