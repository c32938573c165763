# ruff: noqa: F821, F722  (Tensor["M", "K", ...] dims are strings, not names)
"""Crash capture, repro packs and replay (issue #18, parts 3 and 4).

Failures made on purpose (a config whose shared-memory limit the kernel exceeds, a g++ that fails,
a call that fails) must leave a capture whose path ends the error message, and replaying it, in a
fresh process with another home, an empty cache and another working directory, must give the same
error; a pack of a working kernel must replay to the same outputs, and a pack whose saved outputs
are wrong must not.
"""

# No `from __future__ import annotations`: the kernels annotate with module-level dtypes.

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops
from tessera.repro import PackError, open_pack, restore_kernel
from tessera_tvm import capture
from tests.programs import gemm as programs

REPO = Path(__file__).resolve().parents[1]
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

FAILING_GXX = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "failing-g++ 1.0"; exit 0; fi
echo "failing-g++: error: simulated compiler failure" >&2
exit 1
"""


@ts.kernel
def linear(
    A: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]
) -> Tensor["M", "N", ts.f32]:
    return ops.relu(ops.matmul(A, W) + b)


@ts.kernel
def linear16(
    A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16], b: Tensor["N", ts.f16]
) -> Tensor["M", "N", ts.f16]:
    return ops.gelu(ops.matmul(A, W) + b)


@ts.kernel
def scaled(X: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.exp(X) * 0.5


@pytest.fixture
def repro_dir(tmp_path, monkeypatch):
    """Captures go to a private directory; the in-memory compile cache is cleared around the test."""
    from tessera.compiler import clear_cache

    root = tmp_path / "captures"
    monkeypatch.setenv("TESSERA_REPRO_DIR", str(root))
    clear_cache()
    yield root
    clear_cache()


@pytest.fixture
def failing_gxx(tmp_path):
    path = tmp_path / "bin" / "g++"
    path.parent.mkdir()
    path.write_text(FAILING_GXX)
    path.chmod(0o755)
    return path


def tiny_hopper(tmp_path) -> Path:
    """Hopper with 8 KiB of shared memory per block: the default GEMM tile does not fit."""
    data = yaml.safe_load((REPO / "configs" / "hopper.yaml").read_text())
    data["name"] = "tiny_hopper"
    data["resources"]["shared_memory_per_block"] = 8192
    path = tmp_path / "tiny_hopper.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def capture_path(exc: BaseException) -> Path:
    last = str(exc).splitlines()[-1]
    assert last.startswith("crash capture: "), f"the error does not end with its capture: {exc}"
    path = Path(last.removeprefix("crash capture: "))
    assert path.is_dir() and (path / "capture.json").is_file()
    return path


def replay_elsewhere(tmp_path, pack: Path, *args: str, env: dict | None = None, script: bool = False):
    """Replay ``pack`` in a fresh process: another HOME, an empty kernel cache, another directory."""
    home = tmp_path / f"home{len(list(tmp_path.glob('home*')))}"
    work = home / "work"
    work.mkdir(parents=True)
    # The run's precompiled C prelude stays (a compiler artifact keyed by g++ and its flags, not state
    # of the capture: another machine builds its own in the same way, 2-3 s of g++ per replay here).
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_") or k == "TESSERA_PCH_DIR"}
    environ.update(HOME=str(home), TESSERA_CACHE_DIR=str(home / "cache"), **(env or {}))
    if script:  # the pack's own replay.py, unpacked by tar
        subprocess.run(["tar", "xzf", str(pack)], cwd=work, check=True)
        (top,) = [p for p in work.iterdir() if p.is_dir()]
        command = [sys.executable, str(top / "replay.py"), *args]
    else:
        command = [sys.executable, "-m", "tessera.cli", "replay", str(pack), *args]
    proc = subprocess.run(command, cwd=work, env=environ, capture_output=True, text=True, timeout=600)
    assert not list((home / "cache").glob("repro/*")), "a replay must not write captures of its own"
    return proc


# ============================================================================ capture


def test_resource_failure_leaves_a_capture_that_replays_elsewhere(tmp_path, repro_dir):
    config = tiny_hopper(tmp_path)
    with pytest.raises(tessera_tvm.ResourceError) as info:
        ts.compile(linear16, target=str(config), shapes={"M": 256, "N": 256, "K": 256}, build=False)
    path = capture_path(info.value)
    assert path.parent == repro_dir
    record = json.loads((path / "capture.json").read_text())
    assert record["kind"] == "compile" and record["kernel"] == "linear16"
    assert record["failed_pass"] == {"name": "tessera.VerifyResources", "phase": "optimize_for_target"}
    assert record["stage"] == "optimize_for_target"
    assert record["error"]["type"] == "tessera_tvm.errors.ResourceError"
    assert "8192" in record["error"]["message"] and "crash capture" not in record["error"]["message"]
    assert record["environment"]["packages"]["tilelang"] == "0.1.15"
    assert record["environment_hash"] == capture.environment_hash(record["environment"])
    for name in ("config.yaml", "program.json", "program.py", "before_pass.json", "before_pass.py", "graph.json",
                 "kernel.json", "kernel_source.py", "log.txt"):  # fmt: skip
        assert name in record["files"], name
    assert any(n.startswith("sched/") for n in record["files"]) and any(n.startswith("tile/") for n in record["files"])
    kernel = json.loads((path / "kernel.json").read_text())
    assert kernel["shapes"] == {"M": 256, "N": 256, "K": 256}
    assert [p["name"] for p in kernel["params"]] == ["A", "W", "b"]
    log = (path / "log.txt").read_text()
    assert "Traceback" in log and "verify_resources" in log and "passes that ran" in log
    # The IR before the failing pass is the IR the pass rejects: VerifyResources alone fails on it.
    with pytest.raises(tessera_tvm.ResourceError, match="8208 bytes"):
        capture.replay_failing_pass(capture.Capture.open(path))

    pack = ts.pack_repro(path, tmp_path / "resource.tar.gz")
    proc = replay_elsewhere(tmp_path, pack)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "REPRODUCED (compile): the same error: tessera_tvm.errors.ResourceError" in proc.stdout
    assert "tessera.VerifyResources alone on before_pass.json: the same error" in proc.stdout
    proc = replay_elsewhere(tmp_path, pack, script=True)  # python replay.py, from the unpacked pack
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "REPRODUCED" in proc.stdout


def test_a_capture_whose_failure_is_gone_does_not_replay(tmp_path, repro_dir):
    """Replay can fail: the captured config with a generous limit compiles, and replay says so."""
    config = tiny_hopper(tmp_path)
    with pytest.raises(tessera_tvm.ResourceError) as info:
        ts.compile(linear16, target=str(config), shapes={"M": 256, "N": 256, "K": 256}, build=False)
    path = capture_path(info.value)
    text = (
        (path / "config.yaml").read_text().replace("shared_memory_per_block: 8192", "shared_memory_per_block: 232448")
    )
    (path / "config.yaml").write_text(text)
    with pytest.raises(PackError, match="config.yaml does not match its SHA-256"):
        ts.replay(path)  # an edited file is refused first
    record = json.loads((path / "capture.json").read_text())
    record["files"]["config.yaml"] = capture._digest(path / "config.yaml")
    (path / "capture.json").write_text(json.dumps(record))
    result = ts.replay(path)
    assert not result.reproduced and "ran without error" in result.summary


def test_schedule_failure_before_lowering_replays(tmp_path, repro_dir):
    """An override the target cannot hold fails in the schedule stage: no tile program, a capture still."""
    with pytest.raises(ts.ScheduleError) as info:
        ts.compile(
            linear16,
            target="hopper",
            shapes={"M": 256, "N": 256, "K": 256},
            schedule={"block_m": 256, "block_n": 256, "block_k": 256, "stages": 8},
            build=False,
        )
    path = capture_path(info.value)
    record = json.loads((path / "capture.json").read_text())
    assert record["stage"] == "sched" and "program.json" not in record["files"]
    assert json.loads((path / "kernel.json").read_text())["schedule"]["stages"] == 8
    result = ts.replay(path)
    assert result.reproduced, result.text()


@needs_gxx
def test_gxx_failure_capture_replays_with_the_same_compiler_only(tmp_path, repro_dir, monkeypatch, failing_gxx):
    monkeypatch.setenv("TESSERA_CXX", str(failing_gxx))
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")
    k = ts.compile(scaled, target="cpu")  # dims bound at the call: the call compiles, and fails
    x = np.linspace(-1, 1, 6 * 10, dtype=np.float32).reshape(6, 10)
    with pytest.raises(tessera_tvm.ToolchainError, match="simulated compiler failure") as info:
        k(x)
    path = capture_path(info.value)
    record = json.loads((path / "capture.json").read_text())
    assert record["kind"] == "compile" and record["stage"] == "toolchain"
    assert json.loads((path / "kernel.json").read_text())["shapes"] == {"M": 6, "N": 10}
    assert json.loads((path / "arguments.json").read_text()) == [
        {"name": "X", "shape": [6, 10], "dtype": "f32", "type": "ndarray"}
    ]
    log = (path / "log.txt").read_text()
    assert "toolchain output" in log and "simulated compiler failure" in log
    assert record["environment"]["compilers"]["g++"].endswith("failing-g++ 1.0")
    pack = ts.pack_repro(info.value, tmp_path / "gxx.tar.gz")  # an error that has a capture packs it

    proc = replay_elsewhere(tmp_path, pack, env={"TESSERA_CXX": str(failing_gxx)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the same error: tessera_tvm.errors.ToolchainError" in proc.stdout
    proc = replay_elsewhere(tmp_path, pack)  # the real g++: the failure is gone
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NOT REPRODUCED" in proc.stdout and "ran without error" in proc.stdout
    assert "environment differs: g++" in proc.stdout


@needs_gxx
def test_lower_of_a_tile_program_captures_and_replays(tmp_path, repro_dir, monkeypatch, failing_gxx):
    monkeypatch.setenv("TESSERA_CXX", str(failing_gxx))
    with pytest.raises(tessera_tvm.ToolchainError) as info:
        tessera_tvm.lower(programs.cpu_gemm(61, 37, 29), "cpu")
    path = capture_path(info.value)
    record = json.loads((path / "capture.json").read_text())
    assert record["kind"] == "lower" and "kernel.json" not in record["files"]
    assert record["program"]["build"] is True and record["pass_context"]["opt_level"] >= 0
    assert "metadata.json" in record["files"]  # the codegen got that far
    assert ts.replay(path).reproduced
    monkeypatch.delenv("TESSERA_CXX")
    result = ts.replay(path)
    assert not result.reproduced and "ran without error" in result.summary


def test_call_failure_captures_the_arguments(tmp_path, repro_dir, monkeypatch):
    from tessera.instance import Instance

    k = ts.compile(scaled, target="cpu", shapes={"M": 4, "N": 8})
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    k(x)

    def broken(self, arrays, memory=None):
        raise RuntimeError("device kernel fault (simulated)")

    monkeypatch.setattr(Instance, "run", broken)
    monkeypatch.setattr(Instance, "_run_entry", lambda self, arrays, exact_only=False: None)
    with pytest.raises(RuntimeError, match="simulated") as info:
        k(x)
    path = capture_path(info.value)
    record = json.loads((path / "capture.json").read_text())
    assert record["kind"] == "call" and record["stage"] == "call"
    saved = capture.Capture.open(path)
    from tessera.repro import _load_arrays

    np.testing.assert_array_equal(_load_arrays(saved, "inputs")[0], x)
    assert ts.replay(path).reproduced  # the fault is still there (patched in this process)
    monkeypatch.undo()
    result = ts.replay(path)
    assert not result.reproduced


def test_argument_mistakes_and_body_errors_leave_no_capture(repro_dir):
    k = ts.compile(scaled, target="cpu")
    with pytest.raises(ts.ArgumentError):
        k(np.zeros((2, 3), np.float64))

    @ts.kernel
    def bad(A: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32]):
        return ops.matmul(W, A)

    with pytest.raises(ts.ShapeError):
        ts.compile(bad, target="cpu", shapes={"M": 4, "K": 8, "N": 2})
    assert not repro_dir.exists() or not list(repro_dir.iterdir())


def test_capture_off_and_pruning(tmp_path, repro_dir, monkeypatch):
    config = tiny_hopper(tmp_path)

    def fail():
        with pytest.raises(tessera_tvm.ResourceError) as info:
            ts.compile(linear16, target=str(config), shapes={"M": 256, "N": 256, "K": 256}, build=False)
        return info.value

    monkeypatch.setenv("TESSERA_REPRO_DIR", "off")
    assert "crash capture" not in str(fail())
    monkeypatch.setenv("TESSERA_REPRO_DIR", str(repro_dir))
    with capture.disabled():
        assert "crash capture" not in str(fail())
    assert not repro_dir.exists()
    monkeypatch.setattr(capture, "KEEP", 2)
    paths = [capture_path(fail()) for _ in range(4)]
    assert sorted(p.name for p in repro_dir.iterdir()) == sorted(p.name for p in paths[-2:])


@pytest.mark.parametrize("name", tessera_tvm.available_configs())
def test_expanded_config_loads_to_the_same_pipeline(tmp_path, name):
    config = tessera_tvm.load_config(name)
    path = tmp_path / "expanded.yaml"
    path.write_text(capture.expanded_config_yaml(config))
    again = tessera_tvm.load_config(path)
    assert again.pipeline == config.pipeline
    assert (again.name, again.target, again.resources, again.features) == (
        config.name,
        config.target,
        config.resources,
        config.features,
    )
    assert "shared" not in yaml.safe_load(path.read_text())["pipeline"].values()


# ============================================================================ packs of working kernels


def test_kernel_pack_replays_its_outputs_elsewhere(tmp_path, repro_dir):
    k = ts.compile(linear, target="cpu", shapes={"M": 33, "N": 9, "K": 17})
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in ((33, 17), (17, 9), (9,))]
    pack = ts.pack_repro(k, tmp_path / "linear.tar.gz", inputs=inputs)
    members = tarfile.open(pack).getnames()
    assert any(m.endswith("/replay.py") for m in members) and any(m.endswith("/binaries/linear.so") for m in members)
    proc = replay_elsewhere(tmp_path, pack, "--run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "outputs match the saved ones (and the prebuilt library's)" in proc.stdout

    # The same pack with other saved outputs (digests updated: a consistent but wrong pack).
    work = tmp_path / "edit"
    saved = open_pack(pack, work)
    out = saved.path / saved.record["outputs"][0]["file"]
    wrong = np.frombuffer(out.read_bytes(), np.float32) + 1.0
    out.write_bytes(wrong.tobytes())
    saved.record["files"][saved.record["outputs"][0]["file"]] = capture._digest(out)
    saved.save()
    result = ts.replay(saved.path)
    assert not result.reproduced and "max |difference| 1" in result.text()


def test_restored_kernel_has_the_types_and_no_body(tmp_path, repro_dir):
    k = ts.compile(linear, target="cpu", shapes={"M": 8, "N": 4, "K": 2})
    pack = ts.pack_repro(k, tmp_path / "p.tar.gz")
    restored, shapes, schedule, build = restore_kernel(open_pack(pack, tmp_path / "u"))
    assert restored.params == linear.params and restored.result == linear.result
    assert shapes == {"M": 8, "N": 4, "K": 2} and schedule == {} and build
    assert restored.graph(shapes).text() == linear.graph(shapes).text()
    with pytest.raises(ts.KernelError, match="restored from a repro pack"):
        restored.graph({"M": 16, "N": 4, "K": 2})


def test_cli_pack_repro_of_a_kernel_file(tmp_path, repro_dir):
    from tessera.cli import main

    out = tmp_path / "lin.tar.gz"
    assert main(["pack-repro", str(REPO / "examples" / "linear.py"), "--shapes", "M=64,N=32,K=16", "-o", str(out)]) == 0
    assert main(["replay", str(out)]) == 0
    assert main(["replay", str(tmp_path / "nothing.tar.gz")]) == 2


def test_layout_annotated_program_replay_says_what_to_trust(tmp_path, repro_dir):
    """A program with T.annotate_layout loses TileLang's layout objects through TVM JSON: the replay
    says so, and the failing pass alone on before_pass.json still gives the same error."""
    from tests.programs.gemm_family import gemm_swizzle_annotated

    with pytest.raises(tessera_tvm.ResourceError) as info:
        tessera_tvm.lower(gemm_swizzle_annotated(512, 512, 512), str(tiny_hopper(tmp_path)), build=False)
    result = ts.replay(capture_path(info.value))
    text = result.text()
    assert "the tile program annotates layouts" in text
    assert "tessera.VerifyResources alone on before_pass.json: the same error" in text
