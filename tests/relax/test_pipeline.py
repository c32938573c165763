"""The tessera.<config> TIR pipelines inside tvm.compile: registered with TVM, one pass registry.

Tessera's tile kernels go through the config's named lists (the same names `tessera passes` prints),
everything else through TVM's default TIR pipeline; an instrument in the caller's PassContext sees
both, each on its own functions.
"""

from __future__ import annotations

import tessera_tvm
from tessera_tvm import tvm
from tessera_tvm.relax import compile_module, partition_for_tessera, pipeline_name

from .test_offload import _conv_mlp


@tvm.ir.instrument.pass_instrument
class _PassesAndFunctions:
    """Each pass run: (name, names of the functions in the module it ran on)."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, frozenset[str]]] = []

    def run_before_pass(self, mod, info) -> None:
        self.runs.append((info.name, frozenset(str(gv.name_hint) for gv in mod.get_global_vars())))


def _only(funcs: frozenset[str], kernel: str) -> bool:
    """The module holds the Tessera kernel only (its host function and, after the split, its device kernel)."""
    return bool(funcs) and funcs <= {kernel, f"{kernel}_kernel"}


def test_pipelines_are_registered_with_tvm_by_config_name():
    registry = tvm.tirx.pipeline.PIPELINE_MAP
    for name in ("cpu", "hopper", "ampere", "rocm"):
        assert f"tessera.{name}" in registry
    assert "tessera.tenstorrent" not in registry
    assert tvm.tirx.get_tir_pipeline("tessera.cpu").info.name == "tessera.cpu.TIRPipeline"


def test_a_config_file_gets_its_own_pipeline(tmp_path):
    text = (tessera_tvm.config.resources.files("tessera_tvm.configs") / "hopper.yaml").read_text()
    custom = tmp_path / "hopper_no_ws.yaml"
    custom.write_text(text.replace("warp_specialization: true", "warp_specialization: false"))
    name = pipeline_name(str(custom))
    assert name.startswith("tessera.hopper.") and name != "tessera.hopper"  # same name, other passes
    assert name in tvm.tirx.pipeline.PIPELINE_MAP
    assert pipeline_name(str(custom)) == name


def test_tessera_kernels_run_the_config_lists_and_the_rest_tvm_default(monkeypatch):
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")  # lower inside tvm.compile, not from the cache
    mod, report = partition_for_tessera(_conv_mlp(), "cpu")
    (kernel,) = report.kernels
    recorder = _PassesAndFunctions()
    with tvm.transform.PassContext(instruments=[recorder]):
        compile_module(mod, "cpu")
    names = [name for name, _ in recorder.runs]
    assert "tessera.cpu.TIRPipeline" in names
    on_kernel = [name for name, funcs in recorder.runs if _only(funcs, kernel)]
    listed = tessera_tvm.pass_names("cpu")
    seen = iter(on_kernel)
    assert all(any(name == s for s in seen) for name in listed), "the config's passes, in order, on the kernel"
    # TVM's default pipeline lowered the conv1d_transpose (and the rest) in a module without Tessera's kernel,
    # and none of Tessera's or TileLang's passes touched TVM's functions.
    on_tvm = [name for name, funcs in recorder.runs if kernel not in funcs and any("conv1d" in f for f in funcs)]
    assert any(name.endswith("LowerInitBlock") for name in on_tvm)
    touched_tvm = [name for name, funcs in recorder.runs if any("conv1d" in f for f in funcs)]
    assert not [name for name in touched_tvm if name.startswith(("tl.", "tessera.")) and name in listed]


def test_partition_lowers_once_and_tvm_compile_reuses_it(monkeypatch):
    import sys

    lower_module = sys.modules["tessera_tvm.lower"]  # the module (tessera_tvm.lower is also the function)
    mod, _ = partition_for_tessera(_conv_mlp(), "cpu")
    served = []
    real = lower_module.lower

    def lower(*args, **kwargs):
        lowered = real(*args, **kwargs)
        served.append(lowered.from_cache)
        return lowered

    # (Not observed with pass instruments: a PassContext with instruments makes lowering run its passes.)
    monkeypatch.setattr(lower_module, "lower", lower)
    compile_module(mod, "cpu")
    assert served and all(served)


def test_disabled_pass_reaches_the_tessera_lists(monkeypatch):
    """PassContext(disabled_pass=[...]) acts on the config's names inside tvm.compile too."""
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")
    mod, report = partition_for_tessera(_conv_mlp(), "cpu")
    recorder = _PassesAndFunctions()
    with tvm.transform.PassContext(instruments=[recorder], disabled_pass=["tl.LoopUnswitching"]):
        compile_module(mod, "cpu")
    on_kernel = [name for name, funcs in recorder.runs if _only(funcs, report.kernels[0])]
    assert "tl.LoopUnswitching" not in on_kernel and "tl.SplitHostDevice" in on_kernel
