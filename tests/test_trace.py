# ruff: noqa: F821  (dim names in Tensor[...] are not Python names)
"""Chrome trace files (tessera_tvm/trace.py): compiles with their stages, passes and toolchain calls,
and calls with their argument checks, copies and device kernels, each under a seed-004 phase."""

import json
import subprocess
import sys

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops
from tessera_tvm import trace


@ts.kernel
def block(x: Tensor["M", "K", ts.f32], w: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.softmax(ops.gelu(ops.matmul(x, w) + b), axis=-1)


def _events(path):
    payload = json.loads(path.read_text())
    assert payload["displayTimeUnit"] == "ms"
    events = payload["traceEvents"]
    assert all(e["ph"] == "X" and e["cat"] in trace.PHASES and e["dur"] >= 0 for e in events)
    return events


def _inside(inner, outer) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3


def test_a_traced_compile_and_call_have_their_stages_passes_toolchain_and_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")  # every pass runs (a cache hit skips them)
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((32, 16), (16, 24), (24,)))
    path = tmp_path / "trace.json"
    with ts.trace(path):
        k = ts.compile(block, target="cpu", shapes={"M": 32, "K": 16, "N": 24})
        traced = k(x, w, b)
    assert trace.active() is None and path.is_file()
    np.testing.assert_array_equal(traced, k(x, w, b))  # the same result as the untraced call
    events = _events(path)
    by_name = {e["name"]: e for e in events}
    compile_span = by_name["compile block"]  # ts.compile: the graph passes, then the instance
    assert _inside(by_name["instance block"], compile_span)
    kernels = ["fused_matmul_add_gelu", "softmax"]
    for stage in ["graph", *(f"{s} {k}" for s in ("sched", "tile", "target") for k in kernels)]:
        assert _inside(by_name[stage], by_name["instance block"]), stage
    passes = [e for e in events if "pass_list" in e["args"]]
    assert {"tessera.AnnotateKernelMetadata", "tessera.FuseKernels"} <= {e["name"] for e in passes}
    assert {e["args"]["pass_list"] for e in passes} >= {"graph", "optimize_for_target"}
    assert all(_inside(e, compile_span) for e in passes)
    assert any(e["name"] == "g++" and "command" in e["args"] for e in events)  # the toolchain
    call = by_name["call block"]
    assert _inside(by_name["check arguments"], call)
    assert by_name["fused_matmul_add_gelu"]["cat"] == "mma" and by_name["softmax"]["cat"] == "reduce"
    assert by_name["fused_matmul_add_gelu"]["args"]["flops"] == 2 * 32 * 16 * 24
    assert all(_inside(by_name[k], call) for k in kernels)
    assert by_name["copy in softmax"]["cat"] == "copy"
    assert trace.FAMILY_PHASE[by_name["softmax"]["args"]["family"]] == "reduce"


def test_tessera_trace_traces_a_whole_process_and_writes_at_exit(tmp_path):
    path = tmp_path / "process.json"
    script = (
        "import numpy as np, tessera as ts\n"
        "from tessera import Tensor, ops\n"
        "@ts.kernel\n"
        "def relu(x: Tensor['N', ts.f32]) -> Tensor['N', ts.f32]:\n"
        "    return ops.relu(x)\n"
        "print(ts.compile(relu, target='cpu', shapes={'N': 8})(np.arange(8, dtype=np.float32) - 4).sum())\n"
    )
    env = {**__import__("os").environ, "TESSERA_TRACE": str(path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) == 6.0
    events = _events(path)
    names = {e["name"] for e in events}
    assert {"compile relu", "call relu", "check arguments"} <= names
    assert any(e["cat"] == "copy" and e["args"].get("family") == "elementwise" for e in events)  # the kernel


def test_without_a_trace_nothing_is_recorded_and_a_failing_block_still_writes(tmp_path):
    assert trace.active() is None
    with trace.span("nothing", "host"):
        pass  # no trace: a no-op
    path = tmp_path / "failed.json"
    with pytest.raises(RuntimeError, match="boom"), trace.tracing(path):
        with trace.span("before", "comm", rank=0):
            pass
        raise RuntimeError("boom")
    assert [e["name"] for e in _events(path)] == ["before"] and _events(path)[0]["args"] == {"rank": 0}
    with pytest.raises(ValueError, match="not one of"), trace.tracing(tmp_path / "bad.json"):
        with trace.span("x", "gpu"):
            pass


@pytest.mark.gpu
@pytest.mark.nvcc
def test_a_traced_gpu_call_has_a_span_per_device_kernel(tmp_path):
    """On a GPU, a traced call runs each device kernel on its own, synchronised, so each span (and
    NVTX range) covers the kernel's run; the result is the untraced call's."""
    import torch

    rng = np.random.default_rng(0)
    x, w, b = (torch.from_numpy(rng.standard_normal(s).astype(np.float32)).cuda() for s in ((128, 64), (64, 96), (96,)))
    k = ts.compile(block, target="hopper", shapes={"M": 128, "K": 64, "N": 96})
    path = tmp_path / "trace.json"
    with ts.trace(path):
        traced = k(x, w, b)
    torch.testing.assert_close(traced, k(x, w, b))
    by_name = {e["name"]: e for e in _events(path)}
    call = by_name["call block"]
    for name in ("fused_matmul_add_gelu", "softmax", "copy in softmax"):
        assert _inside(by_name[name], call), name
    assert by_name["fused_matmul_add_gelu"]["cat"] == "mma"
