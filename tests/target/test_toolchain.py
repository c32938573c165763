"""Tests of tessera_tvm.target.toolchain: finding tools, running them, atomic artifact writes."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from pathlib import Path

import pytest

from tessera_tvm.errors import TesseraError, ToolchainError, ToolchainMissingError
from tessera_tvm.target.toolchain import (
    BuildOptionError,
    CompletedRun,
    atomic_output_dir,
    find_tool,
    require_tool,
    run_tool,
    summarize_output,
    tilelang_include_dirs,
    untouched_on_failure,
    validate_artifact_name,
    write_text_atomic,
)

PY = sys.executable


# ------------------------------------------------------------------------------------ find_tool


def test_find_tool_searches_path():
    assert find_tool("sh") == shutil.which("sh")
    assert find_tool("definitely-not-a-tool-xyz") is None


def test_find_tool_honours_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_CXX", PY)  # any executable will do
    assert find_tool("g++") == PY
    monkeypatch.setenv("TESSERA_NVCC", str(tmp_path / "no" / "nvcc"))
    assert find_tool("nvcc") is None  # an explicit override never falls back to PATH


def test_require_tool_says_how_to_fix(monkeypatch, tmp_path):
    bogus = str(tmp_path / "nvcc")
    monkeypatch.setenv("TESSERA_NVCC", bogus)
    with pytest.raises(ToolchainMissingError, match="TESSERA_NVCC") as info:
        require_tool("nvcc")
    assert bogus in str(info.value)
    monkeypatch.delenv("TESSERA_NVCC")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainMissingError, match=r"nvcc not found on PATH; install the CUDA Toolkit"):
        require_tool("nvcc")


# ------------------------------------------------------------------------------------- run_tool


def test_run_tool_returns_output_and_time():
    run = run_tool([PY, "-c", "import sys; print('out'); print('err', file=sys.stderr)"])
    assert isinstance(run, CompletedRun)
    assert run.stdout.strip() == "out" and run.stderr.strip() == "err"
    assert run.output == "err\nout"
    assert run.seconds > 0


def test_run_tool_failure_names_command_and_output(tmp_path):
    cmd = [PY, "-c", "import sys; print('first error: boom', file=sys.stderr); sys.exit(3)"]
    with pytest.raises(ToolchainError) as info:
        run_tool(cmd, cwd=tmp_path)
    err = info.value
    assert not isinstance(err, ToolchainMissingError)
    assert isinstance(err, TesseraError)
    assert err.command == cmd
    assert "first error: boom" in err.output
    msg = str(err)
    assert "exit code 3" in msg and "first error: boom" in msg
    assert PY in msg and "sys.exit(3)" in msg  # the full command line, shell-quoted
    assert str(tmp_path) in msg


def test_run_tool_missing_executable(tmp_path):
    with pytest.raises(ToolchainMissingError, match="cannot run nvcc"):
        run_tool([str(tmp_path / "nvcc"), "--version"])


def test_run_tool_timeout_kills_the_tool():
    start = time.perf_counter()
    # The tool starts a grandchild: the whole process group must die, or communicate() would hang.
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])"
    with pytest.raises(ToolchainError, match=r"timed out after 0.5 s"):
        run_tool([PY, "-c", code], timeout=0.5)
    assert time.perf_counter() - start < 10


def test_run_tool_rejects_empty_command():
    with pytest.raises(BuildOptionError):
        run_tool([])


def test_summarize_output_keeps_error_lines():
    warnings = [f"header.h({i}): warning #1444-D: type deprecated\n  code\n  ^" for i in range(200)]
    text = "\n".join(warnings + ["gemm.cu(12): error: expected a ';'", "  int x", "  ^", "1 error detected"])
    short = summarize_output(text)
    assert len(short) < 1000
    assert "gemm.cu(12): error: expected a ';'" in short and "1 error detected" in short
    assert "warning" not in short
    assert summarize_output("small output\n") == "small output"
    no_errors = summarize_output("x" * 10000)  # no error line: head and tail
    assert "characters cut" in no_errors and len(no_errors) < 4000


# ------------------------------------------------------------------------------- atomic writes


def test_atomic_output_dir_moves_files_on_success(tmp_path):
    out = tmp_path / "build"
    out.mkdir()
    (out / "keep.txt").write_text("other kernel")
    (out / "k.cu").write_text("old")
    with atomic_output_dir(out) as staging:
        assert staging.parent == tmp_path and staging != out
        (staging / "k.cu").write_text("new")
        (staging / "sub").mkdir()
        (staging / "sub" / "k.json").write_text("{}")
        assert (out / "k.cu").read_text() == "old"  # nothing visible before the block ends
    assert (out / "k.cu").read_text() == "new"
    assert (out / "keep.txt").read_text() == "other kernel"
    assert (out / "sub" / "k.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build"]  # staging removed


def test_atomic_output_dir_leaves_nothing_on_failure(tmp_path):
    out = tmp_path / "build"
    with pytest.raises(RuntimeError), atomic_output_dir(out) as staging:
        (staging / "k.cu").write_text("half")
        raise RuntimeError("compiler failed")
    assert list(tmp_path.iterdir()) == []  # neither out nor the staging dir


def test_untouched_on_failure_adds_a_note(tmp_path):
    with (
        pytest.raises(ToolchainError, match="nothing was written to") as info,
        untouched_on_failure(tmp_path),
    ):
        raise ToolchainError(["nvcc", "x.cu"], "x.cu(1): error")
    assert info.value.command == ["nvcc", "x.cu"] and info.value.output == "x.cu(1): error"
    with pytest.raises(ToolchainMissingError), untouched_on_failure(tmp_path):  # the subclass is kept
        raise ToolchainMissingError(["nvcc"], "", "nvcc not found")


def test_write_text_atomic(tmp_path):
    target = tmp_path / "a" / "k.json"
    write_text_atomic(target, "one")
    write_text_atomic(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in target.parent.iterdir()] == ["k.json"]  # no temp files left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_validate_artifact_name():
    assert validate_artifact_name("gemm_128x128.v2") == "gemm_128x128.v2"
    for bad in ["", "../gemm", "a/b", ".hidden", "has space"]:
        with pytest.raises(BuildOptionError, match="not a plain file name"):
            validate_artifact_name(bad)


def test_tilelang_include_dirs_hold_the_headers():
    src, cutlass = tilelang_include_dirs()
    assert Path(src, "tl_templates", "cpp", "common.h").is_file()
    assert Path(src, "tl_templates", "cuda", "common.h").is_file()
    assert Path(cutlass, "cutlass", "cutlass.h").is_file()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the process tree from /proc")
def test_kill_process_tree_reaches_a_compiler_in_its_own_session(tmp_path):
    """A compile worker killed at its time limit takes with it the compilers run_tool started, although
    they run in sessions of their own (killing the worker's process group alone would leave them)."""
    import subprocess

    from tessera_tvm.target.toolchain import kill_process_tree

    pid_file = tmp_path / "compiler.pid"
    script = (
        "from tessera_tvm.target.toolchain import run_tool\n"
        f"run_tool(['sh', '-c', \"echo $$ > '{pid_file}'; exec sleep 600\"], timeout=600)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.time() < deadline:
        time.sleep(0.05)
    compiler = int(pid_file.read_text())
    assert os.getpgid(compiler) == compiler != os.getpgid(worker.pid)  # its own group, not the worker's
    kill_process_tree(worker.pid)
    worker.wait(timeout=10)
    deadline = time.time() + 10
    stat_file = Path(f"/proc/{compiler}/stat")
    while stat_file.exists() and stat_file.read_text().split()[2] != "Z" and time.time() < deadline:
        time.sleep(0.05)
    assert not stat_file.exists() or stat_file.read_text().split()[2] == "Z", "the compiler outlived its worker"
