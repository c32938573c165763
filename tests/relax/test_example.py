"""examples/tvm_relax.py runs: the CPU path end to end, as a user would start it."""

from __future__ import annotations

import re
import subprocess
import sys


def test_example_runs_on_the_cpu(repo):
    result = subprocess.run(
        [sys.executable, str(repo / "examples" / "tvm_relax.py")], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tir_pipeline='tessera.cpu'" in result.stdout
    error = float(re.search(r"max \|VM - numpy\| = (\S+)", result.stdout).group(1))
    assert error < 1e-4  # float32 kernels against float64 numpy
