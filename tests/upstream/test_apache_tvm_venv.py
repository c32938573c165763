"""Tessera offload from upstream apache-tvm, proven on every CI run: ``./tessera.sh apache-tvm``
makes a second venv (apache-tvm 0.27, torch CPU, Tessera without its dependencies) and runs
tests/upstream/apache_tvm there, against this venv as the toolchain."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tessera_tvm.upstream.toolchain import clean_environment

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("python3") is None, reason="needs python3 to make the venv")
def test_the_apache_tvm_suite_passes_in_its_own_venv():
    env = clean_environment()  # this process imported TileLang, whose variables would reach apache-tvm
    done = subprocess.run(
        ["bash", str(ROOT / "tessera.sh"), "apache-tvm", "-q", "-rA"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    passed = [line for line in output.splitlines() if line.startswith("PASSED ")]
    assert len(passed) >= 8, output[-3000:]  # every test of tests/upstream/apache_tvm ran and passed
    assert "FAILED" not in output and "SKIPPED" not in output, output[-3000:]
