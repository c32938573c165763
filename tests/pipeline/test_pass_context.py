"""LowerAndLegalize / OptimizeForTarget are TVM Sequentials of named passes: PassContext works on them."""

from __future__ import annotations

import pytest

import tessera_tvm
from tessera_tvm._tvm import tvm
from tests.programs import gemm as programs


@pytest.fixture(scope="module")
def gemm_mod():
    return tvm.IRModule({"main": programs.gemm(256, 256, 256, 64, 64, 32, stages=2)})


@tvm.ir.instrument.pass_instrument
class _Names:
    def __init__(self):
        self.names = []

    def run_before_pass(self, mod, info):
        self.names.append(info.name)


def _top_level(names: list[str], config: str, phase: str) -> list[str]:
    """The pass names an instrument saw at the level of the phase (nested inner passes dropped)."""
    expected = set(tessera_tvm.pass_names(config, phase))
    return [n for n in names if n in expected]


def test_instruments_see_the_config_pass_names_in_order(gemm_mod):
    rec = _Names()
    with tvm.transform.PassContext(instruments=[rec]):
        tessera_tvm.LowerAndLegalize(gemm_mod, "hopper")
    listed = tessera_tvm.pass_names("hopper", "lower_and_legalize")
    assert rec.names[0] == "tessera.LowerAndLegalize"
    seen = iter(rec.names)
    # Every listed pass appears, in order (inner TileLang passes may appear between them).
    assert all(any(name == s for s in seen) for name in listed)


def test_disabled_pass_skips_it(gemm_mod):
    cfg = "ampere"
    rec = _Names()
    lowered = tessera_tvm.LowerAndLegalize(gemm_mod, cfg)
    with tvm.transform.PassContext(instruments=[rec], disabled_pass=["tl.LoopUnswitching", "tl.UnrollLoop"]):
        tessera_tvm.OptimizeForTarget(lowered, cfg)
    top = _top_level(rec.names, cfg, "optimize_for_target")
    assert "tl.LoopUnswitching" not in top and "tl.UnrollLoop" not in top
    assert "tl.SplitHostDevice" in top


def test_disabled_pass_changes_the_output(gemm_mod):
    cfg = "ampere"
    lowered = tessera_tvm.LowerAndLegalize(gemm_mod, cfg)
    full = tessera_tvm.OptimizeForTarget(lowered, cfg)
    with tvm.transform.PassContext(disabled_pass=["tl.StorageRewrite"]):
        partial = tessera_tvm.OptimizeForTarget(lowered, cfg)
    assert not tvm.ir.structural_equal(full, partial)


def test_required_pass_runs_even_above_opt_level(gemm_mod):
    rec = _Names()
    with tvm.transform.PassContext(opt_level=0, required_pass=["tl.LayoutInference"], instruments=[rec]):
        tessera_tvm.LowerAndLegalize(gemm_mod, "rocm")
    assert "tl.LayoutInference" in rec.names


def test_lowering_error_names_the_pass_and_kernel():
    from tessera_tvm.errors import LoweringError

    # A fragment shape that cannot be laid out over 128 threads makes layout inference fail.
    func = programs.softmax_rows(64, 100, block_m=3)
    with pytest.raises(
        LoweringError,
        match=r"pass tl\.\w+ \((LowerAndLegalize|OptimizeForTarget), config 'hopper'\) failed on kernel\(s\) main",
    ):
        tessera_tvm.lower(func, "hopper")


@pytest.mark.parametrize("config", ["hopper", "ampere", "rocm", "cpu"])
def test_lowering_never_mutates_the_callers_program(config):
    # TileLang renames a thread Var in place on some targets; the phases must work on a copy.
    prog = programs.cpu_gemm(64, 64, 32) if config == "cpu" else programs.gemm(256, 256, 256, 64, 64, 32, stages=2)
    before = prog.script()
    first = tessera_tvm.lower(prog, config, build=False).source
    assert prog.script() == before
    assert tessera_tvm.lower(prog, config, build=False).source == first
