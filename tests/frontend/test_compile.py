"""ts.compile: the four stages, dumps, the pass log, metadata, the cache, and running on the CPU."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops
from tessera_tvm.graph import graph_pass_names

from .helpers import assert_close, random_array


@ts.kernel
def linear(
    A: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]
) -> Tensor["M", "N", ts.f32]:
    return ops.relu(ops.matmul(A, W) + b)


@ts.kernel
def mlp_in(
    x: Tensor["M", "K", ts.f32], g: Tensor["K", ts.f32], w: Tensor["K", "N", ts.f32]
) -> Tensor["M", "N", ts.f32]:
    return ops.gelu(ops.matmul(ops.layer_norm(x, g), w))


SHAPES = {"M": 40, "N": 30, "K": 20}


def test_inspect_ir_every_stage():
    k = ts.compile(linear, target="cpu", shapes=SHAPES)
    assert "R.matmul" in k.inspect_ir("graph")
    assert k.inspect_ir("sched").startswith("sched.kernel    fused_matmul_add_relu  gemm: matmul + add + relu  [cpu]")
    tile = k.inspect_ir("tile")
    assert tile.startswith("# kernel fused_matmul_add_relu: GemmSpec(M=40, N=30, K=20")
    assert "@T.prim_func" in tile and "def fused_matmul_add_relu(" in tile
    assert "int32_t fused_matmul_add_relu_kernel(float* A, float* W, float* b, float* out)" in k.inspect_ir("target")
    assert k.source == k.inspect_ir("target")


def test_pass_log_covers_graph_schedule_tile_and_every_tvm_pass():
    k = ts.compile(mlp_in, target="cpu", shapes=SHAPES)
    log = k.pass_log
    assert [e.name for e in log[: len(graph_pass_names())]] == graph_pass_names()
    assert {e.stage for e in log} == {"graph", "sched", "tile", "target"}
    expected = [
        p.name
        for phase in ("lower_and_legalize", "optimize_for_target", "codegen_prep")
        for p in tessera_tvm.load_config("cpu").phase(phase)
    ]
    for name in [dk.name for dk in k.device_kernels]:
        ran = [e.name for e in log if e.stage == "target" and e.kernel == name]
        assert [n for n in ran if n in expected] == [n for n in expected if n in ran]
        assert len(ran) >= len(expected) - 2  # IR-conditional passes may be skipped
    assert [e.kernel for e in log if e.stage == "sched"] == [dk.name for dk in k.device_kernels]
    # Schedule choice and tile-program building are frontend steps, logged without a pass's name.
    assert {e.name for e in log if e.stage in ("sched", "tile")} == {"choose schedule", "build tile program"}


def test_metadata_and_artifacts_per_device_kernel():
    k = ts.compile(mlp_in, target="cpu", shapes=SHAPES)
    names = [dk.name for dk in k.device_kernels]
    assert names == ["layer_norm", "fused_matmul_gelu"]
    assert [m["fused_kernel"] for m in k.metadata] == names
    assert k.metadata[1]["schedule"]["family"] == "gemm"
    assert set(k.artifacts) == set(names)
    for files in k.artifacts.values():
        assert files["source"].is_file() and files["library"].is_file()


def test_dump_writes_one_file_per_stage_and_the_pass_dumps(tmp_path):
    ts.compile(mlp_in, target="cpu", shapes=SHAPES, dump=["graph", "sched", "tile", "target"], dump_dir=tmp_path)
    for name in ("graph.txt", "sched.txt", "sched.json", "tile.py", "target.cpp", "pass_log.jsonl"):
        assert (tmp_path / name).is_file(), name
    graph = (tmp_path / "graph.txt").read_text()
    assert "# ---- traced ----" in graph and "# ---- after the graph passes ----" in graph
    schedules = json.loads((tmp_path / "sched.json").read_text())
    assert [ts.Schedule.from_json(s).kernel for s in schedules] == ["layer_norm", "fused_matmul_gelu"]
    for kernel in ("layer_norm", "fused_matmul_gelu"):
        passes = sorted((tmp_path / "passes" / kernel).glob("*.py"))
        assert passes[0].name == "000_input.py" and len(passes) > 20
        assert (tmp_path / "passes" / kernel / "timing.txt").is_file()
        assert (tmp_path / "artifacts" / kernel / "metadata.json").is_file()


def test_dump_only_some_stages(tmp_path):
    ts.compile(linear, target="cpu", shapes=SHAPES, dump="graph,sched", dump_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "graph.txt",
        "pass_log.jsonl",
        "passes",
        "sched.json",
        "sched.txt",
    ]
    assert sorted(p.name for p in (tmp_path / "passes").iterdir()) == ["graph"]  # no TIR pass dumps without "target"


def test_graph_dumps_hold_the_module_after_each_graph_pass(tmp_path):
    ts.compile(linear, target="cpu", shapes=SHAPES, dump="graph", dump_dir=tmp_path)
    names = graph_pass_names("cpu")
    files = sorted(p.name for p in (tmp_path / "passes" / "graph").glob("*.py"))
    assert files[0] == "000_input.py" and [f[4:-3] for f in files[1:]] == names
    fused = (tmp_path / "passes" / "graph" / files[names.index("tessera.FuseEpilogues") + 1]).read_text()
    assert '"tessera.kernel_groups": [{"bindings": [' in fused and '"family": "gemm"' in fused
    outlined = (tmp_path / "passes" / "graph" / files[-1]).read_text()
    assert "@R.function(private=True)" in outlined and "tessera.kernel_groups" not in outlined
    assert "tessera.OutlineKernels" in (tmp_path / "passes" / "graph" / "timing.txt").read_text()


def test_dump_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_DUMP_DIR", str(tmp_path))
    ts.compile(linear, target="cpu", shapes={"M": 8, "N": 8, "K": 8})
    assert (tmp_path / "linear" / "tile.py").is_file() and (tmp_path / "linear" / "passes").is_dir()


def test_unknown_dump_stage():
    with pytest.raises(ts.KernelError, match=r"dump= names unknown stage\(s\) \['ptx'\]"):
        ts.compile(linear, target="cpu", shapes=SHAPES, dump=["ptx"])


def test_compiled_kernels_are_cached(monkeypatch):
    first = ts.compile(linear, target="cpu", shapes={"M": 9, "N": 9, "K": 9})
    calls = []
    original = tessera_tvm.lower
    monkeypatch.setattr(tessera_tvm, "lower", lambda *a, **k: calls.append(a) or original(*a, **k))
    again = ts.compile(linear, target="cpu", shapes={"M": 9, "N": 9, "K": 9})
    assert again.device_kernels[0] is first.device_kernels[0] and calls == []
    ts.compile(linear, target="cpu", shapes={"M": 9, "N": 9, "K": 10})
    assert len(calls) == 1  # new shapes: compiled again


def test_cpu_binds_dims_from_each_call():
    cpu = ts.compile(linear, target="cpu")
    rng = np.random.default_rng(0)
    for m, k, n in [(33, 17, 65), (5, 70, 3)]:
        a, w, b = random_array(rng, (m, k), ts.f32), random_array(rng, (k, n), ts.f32), random_array(rng, n, ts.f32)
        assert_close(cpu(a, w, b), linear.reference(a, w, b), ts.f32)
    assert "sched.kernel" in cpu.inspect_ir("sched")  # the last call's shapes


def test_cpu_without_shapes_has_graph_but_no_later_stage_yet():
    cpu = ts.compile(mlp_in, target="cpu")
    assert "cls.layer_norm" in cpu.inspect_ir("graph")
    assert [e.stage for e in cpu.pass_log] == ["graph"] * len(graph_pass_names())
    with pytest.raises(
        ts.ShapeError,
        match=r"inspect_ir\('tile'\) of mlp_in needs every dim bound; M, K, N are "
        r"not: pass shapes=\{...\} to ts.compile or call the kernel on arrays first",
    ):
        cpu.inspect_ir("tile")


def test_results_are_new_arrays_inputs_untouched():
    @ts.kernel
    def passthrough(x: Tensor["M", ts.f32]) -> Tensor["M", ts.f32]:
        return x

    x = np.arange(5, dtype=np.float32)
    out = ts.compile(passthrough, target="cpu")(x)
    assert np.array_equal(out, x) and out is not x


def test_tuple_results():
    @ts.kernel
    def stats(x: Tensor["M", "N", ts.f32]) -> (Tensor["M", ts.f32], Tensor["M", ts.f32]):
        return ops.mean(x, axis=1), ops.max(x, axis=1)

    x = random_array(np.random.default_rng(1), (7, 30), ts.f32)
    mean, peak = ts.compile(stats, target="cpu")(x)
    assert_close(mean, x.mean(axis=1), ts.f32)
    assert_close(peak, x.max(axis=1), ts.f32)


def test_non_contiguous_inputs_are_accepted():
    x = random_array(np.random.default_rng(2), (30, 40), ts.f32)
    w = random_array(np.random.default_rng(3), (20, 40), ts.f32).T  # a transposed view
    b = np.zeros(20, np.float32)
    assert_close(ts.compile(linear, target="cpu")(x, w, b), linear.reference(x, w, b), ts.f32)


def test_compile_needs_a_kernel():
    with pytest.raises(TypeError, match="ts.compile takes a @tessera.kernel"):
        ts.compile(lambda x: x, target="cpu")


def test_dumps_of_a_cpu_kernel_without_shapes_are_written_at_the_first_call(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_DUMP_DIR", str(tmp_path))
    cpu = ts.compile(linear, target="cpu")
    assert sorted(p.name for p in (tmp_path / "linear").iterdir()) == ["graph.txt"]
    rng = np.random.default_rng(4)
    cpu(random_array(rng, (5, 6), ts.f32), random_array(rng, (6, 7), ts.f32), random_array(rng, 7, ts.f32))
    assert (tmp_path / "linear" / "sched.txt").is_file() and (tmp_path / "linear" / "target.cpp").is_file()
