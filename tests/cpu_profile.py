"""Where the suite's time goes: wall time and CPU time of every test (tests/README.md, "Profile").

    ./tessera.sh test -p tests.cpu_profile                 # a line per test in $TESSERA_CPU_PROFILE
    python -m tests.cpu_profile /tmp/tessera-cpu.log        # sums per file, and the tests that wait

Per test (set-up, call and tear-down together): its wall time, the CPU time of the xdist worker that
ran it (Python, TVM's passes) and of the child processes it waited for (g++, nvcc, ranks, worker
pools, fresh interpreters). What neither counts is waiting: sleeps, time limits, or work in processes
that are not the test's children (Ray's workers are the raylet's).
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import time

import pytest

LOG = "TESSERA_CPU_PROFILE"
DEFAULT_LOG = "/tmp/tessera-cpu.log"


def _now() -> tuple[float, float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _now()
    yield
    after = _now()
    wall, own, children = (b - a for a, b in zip(before, after, strict=True))
    with open(os.environ.get(LOG, DEFAULT_LOG), "a") as f:
        f.write(f"{wall:.2f} {own:.2f} {children:.2f} {item.nodeid}\n")


def summary(path: str, top: int = 25) -> str:
    rows = []
    with open(path) as f:
        for line in f:
            wall, own, children, node = line.rstrip("\n").split(" ", 3)
            rows.append((float(wall), float(own), float(children), node))
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for wall, own, children, node in rows:
        f = files[node.split("::")[0]]
        f[0], f[1], f[2], f[3] = f[0] + wall, f[1] + own, f[2] + children, f[3] + 1
    out = [
        f"{len(rows)} tests: {sum(r[0] for r in rows):.0f} s of wall time summed, "
        f"{sum(r[1] for r in rows):.0f} s CPU in the workers, {sum(r[2] for r in rows):.0f} s in their children",
        "",
        "   wall  worker children tests file",
    ]
    for name, (wall, own, children, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        out.append(f"{wall:7.1f} {own:7.1f} {children:8.1f} {n:5d} {name}")
    out += ["", "waiting most (wall - CPU):", "   wall  worker children test"]
    for wall, own, children, node in sorted(rows, key=lambda r: r[1] + r[2] - r[0])[:top]:
        out.append(f"{wall:7.1f} {own:7.1f} {children:8.1f} {node[:150]}")
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(sys.argv[1] if len(sys.argv) > 1 else os.environ.get(LOG, DEFAULT_LOG)))
