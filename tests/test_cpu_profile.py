"""tests/cpu_profile.py: the per-test wall and CPU log of a profiled run, and its summary."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests import cpu_profile


def test_a_test_that_waits_and_one_that_computes_are_told_apart(tmp_path, monkeypatch):
    log = tmp_path / "cpu.log"
    monkeypatch.setenv(cpu_profile.LOG, str(log))

    class Item:
        nodeid = "tests/x/test_a.py::test_waits"

    hook = cpu_profile.pytest_runtest_protocol(Item(), None)
    next(hook)
    time.sleep(0.3)
    subprocess.run(["sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"], check=True)  # a child's CPU
    with pytest.raises(StopIteration):
        next(hook)
    wall, own, children, node = log.read_text().split(" ", 3)
    assert node.strip() == Item.nodeid
    assert float(wall) >= 0.3 and float(children) > 0.05 and float(own) < float(wall)
    with log.open("a") as f:
        f.write("4.00 3.90 0.10 tests/x/test_b.py::test_computes\n")
    text = cpu_profile.summary(str(log))
    assert text.startswith("2 tests: ")
    waiting = text.split("waiting most")[1].splitlines()
    assert "test_waits" in waiting[2] and "test_computes" in waiting[3]  # the one that waited comes first
