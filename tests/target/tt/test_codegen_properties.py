"""Properties of generated programs over random shapes: every output tile assigned exactly once,
CB pages pushed == popped on every core, every output tile written once, L1 within the budget.

The first test runs every example in the emulator (fewer examples: each builds its kernels); the
others check the plans the compiler emits for many more shapes.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tessera_tvm
from tessera_tvm.target.tt.arch import get_arch
from tessera_tvm.target.tt.emulate import run_plan, validate_plan
from tessera_tvm.target.tt.transform.common import TTResourceError

from . import programs
from .codegen_cases import config, numpy_inputs, plan_of

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

dims = st.integers(min_value=1, max_value=300)
kinds = st.sampled_from(["gemm", "gemm_bias_act", "eltwise", "unary"])


def _program(kind: str, m: int, n: int, k: int):
    if kind == "gemm":
        return programs.gemm(m, n, k)
    if kind == "gemm_bias_act":
        return programs.gemm_bias_act(m, n, k, "gelu")
    if kind == "eltwise":
        return programs.eltwise(m, n, "add")
    return programs.unary(m, n, "exp")


_ROOT = Path(tempfile.mkdtemp(prefix="tessera_tt_prop_"))  # one per process, removed at its exit
atexit.register(shutil.rmtree, _ROOT, True)


def _lower(kind, m, n, k, cfg=None):
    out = Path(tempfile.mkdtemp(dir=_ROOT))
    return tessera_tvm.lower(_program(kind, m, n, k), cfg or config(), out_dir=out), out


def _assigned_once(plan: dict) -> None:
    total = plan["schedule"]["total_tiles"]
    owned = sorted(t for core in plan["cores"] for t in range(core["tiles"][0], core["tiles"][0] + core["tiles"][1]))
    assert owned == list(range(total)), "every output tile on exactly one core"
    out = next(b for b in plan["buffers"] if b["role"] == "output")
    assert total == (out["padded_shape"][0] // 32) * (out["padded_shape"][1] // 32)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=kinds, m=dims, n=dims, k=st.integers(1, 160))
def test_emulated_programs_keep_the_protocol(tt_cache, kind, m, n, k):
    art, out = _lower(kind, m, n, k)
    plan = plan_of(art)
    _assigned_once(plan)
    result = run_plan(plan, out, numpy_inputs(plan), cache_dir=tt_cache)  # strict: raises on a violation
    for row in result.cb_balance():
        assert row["pushed"] == row["popped"], row
    writes = result.page_writes(plan["schedule"]["output"])
    assert writes == [1] * len(writes)
    budget = get_arch(plan["arch"]).l1_budget_bytes
    assert all(l1 <= budget for l1 in result.l1_bytes().values())
    shutil.rmtree(out, ignore_errors=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=kinds,
    m=st.integers(1, 1200),
    n=st.integers(1, 1200),
    k=st.integers(1, 600),
    arch=st.sampled_from(["wormhole_b0", "blackhole"]),
)
def test_schedules_cover_every_tile_once_on_the_arch_grid(kind, m, n, k, arch):
    art, out = _lower(kind, m, n, k, config(arch))
    plan = plan_of(art)
    validate_plan(plan, kernel_dir=out)  # schema, L1 budget, cores inside the grid, tiles assigned once
    _assigned_once(plan)
    spec = get_arch(arch)
    assert len(plan["cores"]) == min(plan["schedule"]["total_tiles"], spec.num_workers)
    assert len({tuple(c["core"]) for c in plan["cores"]}) == len(plan["cores"])
    shutil.rmtree(out, ignore_errors=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=kinds, m=dims, n=dims, budget=st.integers(2048, 24576))
def test_l1_within_budget_or_a_resource_error(kind, m, n, budget):
    cfg = config("wormhole_b0", l1_bytes_per_core=budget)
    try:
        art, out = _lower(kind, m, n, 64, cfg)
    except TTResourceError as error:
        assert error.amount > error.limit == budget
        return
    plan = plan_of(art)
    assert sum(cb["num_pages"] * cb["page_size"] for cb in plan["circular_buffers"]) <= budget
    shutil.rmtree(out, ignore_errors=True)
