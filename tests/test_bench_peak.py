"""bench/peak.cpp, the machine peak the benchmark reports every GEMM and attention figure against."""

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("tessera_bench", ROOT / "bench" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.skipif(not {"avx2", "fma"} <= _cpu_flags(), reason="peak.cpp needs AVX2 and FMA")
def test_peak_rows_and_the_fraction_of_peak_column():
    bench = _bench()
    bench.measure_peak(1)
    assert bench.PEAK["f32"] > 1.0, bench.ROWS  # GFLOP/s: any CPU with FMA does far more than 1
    assert ("bf16" in bench.PEAK) == ("avx512_bf16" in _cpu_flags())
    peak_rows = [r for r in bench.ROWS if r[0] == "peak"]
    assert [r[-1] for r in peak_rows] == ["100%", "100%" if "bf16" in bench.PEAK else "-"]
    half = bench.PEAK["f32"] / 2
    assert bench.of_peak(half) == "50%"
    assert bench.of_peak(half, "fp64") == "-"  # a kind never measured is not a percentage
