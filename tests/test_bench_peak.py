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
    flags = _cpu_flags()
    # Each loop where the CPU has its unit (AMX where Linux grants the tiles too), and only there.
    units = {"bf16": "avx512_bf16", "int8": "avx512_vnni", "amx_bf16": "amx_bf16", "amx_int8": "amx_int8"}
    for kind, flag in units.items():
        assert kind not in bench.PEAK or flag in flags, (kind, bench.ROWS)
    assert ("bf16" in bench.PEAK) == ("avx512_bf16" in flags)
    assert ("int8" in bench.PEAK) == ("avx512_vnni" in flags)
    peak_rows = [r for r in bench.ROWS if r[0] == "peak"]
    kinds = ["f32", *units]
    assert [r[-1] for r in peak_rows] == ["100%" if kind in bench.PEAK else "-" for kind in kinds]
    assert [r[2].endswith("GOP/s") for r in peak_rows if r[-1] == "100%"] == [
        kind.endswith("int8") for kind in kinds if kind in bench.PEAK
    ]
    half = bench.PEAK["f32"] / 2
    assert bench.of_peak(half) == "50%"
    assert bench.of_peak(half, "fp64") == "-"  # a kind never measured is not a percentage


def test_a_new_table_keeps_the_dated_sections_of_results_md(tmp_path):
    """bench.py rewrites its own table and keeps what follows it (the GPU runs, the sharded kernels'
    runs, measurements written by hand): a CPU-only run once erased every GPU figure."""
    bench = _bench()
    out = tmp_path / "RESULTS.md"
    out.write_text(
        "# Tessera benchmark results\n\n- date: OLD TABLE\n\n| a | b |\n\n"
        "## First GPU runs: H200\n\nGEMM 1.02x torch.matmul\n\n## Sharded kernels\n\n| x |\n"
    )
    assert bench.main(["--only", "none", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Tessera benchmark results") and "OLD TABLE" not in text
    assert text.count("## First GPU runs: H200\n\nGEMM 1.02x torch.matmul") == 1 and text.endswith(
        "## Sharded kernels\n\n| x |\n"
    )
    fresh = tmp_path / "new.md"
    assert bench.main(["--only", "none", "--out", str(fresh)]) == 0 and "## " not in fresh.read_text()
