"""examples/sharded.py under torchrun: what a user runs, two ranks on gloo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sharded.py"


def test_the_sharded_example_runs_under_torchrun_on_two_ranks():
    env = {**os.environ, "TESSERA_REPRO_DIR": "off", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert f"rank {rank}: tensor parallel: result [64, 128], max error" in done.stdout
        assert f"rank {rank}: sequence parallel: result [32, 128], max error" in done.stdout
        assert f"rank {rank}: context parallel: result [1, 4, 32, 32], max error" in done.stdout
        assert f"rank {rank}: context parallel, zigzag: result [1, 4, 32, 32], max error" in done.stdout
        assert f"rank {rank}: context parallel, all-to-all: result [1, 4, 32, 32], max error" in done.stdout
    assert "WRONG" not in done.stdout
    assert "sched.collective  all_reduce(matmul's output) over 'tp' on torch.distributed" in done.stdout
    assert "sched.collective  reduce_scatter(matmul's output) over 'tp', dim 0" in done.stdout
    assert "sched.collective  prefix(K_all_gather) over 'tp', dim 2, its first 1 piece" in done.stdout  # rank 0's
    assert "sched.collective  half(Q) over 'tp', dim 2, its second half on torch.distributed" in done.stdout
    assert "sched.collective  all_to_all(Q) over 'tp', dim 1 (split on dim 2 before)" in done.stdout


def test_the_sharded_example_says_how_to_run_it_outside_torchrun():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "torchrun --nproc-per-node 2 examples/sharded.py" in done.stderr
