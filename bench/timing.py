"""Timing helpers of the benchmarks, with no dependency beyond the standard library (the upstream
apache-tvm bench, bench/upstream_models.py, runs in a venv without Tessera's toolchain)."""

from __future__ import annotations

import statistics
import time


def median_time(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_medians(fns: dict, repeats: int, pause: float = 0.25, warm: float = 0.02) -> dict:
    """Median seconds of each callable, measured in rounds that run every one of them once (in a
    fresh random order each round), so machine noise hits all alike.

    Before each timed call: a pause, then untimed calls for ``warm`` seconds (at least one). Runtimes
    with worker threads (OpenBLAS, OpenMP in torch and in Tessera's kernels) spin for a while after a
    call and then sleep; without the pause the spinning threads of the previous callable take cores
    from the next one (OpenBLAS spins for tens of ms). The untimed calls wake this callable's threads
    and the idle cores (a virtual CPU that slept runs slowly for a few ms).
    """
    import random

    times: dict = {name: [] for name in fns}
    order = list(fns)
    rng = random.Random(0)
    for _ in range(repeats):
        rng.shuffle(order)
        for name in order:
            time.sleep(pause)
            until = time.perf_counter() + warm
            fns[name]()
            while time.perf_counter() < until:
                fns[name]()
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}
