"""The corpus of TileLang programs (tests/programs/) through tessera_tvm.lower, as a TIR user runs it.

For every program and every config it names (hopper, ampere, rocm):
- where ``tilelang.lower`` succeeds, Tessera's device source is byte-identical to it;
- where ``tilelang.lower`` fails, Tessera fails too, with a ``TesseraError`` that names the pass or
  the codegen step (never a TVM exception type);
- Hopper and Ampere kernels build a cubin with nvcc;
- programs with a CPU form (the dynamic-shape ones) run on the CPU against numpy;
- on an H100 or H200, programs with a GPU check run their Hopper build against torch.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

import tessera_tvm
from tessera_tvm import TesseraError
from tessera_tvm._tvm import jit_program, tilelang, tvm
from tessera_tvm.lower import write_artifacts
from tests.conftest import REPO
from tests.programs import corpus

CORPUS = corpus()
TARGETS = {
    "hopper": {"kind": "cuda", "arch": "sm_90a"},
    "ampere": {"kind": "cuda", "arch": "sm_80"},
    "rocm": {"kind": "hip", "mcpu": "gfx942"},
}
PAIRS = [(name, config) for name, case in CORPUS.items() for config in case.targets]
CPU_CASES = [name for name, case in CORPUS.items() if case.cpu is not None]
# Tessera's passes that change what TileLang builds because TileLang's kernel is wrong (each one's
# docstring says how): a program listed as `fixed_on` a config matches TileLang with them disabled.
TESSERA_FIXES = ["tessera.ShareWarpSpecializedState"]
GPU_CASES = [name for name, case in CORPUS.items() if case.gpu is not None and "hopper" in case.targets]

#: What the corpus must exercise (issue #13): a family or feature missing from it fails here.
REQUIRED_FEATURES = {
    "annotate_layout",
    "symbolic",
    "split_k",
    "stream_k",
    "reducer",
    "pipelined",
    "warp_specialized",
    "fp8",
    "int4",
    "fp4",
    "atomic",
    "jit_pass_configs",
}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    # Each test lowers for real: a hit from another test's compile would hide a failing pass.
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.mktemp("corpus_cache")))


def _program_and_configs(name: str):
    """The case's program as tilelang.lower takes it, and the pass configs it runs under."""
    case = CORPUS[name]
    built = case.build()
    jit = jit_program(built)
    if jit is not None:
        return built, jit[0], {**jit[1], **case.pass_configs}
    return built, built, dict(case.pass_configs)


#: TileLang's result for every (program, config): the SHA-256 of its device source, or its error,
#: recorded with the pinned TileLang by `python -m tests.pipeline.test_corpus --update` (a pair that
#: is missing, or a file from another TileLang version, is lowered by TileLang live instead). Where
#: TileLang's output varies between runs, `--update-variants` adds the SHA-256 of Tessera's source
#: once TileLang itself gave it ("variants"), so that a run need not ask TileLang until it does.
GOLDEN = Path(__file__).with_name("tilelang_sources.json")


def _sha(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _recorded_pairs(path: Path, key: str, value: str) -> dict:
    """The "pairs" of the record at ``path`` if it was made under ``value`` (its ``key``), else {}."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return data["pairs"] if data.get(key) == value else {}


@functools.cache
def _golden() -> dict:
    return _recorded_pairs(GOLDEN, "tilelang", tilelang.__version__)


def _theirs(name: str, config: str) -> tuple[str | None, str]:
    """TileLang's result for a pair: its source's SHA-256 (or None) and its error (or "")."""
    entry = _golden().get(f"{name}/{config}")
    if entry is not None:
        return entry["sha256"], entry["error"]
    source, why = _tilelang(name, config)
    return (None if source is None else _sha(source)), why


@functools.cache
def _tilelang(name: str, config: str) -> tuple[str | None, str]:
    """TileLang's device source (or None and its error) for one program and config, once per session."""
    _, program, pass_configs = _program_and_configs(name)
    try:
        with tvm.transform.PassContext(config=pass_configs), tvm.target.Target(TARGETS[config]) as target:
            return tilelang.lower(program, target=target).kernel_source, ""
    except Exception as exc:  # TileLang's own failure: Tessera must fail too, in its own terms
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"


def _lower(name: str, config: str, disabled: list[str] | None = None, **kwargs):
    given, program, pass_configs = _program_and_configs(name)
    if given is not program:  # a @tilelang.jit kernel: tessera_tvm.lower applies its pass configs itself
        with tvm.transform.PassContext(disabled_pass=disabled or []):
            return tessera_tvm.lower(given, config, **kwargs)
    with tvm.transform.PassContext(config=pass_configs, disabled_pass=disabled or []):
        return tessera_tvm.lower(given, config, **kwargs)


@functools.cache
def _lowered(name: str, config: str):
    """Tessera's lowering of one pair without the toolchain, once per process: the source test and
    the cubin test of a pair share it (one xdist group, so one worker runs both)."""
    return _lower(name, config, build=False)


def _pairs(configs=("hopper", "ampere", "rocm")) -> list:
    return [pytest.param(n, c, marks=pytest.mark.xdist_group(f"corpus-{n}-{c}")) for n, c in PAIRS if c in configs]


def test_tilelangs_recorded_results_cover_the_corpus():
    # Every pair's TileLang result is recorded for the pinned TileLang (else the corpus tests lower
    # it with TileLang live, ~1 s each).
    pinned = re.search(r'"tilelang==([^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert tilelang.__version__ == pinned and json.loads(GOLDEN.read_text())["tilelang"] == pinned
    missing = sorted({f"{n}/{c}" for n, c in PAIRS} ^ set(_golden()))
    assert not missing, f"run `python -m tests.pipeline.test_corpus --update`: {missing}"


@pytest.mark.parametrize("config", sorted(TARGETS))
def test_a_recorded_result_is_what_tilelang_gives(config):
    # A pair per config, lowered by TileLang live: the recording matches what TileLang gives here.
    name = min((n for n, c in PAIRS if c == config), key=lambda n: _sha(n + config))
    source, why = _tilelang(name, config)
    entry = _golden()[f"{name}/{config}"]
    assert (entry["sha256"], entry["error"]) == (None if source is None else _sha(source), why)


def test_the_corpus_covers_the_families_and_features():
    assert len(CORPUS) >= 20
    features = {feature for case in CORPUS.values() for feature in case.features}
    assert REQUIRED_FEATURES <= features, f"missing: {sorted(REQUIRED_FEATURES - features)}"
    assert CPU_CASES, "at least one dynamic-shape program runs on the CPU"


@pytest.mark.parametrize(("name", "config"), _pairs())
def test_lowers_as_tilelang_does(name, config):
    digest, _ = _theirs(name, config)
    if digest is None:
        with pytest.raises(TesseraError) as info:
            _lower(name, config, build=False)
        message = str(info.value)
        assert message.startswith(("pass ", "codegen ")), message
        assert f"config {config!r}" in message
        return
    ours = _lowered(name, config).source
    if config in CORPUS[name].fixed_on:  # TileLang's kernel is wrong here; without the fix, the same
        assert _sha(ours) != digest, f"{name} on {config}: listed as fixed, but the fix changed nothing"
        ours = _lower(name, config, disabled=TESSERA_FIXES, build=False).source
    if _sha(ours) == digest or _sha(ours) in _golden().get(f"{name}/{config}", {}).get("variants", ()):
        return
    theirs = _tilelang(name, config)[0] or ""  # TileLang live: for the diff, or another of its outputs
    if ours != theirs and _only_workspaces_differ(ours, theirs):
        theirs = _tilelang_again_until(ours, name, config)
    if ours != theirs:
        diff = difflib.unified_diff(theirs.splitlines(True), ours.splitlines(True), "tilelang.lower", "tessera")
        pytest.fail(f"{name} on {config}: source differs from tilelang.lower\n{''.join(list(diff)[:60])}")


def _only_workspaces_differ(ours: str, theirs: str) -> bool:
    changed = [
        line
        for line in difflib.unified_diff(theirs.splitlines(), ours.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return bool(changed) and all("workspace" in line for line in changed)


def _tilelang_again_until(ours: str, name: str, config: str, tries: int = 30) -> str:
    """TileLang's own output varies between runs when a kernel has two AllReduce workspaces: which
    one is named ``workspace`` follows hash-map order (Tessera's tessera.UniqueSharedBufferNames
    fixes the choice, issue #6). Tessera's source must be one of TileLang's: ask TileLang again."""
    theirs = ""
    for _ in range(tries):
        _, program, pass_configs = _program_and_configs(name)  # a fresh program: lowering may rename in it
        with tvm.transform.PassContext(config=pass_configs), tvm.target.Target(TARGETS[config]) as target:
            theirs = tilelang.lower(program, target=target).kernel_source
        if theirs == ours:
            break
    return theirs


#: The pairs whose Hopper/Ampere build nvcc completed: the SHA-256 of what it built (device source and
#: host IR), recorded under one toolchain identity (nvcc's version, TileLang's, and how Tessera calls
#: nvcc: src/target/cuda/nvcc.py and the configs' codegen sections, not the rest of the backend, whose
#: runner or module code does not change a cubin) by `python -m tests.pipeline.test_corpus --update-nvcc`. A pair whose input is recorded
#: under this identity is known to build (nvcc is deterministic in its input) and is not built again;
#: any other, and one pair per config on every run, is built by nvcc live. (90 builds took ~2.4 s
#: each on a quiet machine, twice that under the suite's load.)
NVCC_RECORD = Path(__file__).with_name("nvcc_builds.json")
NVCC_CONFIGS = ("hopper", "ampere")


@functools.cache
def _nvcc_identity() -> str:
    import subprocess

    from tessera_tvm.target.cuda import nvcc

    version = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    codegen = json.dumps({c: tessera_tvm.load_config(c).codegen_dict for c in NVCC_CONFIGS}, sort_keys=True)
    calls = _sha(Path(nvcc.__file__).read_text() + codegen)
    return f"{version.strip().splitlines()[-1]}; tilelang {tilelang.__version__}; nvcc calls {calls[:16]}"


@functools.cache
def _nvcc_record() -> dict:
    return _recorded_pairs(NVCC_RECORD, "identity", _nvcc_identity())


def _build_input(lowered) -> str:
    return _sha(lowered.source + "\n" + lowered.host_ir)


def _always_built(config: str) -> str:
    """The pair of ``config`` nvcc builds on every run (so that nvcc itself stays in the loop)."""
    return min((n for n, c in PAIRS if c == config and _theirs(n, c)[0] is not None), key=lambda n: _sha(n + config))


@pytest.mark.nvcc
@pytest.mark.parametrize(("name", "config"), _pairs(NVCC_CONFIGS))
def test_builds_a_cubin(name, config, tmp_path):
    if _theirs(name, config)[0] is None:
        pytest.skip(f"tilelang.lower fails on {config}: {_theirs(name, config)[1]}")
    lowered = _lowered(name, config)  # the passes ran once for this pair; here nvcc builds their source
    if name != _always_built(config) and _nvcc_record().get(f"{name}/{config}") == _build_input(lowered):
        assert lowered.metadata
        return  # this exact input built with this nvcc when recorded
    files = write_artifacts(lowered, tmp_path, build=True)
    assert files["cubin"].stat().st_size > 0 and lowered.metadata


@pytest.mark.nvcc
def test_the_nvcc_record_covers_the_corpus_for_this_toolchain():
    # Under the recorded toolchain identity every buildable pair is recorded (else its cubin test builds
    # it live: correct, only slower). Another nvcc or TileLang: the record does not apply at all.
    data = json.loads(NVCC_RECORD.read_text())
    if data["identity"] != _nvcc_identity():
        pytest.skip(f"recorded under {data['identity']!r}, this is {_nvcc_identity()!r}: every cubin builds live")
    buildable = {f"{n}/{c}" for n, c in PAIRS if c in NVCC_CONFIGS and _theirs(n, c)[0] is not None}
    assert set(data["pairs"]) == buildable, "run `python -m tests.pipeline.test_corpus --update-nvcc`"


@pytest.mark.parametrize("name", CPU_CASES)
def test_runs_on_the_cpu(name):
    program, run = CORPUS[name].cpu()
    run(tessera_tvm.lower(program, "cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_CASES)
def test_runs_on_the_gpu_and_matches_torch(name, tmp_path):
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper builds (sm_90a) run on an H100 or H200")
    if _theirs(name, "hopper")[0] is None:
        pytest.skip(f"tilelang.lower fails on hopper: {_theirs(name, 'hopper')[1]}")
    CORPUS[name].gpu(_lower(name, "hopper", out_dir=tmp_path))


@pytest.mark.parametrize("name", GPU_CASES)
def test_the_gpu_check_rejects_a_kernel_that_writes_nothing(name):
    # Run here on the CPU, with torch standing in for the GPU: a check that compares nothing fails.
    pytest.importorskip("torch")
    with pytest.raises(AssertionError):
        CORPUS[name].gpu(lambda *tensors: None, device="cpu")


def test_most_programs_have_a_gpu_check():
    # Each program is checked for numbers on a GPU where one is lent; a new one should bring its check.
    hopper = [name for name, case in CORPUS.items() if "hopper" in case.targets]
    assert len(GPU_CASES) >= 0.8 * len(hopper), sorted(set(hopper) - set(GPU_CASES))


def _update_golden() -> None:
    pairs = {}
    for name, config in PAIRS:
        source, why = _tilelang(name, config)
        pairs[f"{name}/{config}"] = {"sha256": None if source is None else _sha(source), "error": why}
        print(f"{name}/{config}: {'error' if source is None else 'source'}", flush=True)
    GOLDEN.write_text(json.dumps({"tilelang": tilelang.__version__, "pairs": pairs}, indent=1, sort_keys=True) + "\n")


def _update_variants(only: list[str]) -> None:
    """Record, for the pairs whose TileLang output varies between runs (two AllReduce workspaces, see
    :func:`_tilelang_again_until`), the SHA-256 of Tessera's source once TileLang has given that
    same source: a later run matches it without lowering with TileLang again (10-15 s a pair)."""
    data = json.loads(GOLDEN.read_text())
    for (name, config), entry in ((p, data["pairs"][f"{p[0]}/{p[1]}"]) for p in PAIRS):
        if entry["sha256"] is None or (only and f"{name}/{config}" not in only):
            continue
        disabled = TESSERA_FIXES if config in CORPUS[name].fixed_on else None
        ours = _lower(name, config, disabled=disabled, build=False).source
        if _sha(ours) == entry["sha256"] or _sha(ours) in entry.get("variants", ()):
            continue
        theirs = _tilelang(name, config)[0] or ""
        if theirs == ours or (
            _only_workspaces_differ(ours, theirs) and _tilelang_again_until(ours, name, config) == ours
        ):
            entry["variants"] = sorted({*entry.get("variants", ()), _sha(ours)})
            print(f"{name}/{config}: a variant of TileLang's output recorded", flush=True)
    GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _update_nvcc_record() -> None:
    import tempfile

    pairs = {}
    for name, config in PAIRS:
        if config not in NVCC_CONFIGS or _theirs(name, config)[0] is None:
            continue
        lowered = _lower(name, config, build=False)
        with tempfile.TemporaryDirectory() as out:
            files = write_artifacts(lowered, Path(out), build=True)  # raises if nvcc fails
            assert files["cubin"].stat().st_size > 0
        pairs[f"{name}/{config}"] = _build_input(lowered)
        print(f"{name}/{config}: built", flush=True)
    data = {"identity": _nvcc_identity(), "pairs": pairs}
    NVCC_RECORD.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    _update_golden()
elif __name__ == "__main__" and sys.argv[1:2] == ["--update-variants"]:
    _update_variants(sys.argv[2:])  # optionally only these name/config pairs
elif __name__ == "__main__" and sys.argv[1:] == ["--update-nvcc"]:
    _update_nvcc_record()
