"""The examples: each compiles for every target with its SHAPES, runs on the CPU, and the graph and
schedule text of examples/linear.py are pinned as golden files (tests/golden/stages/).

Set TESSERA_UPDATE_GOLDEN=1 to rewrite the golden files after a deliberate change.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import tessera as ts

from .helpers import assert_close, random_array

EXAMPLES = ["linear", "flash_attention", "layer_norm", "softmax"]


def load(repo, name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", repo / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel_of(module) -> ts.Kernel:
    (kernel,) = [v for v in vars(module).values() if isinstance(v, ts.Kernel)]
    return kernel


def check_golden(repo, name: str, text: str) -> None:
    path = repo / "tests" / "golden" / "stages" / name
    if os.environ.get("TESSERA_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.is_file(), f"{path} missing: run with TESSERA_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name} changed; if deliberate, rerun with TESSERA_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_compiles_for_every_gpu_target(repo, name):
    module = load(repo, name)
    kernel = kernel_of(module)
    assert set(kernel.symbols) <= set(module.SHAPES)
    for target in ("hopper", "ampere", "rocm"):
        compiled = ts.compile(kernel, target=target, shapes=module.SHAPES, build=False)
        assert compiled.source and compiled.metadata


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_on_the_cpu(repo, name):
    kernel = kernel_of(load(repo, name))
    rng = np.random.default_rng(0)
    small = {"M": 70, "N": 90, "K": 40, "B": 1, "H": 4, "H_kv": 2, "S": 50, "D": 32}
    arrays = [
        random_array(rng, tuple(small.get(d, d) if isinstance(d, str) else d for d in t.dims), t.dtype, scale=0.3)
        for _, t in kernel.params
    ]
    out = ts.compile(kernel, target="cpu")(*arrays)
    assert_close(out, kernel.reference(*arrays), ts.dtype(out.dtype), name)


def test_linear_graph_and_schedule_golden(repo, monkeypatch):
    # A CPU GEMM packs B once per column where its column blocks keep the cores evenly busy: the
    # golden is CI's 2 cores, whatever this machine has.
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    module = load(repo, "linear")
    check_golden(repo, "linear.graph.txt", module.linear.inspect_ir("graph"))
    compiled = ts.compile(module.linear, target="hopper", shapes=module.SHAPES, build=False)
    check_golden(repo, "linear.hopper.sched.txt", compiled.inspect_ir("sched"))
    check_golden(
        repo,
        "linear.cpu.sched.txt",
        ts.compile(module.linear, target="cpu", shapes=module.SHAPES, build=False).inspect_ir("sched"),
    )
