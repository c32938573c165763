"""Tests of tessera_tvm.target.backend: one Backend manifest per codegen kind, found from a config."""

from pathlib import Path

import pytest

from tessera_tvm.config import load_config
from tessera_tvm.target.backend import Backend, UnknownBackendError, backend_for, known_kinds, register_backend

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_the_shipped_configs_are_all_here():
    assert {p.stem for p in CONFIGS} >= {"ampere", "cpu", "hopper", "rocm", "tenstorrent"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_resolves_to_the_backend_of_its_codegen_kind(path):
    config = load_config(path)
    backend = backend_for(config)
    assert isinstance(backend, Backend)
    assert backend.kind == config.codegen_kind
    assert backend_for(config.codegen_kind) is backend


def test_tenstorrent_is_keyed_on_its_codegen_kind_not_its_tvm_kind():
    config = load_config("tenstorrent")
    assert (config.tvm_kind, config.codegen_kind) == ("c", "tt")
    assert backend_for(config).kind == "tt"
    assert backend_for("c").kind == "c"  # TVM kind c alone is the CPU


def test_an_unknown_kind_names_itself_and_the_known_kinds():
    with pytest.raises(UnknownBackendError) as caught:
        backend_for("vulkan")
    message = str(caught.value)
    assert "'vulkan'" in message
    for kind in ("c", "cuda", "hip", "tt"):
        assert kind in message
    assert set(known_kinds()) >= {"c", "cuda", "hip", "tt"}


@pytest.mark.parametrize("kind, suffix", [("cuda", ".cu"), ("hip", ".hip.cpp"), ("c", ".cpp"), ("tt", ".tt.cpp")])
def test_source_suffixes(kind, suffix):
    assert backend_for(kind).source_suffix == suffix


@pytest.mark.parametrize("kind", ["cuda", "hip", "c", "tt"])
def test_every_hook_of_a_shipped_backend_imports(kind):
    """A hook is a "module:attribute" string: a typo would only show when that path first runs."""
    backend = backend_for(kind)
    hooks = ["tile_spec", "program_generator", "build", "entry", "run", "reload", "fixed_schedule", "packed_weights"]
    for name in hooks:
        if getattr(backend, name) is not None:
            assert backend.hook(name) is not None, name
    for family in backend.tile_programs:
        assert callable(backend.tile_program(family)), family
    assert set(backend.tile_programs) == set(backend.program_fields)


def test_a_registered_backend_is_found_and_can_be_replaced():
    cpu = backend_for("c")
    try:
        custom = register_backend(Backend(**{**cpu.__dict__, "source_suffix": ".c"}))
        assert backend_for("c") is custom
    finally:
        register_backend(cpu)
    assert backend_for("c") is cpu


# ---------------------------------------------------------------------------------------------
# Runners: each backend says how its kernels run here (or why they do not)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["c", "cuda", "hip", "tt"])
def test_every_backend_gives_a_runner_or_says_why_its_kernels_do_not_run(kind):
    from tessera_tvm.target.runner import Runner

    backend = backend_for(kind)
    runner = backend.runner
    assert isinstance(runner, Runner)
    config = load_config(backend.default_config)
    if runner.runnable(None):  # runs without a compiled instance: the host binds the dims per call
        assert kind == "c" and runner.bench is not None and runner.cannot_measure(config) is None
        return
    refusal = runner.refusal("k", config)
    assert refusal.startswith(f"k was compiled for {config.name}") and "target='cpu'" in refusal
    why = runner.cannot_measure(config)
    if runner.bench is None:
        assert why == f"no bench times {kind} kernels in this process"


def test_the_runners_are_the_frontends_names():
    """tessera.gpu and tessera.tuning re-export what moved into the backends' runners."""
    import tessera.gpu as gpu
    from tessera import tuning
    from tessera_tvm.target.cpu.runner import CpuBench
    from tessera_tvm.target.cuda import runner as cuda_runner

    assert gpu.run_on_gpu is cuda_runner.run_on_gpu and gpu.TorchMemory is cuda_runner.TorchMemory
    assert tuning.CudaBench is cuda_runner.CudaBench and tuning.CpuBench is CpuBench
    assert tuning.BENCHES == {"c": CpuBench, "cuda": cuda_runner.CudaBench}
    assert backend_for("cuda").runner.device_memory and not backend_for("c").runner.device_memory


def test_emulate_is_refused_by_a_backend_without_an_emulator():
    from tessera_tvm.errors import NotRunnableError

    with pytest.raises(NotRunnableError, match=r"^k: emulate\(\) runs Tenstorrent compiles; this one is for cpu$"):
        backend_for("c").runner.emulator("k", load_config("cpu"))
    assert callable(backend_for("tt").runner.emulator("k", load_config("tenstorrent")))


# ---------------------------------------------------------------------------------------------
# No code outside src/target/<kind>/ compares a target kind with a literal
# ---------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
#: Literals that name a codegen kind, a TVM target kind, a Backend.device, a runs-on place or a config.
KIND_WORDS = {"c", "cuda", "hip", "tt", "llvm", "gpu", "cpu", "host", "tenstorrent", "hopper", "ampere", "rocm"}
#: Comparisons of such a literal that name no target: a torch tensor's device type, and a ModulePlan's
#: DLPack device type (cpu or cuda: where a runtime module's tensors live, from Backend.tensor_device).
NOT_A_TARGET = {
    ("python/tessera/instance.py", "arr.device.type != 'cpu'"),
    ("src/target/module.py", "plan.device == 'cuda'"),
}
#: The comparisons left (at most 3), each in TVM's own vocabulary at the seam with TVM:
ALLOWED = {
    # TileLang's target normaliser for ROCm, in the TVM seam (infra: below the backends, it cannot ask them).
    ("tessera_tvm/_tvm.py", "target.get('kind') == 'hip'"),
    # a TVM runtime module's type key ("c": a C source module), not a target kind.
    ("tessera_tvm/relax/bridge.py", "module.kind == 'c'"),
    # TVM's host kinds, whatever the module holds (llvm, and kinds no Tessera backend has).
    ("tessera_tvm/relax/pipeline.py", "f.attrs['target'].kind.name not in ('c', 'llvm')"),
}


def _kind_comparisons() -> set[tuple[str, str]]:
    import ast
    import re

    own = re.compile(r"^src/target/(cpu|cuda|hip|tt|tsr)/")

    def strings(node) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return set()

    found = set()
    for base in ("python/tessera", "tessera_tvm", "src"):
        for path in sorted((REPO / base).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if own.match(rel):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare):
                    literals = set().union(*(strings(o) for o in (node.left, *node.comparators)))
                    if literals & KIND_WORDS:
                        found.add((rel, ast.unparse(node)))
    return found


def test_at_most_three_comparisons_of_a_kind_with_a_literal_outside_the_backends():
    """Code outside src/target/<kind>/ asks the backend (its manifest or runner) instead of comparing a
    kind, a device or a config name with a literal; a new comparison fails here."""
    found = _kind_comparisons() - NOT_A_TARGET
    assert len(ALLOWED) <= 3
    assert found == ALLOWED, f"new: {sorted(found - ALLOWED)}; gone (drop from ALLOWED): {sorted(ALLOWED - found)}"
