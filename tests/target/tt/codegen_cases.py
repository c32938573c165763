"""Lowering the tile programs of ``programs.py`` for Tenstorrent, once per session, and running them.

``lowered(name, *args, arch=...)`` runs ``tessera_tvm.lower(program, config, out_dir=...)`` (cached:
the syntax, emulator and property tests share lowerings) and returns the ``LoweredModule`` whose
``.artifacts`` hold the five files. ``numpy_inputs`` draws inputs for a plan's input buffers.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

import tessera_tvm
from tessera_tvm.config import load_config, parse_config

from . import programs

_OUT = Path(tempfile.mkdtemp(prefix="tessera_tt_codegen_"))
atexit.register(shutil.rmtree, _OUT, True)


@functools.cache
def config(arch: str = "wormhole_b0", **resources: int):
    base = load_config("tenstorrent")
    if arch == "wormhole_b0" and not resources:
        return base
    data = dict(base.raw)
    data["tt"] = {**data["tt"], "arch": arch}
    data["resources"] = {**data.get("resources", {}), **resources}
    return parse_config(data, f"{base.source} (arch {arch})")


@functools.cache
def lowered(name: str, *args, arch: str = "wormhole_b0"):
    """``programs.<name>(*args)`` lowered for Tenstorrent, artifacts in a directory of their own."""
    out = _OUT / f"{name}_{'_'.join(map(str, args))}_{arch}"
    return tessera_tvm.lower(getattr(programs, name)(*args), config(arch), out_dir=out)


def kernel_dir(art) -> Path:
    return Path(art.artifacts["plan"]).parent


def plan_of(art) -> dict:
    """The tt.plan.json ``lower`` wrote."""
    return json.loads(Path(art.artifacts["plan"]).read_text())


def numpy_inputs(plan: dict, seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        b["name"]: (scale * rng.standard_normal(b["shape"])).astype(np.float32)
        for b in plan["buffers"]
        if b["role"] == "input"
    }
