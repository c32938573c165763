# ruff: noqa: F821  (dim names in Tensor[...] are not Python names)
"""Per-call metrics (tessera_tvm/metrics.py): rows of kernel calls, their summary and its
Prometheus text, and `tessera metrics`."""

import json
import math

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops
from tessera.cli import main
from tessera_tvm import metrics


@ts.kernel
def linear(x: Tensor["M", "K", ts.f32], w: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.matmul(x, w)


@ts.kernel
def norm(x: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.softmax(x, axis=-1)


@ts.kernel
def relu(x: Tensor["N", ts.f32]) -> Tensor["N", ts.f32]:
    return ops.relu(x)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_three_kernels_give_one_row_per_call_with_work_and_rates(tmp_path, suffix):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((32, 16), dtype=np.float32), rng.standard_normal((16, 8), dtype=np.float32)
    kernels = {
        "linear": ts.compile(linear, target="cpu", shapes={"M": 32, "K": 16, "N": 8}),
        "norm": ts.compile(norm, target="cpu", shapes={"M": 32, "N": 16}),
        "relu": ts.compile(relu, target="cpu", shapes={"N": 64}),
    }
    path = tmp_path / f"calls{suffix}"
    with ts.metrics(path):
        for _ in range(2):
            np.testing.assert_allclose(kernels["linear"](x, w), x @ w, rtol=1e-5, atol=1e-5)
            kernels["norm"](x)
            kernels["relu"](np.arange(64, dtype=np.float32))
    assert metrics.active() is None
    kernels["relu"](np.arange(64, dtype=np.float32))  # after the block: not recorded
    rows = metrics.read_rows(path)
    assert [r["kernel"] for r in rows] == ["linear", "norm", "relu"] * 2
    assert all(r["seconds"] > 0 and r["gbps"] > 0 for r in rows)
    if suffix == ".jsonl":
        by = {r["kernel"]: r for r in rows}
        assert by["linear"]["flops"] == 2 * 32 * 16 * 8 and by["linear"]["shapes"] == {"M": 32, "K": 16, "N": 8}
        assert by["linear"]["bytes"] == 4 * (32 * 16 + 16 * 8 + 32 * 8)
        assert math.isclose(by["linear"]["tflops"], by["linear"]["flops"] / by["linear"]["seconds"] / 1e12)
        assert by["norm"]["flops"] == 0 and by["norm"]["tflops"] is None  # memory-bound: GB/s only
        assert by["relu"]["grids"] and all(len(g) == 3 for g in by["relu"]["grids"])
    # The compile-time work is in the metadata too.
    assert {m["flops"] for m in kernels["linear"].metadata} == {2 * 32 * 16 * 8}


def test_the_summary_percentiles_and_prometheus_text_for_a_known_input(tmp_path):
    path = tmp_path / "known.jsonl"
    seconds = [0.001 * i for i in range(1, 21)]  # 1..20 ms for "a", one 5 ms call for "b"
    lines = [{"kernel": "a", "seconds": s, "tflops": 2.0, "gbps": 10.0} for s in seconds]
    lines.append({"kernel": "b", "seconds": 0.005, "tflops": None, "gbps": 3.0})
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    summary = metrics.summarize(metrics.read_rows(path))
    a = summary["a"]
    assert a["calls"] == 20 and a["max_seconds"] == pytest.approx(0.020)
    assert a["p50_seconds"] == pytest.approx(np.percentile(seconds, 50))  # 10.5 ms
    assert a["p95_seconds"] == pytest.approx(np.percentile(seconds, 95))  # 19.05 ms
    assert summary["b"]["p50_tflops"] is None and summary["b"]["p50_gbps"] == 3.0
    text = metrics.prometheus_text(summary)
    assert "# TYPE tessera_kernel_call_seconds summary" in text
    assert 'tessera_kernel_call_seconds{kernel="a",quantile="0.95"} 0.01905' in text
    assert 'tessera_kernel_call_seconds_count{kernel="a"} 20' in text
    assert f'tessera_kernel_call_seconds_sum{{kernel="a"}} {sum(seconds)!r}' in text


def test_the_cli_prints_the_summary_writes_prometheus_and_refuses_bad_files(tmp_path, capsys):
    path = tmp_path / "calls.jsonl"
    path.write_text(json.dumps({"kernel": "k", "seconds": 0.002, "tflops": 1.0, "gbps": 5.0}) + "\n")
    prom = tmp_path / "k.prom"
    assert main(["metrics", str(path), "--prometheus", str(prom)]) == 0
    out = capsys.readouterr().out
    assert "k" in out and "2.000" in out and prom.read_text().startswith("# HELP")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kernel": "k", "seconds": 1}\nnot json\n')
    assert main(["metrics", str(bad)]) == 2
    assert "bad.jsonl:2: not a metrics row" in capsys.readouterr().err
    assert main(["metrics", str(tmp_path / "missing.jsonl")]) == 2
    with pytest.raises(ValueError, match=".jsonl or .csv"):
        metrics.MetricsFile(tmp_path / "calls.txt")


def test_tessera_metrics_records_a_whole_process(tmp_path):
    import os
    import subprocess
    import sys

    path = tmp_path / "process.csv"
    script = (
        "import numpy as np, tessera as ts\n"
        "from tessera import Tensor, ops\n"
        "@ts.kernel\n"
        "def relu(x: Tensor['N', ts.f32]) -> Tensor['N', ts.f32]:\n"
        "    return ops.relu(x)\n"
        "k = ts.compile(relu, target='cpu', shapes={'N': 8})\n"
        "for _ in range(3): k(np.arange(8, dtype=np.float32))\n"
    )
    env = {**os.environ, "TESSERA_METRICS": str(path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert path.read_text().splitlines()[0] == ",".join(metrics.COLUMNS)
    assert [r["kernel"] for r in metrics.read_rows(path)] == ["relu"] * 3
