"""The Tenstorrent backend's runner: its kernels do not run when called here, and a compile runs in
the tt-metal emulator on request (``CompiledKernel.emulate``: :meth:`EmulatorRunner.emulator`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..runner import Runner

__all__ = ["EMULATOR_RUNNER", "EmulatorRunner", "block_note"]


class EmulatorRunner(Runner):
    """Refuses calls (the manifest's ``not_runnable`` says why); emulates a compile's device kernels."""

    def emulator(self, name: str, config: Any, cache_dir: Any = None):
        """``device_run(device_kernel, named)``: each device kernel's ``tt.plan.json`` run by
        :func:`tessera_tvm.target.tt.emulate.run_plan` on the named numpy arrays (outputs in place)."""
        from .emulate import run_plan

        def in_emulator(device: Any, named: dict[str, Any]) -> None:
            files = device.lowered.artifacts
            plan = json.loads(Path(files["plan"]).read_text())
            shapes = {b["name"]: b["shape"] for b in plan["buffers"]}
            outputs = [b["name"] for b in plan["buffers"] if b["role"] == "output"]
            inputs = {  # each buffer as the tile program's view of it (same memory, e.g. [B*M, K])
                name: np.asarray(named[name], dtype=np.float32).reshape(shape)
                for name, shape in shapes.items()
                if name not in outputs
            }
            result = run_plan(plan, Path(files["plan"]).parent, inputs, cache_dir=cache_dir)
            for name in outputs:
                named[name][...] = np.asarray(result[name]).reshape(named[name].shape)

        return in_emulator


EMULATOR_RUNNER = EmulatorRunner()


def block_note(schedule: Any) -> str:
    """What sched.pipeline says of a Tenstorrent block: the output tiles each core loops over."""
    block = (
        "32x32 output tiles"
        if (schedule.block_m, schedule.block_n) == (32, 32)
        else (f"{schedule.block_m}x{schedule.block_n} output blocks")
    )
    return f" (Tenstorrent: each core loops over its {block})"
