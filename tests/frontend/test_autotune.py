"""ts.autotune: pruning by the resource model before compiling, the tile programs candidates share,
parallel compiles and their time limit, measuring on the CPU (and on CUDA with the GPU emulated), the
tuning cache, ``sched.autotune`` and ``tessera tune``. Shapes and spaces are tiny: a real search
compiles each candidate with g++ (about a second each)."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops, tuning
from tessera.cli import main
from tessera.schedule import Schedule
from tessera_tvm.cache import KernelCache
from tessera_tvm.tile import (
    AttentionSpec,
    ElementwiseSpec,
    GemmSpec,
    Input,
    NormSpec,
    ReduceSpec,
    SoftmaxSpec,
    SpecError,
    TileSchedule,
    Unary,
    build_tile_program,
    program_fields,
)

from .helpers import assert_close, hang_block_m_16, random_array

SHAPES = {"M": 40, "N": 48, "K": 24}  # not multiples of the blocks: edges are masked
SPACE = {"block_m": [16, 32]}


@ts.kernel
def scores(X: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.softmax(ops.matmul(X, W), axis=-1)


@ts.kernel
def linear(A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16]) -> Tensor["M", "N", ts.f16]:
    return ops.matmul(A, W)


class Compiled(Exception):
    """Raised by the stand-ins below: something tried to compile or measure."""


@pytest.fixture
def nothing_compiles(monkeypatch):
    """Every way to compile or measure a candidate raises :class:`Compiled`."""

    def refuse(*args, **kwargs):
        raise Compiled()

    monkeypatch.setattr(tuning, "_compile_all", refuse)
    monkeypatch.setattr(tuning.workers, "compile_candidate", refuse)  # what _compile_all calls
    monkeypatch.setattr(tuning.WorkerPool, "run", refuse)
    monkeypatch.setattr(tuning, "_measure_all", refuse)
    monkeypatch.setattr(tessera_tvm, "lower", refuse)


def derived_config(tmp_path: Path, base: str, name: str, *, autotune=None, resources=None) -> str:
    """A copy of configs/<base>.yaml with another autotune space and/or some resource limits changed."""
    data = yaml.safe_load(Path(tessera_tvm.load_config(base).source).read_text())
    if autotune is not None:
        data["autotune"] = autotune
    data["resources"] = {**data.get("resources", {}), **(resources or {})}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


# ---------------------------------------------------------------------------------------------
# Pruning: before anything is compiled
# ---------------------------------------------------------------------------------------------


def test_a_space_that_overflows_shared_memory_is_reported_and_nothing_compiled(tmp_path, nothing_compiles):
    # Hopper has 227 KiB of shared memory per block; 4 stages of 256 x 256 f16 A and B tiles need 1 MiB.
    path = derived_config(
        tmp_path,
        "hopper",
        "hopper_huge",
        autotune={"block_m": [256, 512], "block_n": [256], "block_k": [256], "stages": [4]},
    )
    with pytest.raises(ts.AutotuneError) as info:
        ts.autotune(linear, path, shapes={"M": 4096, "N": 4096, "K": 4096}, progress=False)
    message = str(info.value)
    assert "every candidate is pruned by the resource model" in message and "nothing was compiled" in message
    assert "fused_matmul_cast (gemm): all 2 candidates pruned (the config's default schedule fits)" in message
    assert "shared memory 1024 KiB > 227 KiB: block_m=256 block_n=256 block_k=256 stages=4" in message
    assert "shared memory 1536 KiB > 227 KiB: block_m=512" in message


def test_a_cpu_config_with_tiny_local_memory_prunes_everything(tmp_path, nothing_compiles):
    # A 16 x 16 f32 accumulator is 1 KiB: every block of the space (and the default 64 x 64) is larger.
    path = derived_config(tmp_path, "cpu", "cpu_tiny", resources={"local_memory_per_kernel": 1024})
    with pytest.raises(ts.AutotuneError, match="nothing was compiled") as info:
        ts.autotune(scores, path, shapes=SHAPES, space={"block_m": [32, 64], "block_n": [32]}, progress=False)
    message = str(info.value)
    assert "matmul (gemm): all 2 candidates pruned\n" in message
    # (the sizes are the tile library's estimate: the accumulator, plus any packed panels)
    assert re.search(r"local arrays \d+ KiB > 1 KiB: (default; )?block_m=32 block_n=32", message), message
    assert re.search(r"local arrays \d+ KiB > 1 KiB: default", message), message


def test_measure_false_lists_the_candidates_without_compiling(nothing_compiles):
    # f32 tiles: the largest blocks of hopper.yaml's space overflow shared memory.
    result = ts.autotune(scores, "hopper", shapes={"M": 4096, "N": 4096, "K": 4096}, measure=False, progress=False)
    matmul, softmax = result.kernels
    statuses = {c.status for c in matmul.candidates}
    assert statuses == {"planned", "pruned", "same"} and matmul.default.status == "planned"
    pruned = [c for c in matmul.candidates if c.status == "pruned"]
    assert all(c.reason.startswith("shared memory ") and c.schedule is None for c in pruned)
    assert "shared memory 320 KiB > 227 KiB" in matmul.table()
    # Softmax reads neither block_k, stages nor overlap: 132 of the 144 points are programs already listed.
    assert (softmax.count("planned"), softmax.count("same")) == (13, 132)
    assert result.best == {} and result.schedule == {}


@pytest.mark.skipif(tuning.CudaBench.available(tessera_tvm.load_config("hopper")) is None, reason="a GPU is here")
def test_a_gpu_target_without_a_gpu_says_it_cannot_measure(nothing_compiles):
    with pytest.raises(ts.AutotuneError, match=r"cannot measure on hopper: .*measure=False lists them"):
        ts.autotune(linear, "hopper", shapes={"M": 256, "N": 256, "K": 256}, progress=False)


@ts.kernel
def attention(
    Q: Tensor["B", "H", "S", "D", ts.bf16],
    K: Tensor["B", "H", "S", "D", ts.bf16],
    V: Tensor["B", "H", "S", "D", ts.bf16],
):
    return ops.flash_attention(Q, K, V, causal=True)


ATTENTION_SHAPES = {"B": 1, "H": 8, "S": 1024, "D": 64}


def test_attention_overlap_is_a_search_field(nothing_compiles):
    space = {"block_n": [64, 128], "overlap": [False, True]}
    hopper = ts.autotune(attention, "hopper", shapes=ATTENTION_SHAPES, space=space, measure=False, progress=False)
    candidates = hopper.kernels[0].candidates
    planned = [c.schedule for c in candidates if c.status == "planned"]
    assert {(s.block_n, s.overlap) for s in planned} == {(64, False), (128, False), (64, True), (128, True)}
    # Ampere has no asynchronous wgmma: its overlap points are pruned with the reason, nothing compiled
    ampere = ts.autotune(attention, "ampere", shapes=ATTENTION_SHAPES, space=space, measure=False, progress=False)
    pruned = [c for c in ampere.kernels[0].candidates if c.status == "pruned"]
    assert len(pruned) == 2 and all("Hopper's asynchronous warpgroup MMA" in c.reason for c in pruned)


def test_same_programs_are_measured_once(nothing_compiles):
    # The CPU GEMM reads no threads: both thread counts build one program.
    result = ts.autotune(
        linear, "cpu", shapes=SHAPES, space={"block_m": [16], "threads": [1, 2]}, measure=False, progress=False
    )
    assert [(c.status, c.reason) for c in result.kernels[0].candidates] == [
        ("planned", ""),
        ("planned", ""),
        ("same", "as #1"),
    ]


def test_cpu_softmax_reads_no_block_n_or_threads(nothing_compiles):
    # The CPU softmax walks a row at a time in fixed-width vector lanes: only block_m shapes its program.
    space = {"block_n": [16, 32], "threads": [1, 2]}
    result = ts.autotune(scores, "cpu", shapes=SHAPES, space=space, measure=False, progress=False)
    matmul, softmax = result.kernels
    assert [c.status for c in matmul.candidates] == ["planned", "planned", "same", "planned", "same"]
    assert [(c.status, c.reason) for c in softmax.candidates[1:]] == [("same", "as #0")] * 4


#: One spec of every family (sizes not multiples of the blocks), for programs built by the tile library.
FAMILY_SPECS = {
    "gemm": GemmSpec(100, 96, 80, dtype_a="float16"),
    "attention": AttentionSpec(1, 2, 2, 100, 100, 32, True, dtype_in="float16"),
    "softmax": SoftmaxSpec((100, 96)),
    "norm": NormSpec("layer_norm", (100, 96)),
    "reduce": ReduceSpec((100, 96), -1),
    "elementwise": ElementwiseSpec((100, 96), (("x", (100, 96), "float32"),), Unary("exp", Input("x")), "float32"),
}
BASE = TileSchedule(block_m=32, block_n=32, block_k=16, stages=2, threads=128, rasterize=0)
#: Another value of every TileSchedule field.
CHANGED = {
    "block_m": 16,
    "block_n": 16,
    "block_k": 32,
    "stages": 3,
    "threads": 256,
    "rasterize": 4,
    "mma": (16, 8, 16),
    "overlap": True,
    "kv_packs_per_head": 2,
}


@pytest.mark.parametrize("kind", ["c", "cuda"])
@pytest.mark.parametrize("family", list(FAMILY_SPECS))
def test_program_fields_are_the_fields_the_tile_program_reads(family, kind):
    # What the autotuner trusts to measure a program once: a field said to be read changes the
    # program; any other field leaves it byte-identical.
    spec = FAMILY_SPECS[family]
    reads = program_fields(family, kind)
    assert set(reads) <= set(CHANGED) - {"mma"}
    program = build_tile_program(spec, BASE, kind).script()
    for name, value in CHANGED.items():
        changed = build_tile_program(spec, BASE.replace(**{name: value}), kind).script()
        assert (changed != program) == (name in reads), f"{family} on {kind}: {name}={value}, reads {reads}"


def test_program_fields_takes_configs_and_specs():
    assert program_fields("gemm", "cpu") == ("block_m", "block_n", "block_k")
    assert program_fields(FAMILY_SPECS["gemm"], "c") == program_fields("gemm", "cpu")
    assert program_fields("attention", "hopper") == ("block_m", "block_n", "stages", "threads", "overlap")
    assert program_fields("gemm", "tenstorrent") == ()  # one fixed 32x32 schedule
    with pytest.raises(SpecError, match="family is 'matmul'; expected one of gemm"):
        program_fields("matmul", "cpu")


def test_max_candidates_keeps_the_default_and_spreads_the_rest(nothing_compiles):
    space = {"block_m": [8, 16, 32], "block_n": [8, 16, 32]}
    result = ts.autotune(linear, "cpu", shapes=SHAPES, space=space, max_candidates=3, measure=False, progress=False)
    statuses = [c.status for c in result.kernels[0].candidates]
    assert statuses.count("planned") == 3 and statuses[0] == "planned" and statuses.count("skipped") == 7
    assert statuses[1] == "planned" and statuses[-1] == "planned"


# ---------------------------------------------------------------------------------------------
# Bad spaces
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "autotune, words",
    [
        ({"block_q": [32]}, ["autotune.block_q", "unknown key", "block_m"]),
        ({"block_m": [32, "64"]}, ["autotune.block_m[1]", "expected an int >= 1", "'64'"]),
        ({"block_m": [0]}, ["autotune.block_m[0]"]),
        ({"block_m": [32, 32]}, ["autotune.block_m", "twice"]),
        ({"block_m": 32}, ["autotune.block_m", "non-empty list"]),
        ({"swizzle": [0], "rasterize": [8]}, ["autotune.rasterize", "same field"]),
        ({"overlap": [False, 1]}, ["autotune.overlap[1]", "expected true or false", "found 1"]),
    ],
)
def test_bad_autotune_sections_are_config_errors(tmp_path, autotune, words):
    data = yaml.safe_load(Path(tessera_tvm.load_config("cpu").source).read_text())
    data["autotune"] = autotune
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(tessera_tvm.ConfigError) as info:
        tessera_tvm.load_config(path)
    assert str(path) in str(info.value)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"space": {"blok_m": [32]}}, r"space key 'blok_m' is not a schedule field \(did you mean 'block_m'\?\)"),
        ({"space": {"block_m": []}}, r"space\['block_m'\] is empty"),
        ({"space": {"block_m": [0]}}, r"space\['block_m'\] holds 0; expected an int >= 1"),
        ({"space": {"swizzle": [0], "rasterize": [8]}}, "names swizzle twice"),
        ({"space": {"overlap": [0, 1]}}, r"space\['overlap'\] holds 0; expected True or False"),
        ({"space": {"block_m": [True]}}, r"space\['block_m'\] holds True; expected an int >= 1"),
        ({"space": {}}, "declares no autotune space"),
        ({"repeats": 0}, "repeats is 0"),
        ({"max_candidates": 0}, "max_candidates is 0"),
        ({"compile_timeout": 0}, r"compile_timeout is 0; expected seconds > 0 \(None: no limit\)"),
        ({"compile_timeout": "60"}, "compile_timeout is '60'"),
    ],
)
def test_bad_options_are_autotune_errors(options, match, nothing_compiles):
    with pytest.raises(ts.AutotuneError, match=match):
        ts.autotune(linear, "cpu", shapes=SHAPES, progress=False, **options)


def test_unbound_dims_and_tenstorrent_are_rejected(nothing_compiles):
    with pytest.raises(ts.ShapeError, match="autotuning is per shape; bind K"):
        ts.autotune(linear, "cpu", shapes={"M": 40, "N": 48}, progress=False)
    with pytest.raises(ts.AutotuneError, match="fixed 32x32 tiles"):
        ts.autotune(linear, "tenstorrent", shapes=SHAPES, progress=False)


# ---------------------------------------------------------------------------------------------
# A real search on the CPU
# ---------------------------------------------------------------------------------------------


def test_cpu_search_picks_valid_schedules_that_compile_and_run(tmp_path, capfd, monkeypatch):
    # Two fused kernels (matmul, softmax), tuned one by one; 3 candidates each, 2 worker processes.
    result = ts.autotune(scores, "cpu", shapes=SHAPES, space=SPACE, workers=2, repeats=3, cache=False)
    assert not result.cached and result.workers == 2
    assert [t.kernel for t in result.kernels] == ["matmul", "softmax"]
    for tuned in result.kernels:
        assert [c.status for c in tuned.candidates] == ["measured"] * 3, tuned.table()
        s = tuned.summary
        assert s.measured == 3 and s.pruned == 0 and s.best_s <= s.median_s <= s.worst_s
        assert tuned.best.block_m == (tuned.candidates[tuned.best_index].schedule.block_m)
    err = capfd.readouterr().err
    assert "autotune: compiling 6 candidates (2 worker processes): 6/6" in err
    assert "autotune scores on cpu (M=40, N=48, K=24): 2 fused kernel(s) in" in err

    compiled = ts.compile(scores, "cpu", shapes=SHAPES, autotune=result)
    assert compiled.schedules == list(result.best.values())
    text = compiled.inspect_ir("sched")
    assert text.count("sched.autotune  best of 3 measured (0 pruned): ") == 2
    # The winning builds come from the kernel cache the workers filled (with TESSERA_DISABLE_CACHE the
    # workers used a private cache, gone with the search).
    assert all(dk.lowered.from_cache for dk in compiled.device_kernels) == KernelCache.from_env().enabled
    rng = np.random.default_rng(0)
    x, w = random_array(rng, (40, 24), ts.f32), random_array(rng, (24, 48), ts.f32)
    assert_close(compiled(x, w), scores.reference(x, w), ts.f32, "tuned scores")
    best = compiled.schedules[0]
    assert Schedule.from_json(best.to_json()) == best


def test_second_search_comes_from_the_tuning_cache(tmp_path, monkeypatch):
    first = ts.autotune(scores, "cpu", shapes=SHAPES, space=SPACE, workers=0, repeats=3, progress=False)

    def refuse(*args, **kwargs):
        raise Compiled()

    monkeypatch.setattr(tuning, "_compile_all", refuse)
    monkeypatch.setattr(tuning, "_measure_all", refuse)
    again = ts.autotune(scores, "cpu", shapes=SHAPES, space=SPACE, workers=2, repeats=3, progress=False)
    assert again.cached and again.schedule == first.schedule
    assert [t.best_index for t in again.kernels] == [t.best_index for t in first.kernels]
    assert all(s.autotune.cached for s in again.best.values())
    compiled = ts.compile(scores, "cpu", shapes=SHAPES, autotune={"space": SPACE, "workers": 2, "repeats": 3})
    assert compiled.inspect_ir("sched").count("; cached\n") == 2
    # A different space, or a different config, is a different search.
    with pytest.raises(Compiled):
        ts.autotune(scores, "cpu", shapes=SHAPES, space={"block_m": [16, 64]}, repeats=3, progress=False)
    changed = derived_config(tmp_path, "cpu", "cpu_other", resources={"local_memory_per_kernel": 1 << 19})
    with pytest.raises(Compiled):
        ts.autotune(scores, changed, shapes=SHAPES, space=SPACE, repeats=3, progress=False)


def test_a_candidate_that_fails_is_reported_not_fatal(monkeypatch):
    real = tuning.workers.compile_candidate

    def flaky(job):
        if job["schedule"].block_m == 16:
            return {"ok": False, "error": "ToolchainError: g++ exploded", "seconds": 0.0}
        return real(job)

    monkeypatch.setattr(tuning.workers, "compile_candidate", flaky)  # what _compile_all calls
    result = ts.autotune(linear, "cpu", shapes=SHAPES, space=SPACE, workers=0, repeats=1, cache=False, progress=False)
    (tuned,) = result.kernels
    assert [(c.status, c.reason) for c in tuned.candidates] == [
        ("measured", ""),
        ("failed", "ToolchainError: g++ exploded"),
        ("measured", ""),
    ]
    assert tuned.summary.failed == 1 and "1 failed" in tuned.summary.text()


class _KillsTheWorker:
    """Unpickling this in a worker ends the worker process (a crash in the middle of a compile)."""

    def __reduce__(self):
        return (os._exit, (3,))


def test_a_worker_that_dies_fails_its_job_and_the_pool_goes_on():
    answers = {}
    jobs = [("dies", {"spec": _KillsTheWorker()}), ("bad", {"no": "fields"})]
    tuning.WorkerPool(1).run(jobs, lambda tag, answer: answers.__setitem__(tag, answer))
    assert not answers["dies"]["ok"] and "the compile worker died (exit code 3)" in answers["dies"]["error"]
    assert not answers["bad"]["ok"] and answers["bad"]["error"].startswith("KeyError")
    pickle.dumps(answers)  # plain data


class _HangingCompiler:
    """Unpickled in a compile worker, as part of its job: starts a child (as g++ would be) that hangs,
    after writing its process id to ``path``."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (subprocess.run, (["sh", "-c", f"echo $$ > '{self.path}'; exec sleep 600"],))


#: The compile limit of the tests below. A cached candidate answers in under 0.1 s on an idle machine,
#: but a CI run on 2 busy cores once took over 3 s for it on Ray (2026-11-30); the hang costs this long.
LIMIT_S = 10


def test_a_compile_past_the_time_limit_fails_and_the_search_goes_on(tmp_path, monkeypatch):
    # One worker: #0 compiles, #1 hangs in a child process and is killed at the limit, #2 compiles in
    # a fresh worker. The hang would last 600 s. #0 and #2 are compiled here first (the limit is not
    # about them), so the workers find them in the kernel cache and a short limit cannot catch them.
    pid_file = tmp_path / "hung.pid"
    real_run = tuning.WorkerPool.run

    def run_with_a_hang(self, jobs, done):
        assert self.timeout == LIMIT_S
        return real_run(self, hang_block_m_16(jobs, _HangingCompiler(pid_file)), done)

    monkeypatch.setattr(tuning.WorkerPool, "run", run_with_a_hang)
    start = time.perf_counter()
    result = ts.autotune(
        linear,
        "cpu",
        shapes=SHAPES,
        space=SPACE,
        workers=1,
        repeats=1,
        cache=False,
        progress=False,
        compile_timeout=LIMIT_S,
    )
    took = time.perf_counter() - start
    (tuned,) = result.kernels
    assert [(c.status, c.schedule.block_m, c.reason) for c in tuned.candidates][1:] == [
        ("failed", 16, f"compile exceeded {LIMIT_S} s (its worker was killed)"),
        ("measured", 32, ""),
    ]
    assert tuned.default.status == "measured" and tuned.candidates[1].compile_seconds == LIMIT_S
    assert tuned.summary.failed == 1 and "1 failed" in tuned.summary.text()
    assert took < 150, took  # the limit, two worker starts, two g++ compiles: not the 600 s hang
    # The hung child went with its worker (it was in the worker's process group).
    pid = int(pid_file.read_text())
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").exists():
        assert not stat.exists() or stat.read_text().split()[2] == "Z", stat.read_text()


# ---------------------------------------------------------------------------------------------
# Measuring CUDA kernels, with the GPU emulated on the CPU
# ---------------------------------------------------------------------------------------------


@pytest.mark.nvcc
def test_cuda_measuring_runs_with_the_gpu_emulated_on_the_cpu(monkeypatch):
    """CudaBench and the measuring loop on a CUDA config, without a GPU: the candidates and their
    runtime libraries are built for real, torch CPU tensors stand in for CUDA ones, each launch runs
    the CPU target's kernel instead, and CUDA events read an emulated clock on which a launch of
    candidate #i takes COSTS[i]."""
    import torch

    import tessera_tvm.target.cuda.runner as cuda_runner
    from tessera_tvm.target.cuda.runtime import CudaKernel

    (on_cpu,) = ts.compile(linear, "cpu", shapes=SHAPES).device_kernels
    costs = [2e-3, 3e-3, 0.5e-3]
    clock = [0.0]
    libraries: list[Path] = []  # in the order of their first launch: the order candidates are prepared in
    prepared = []

    def launch(self, *tensors):  # CudaKernel.__call__: what the CUDA kernel would do, by the CPU target's
        assert all(isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.is_contiguous() for t in tensors)
        on_cpu.lowered(**{name: t.numpy() for name, t in zip(self.buffers, tensors, strict=True)})  # in place
        if self.library not in libraries:
            libraries.append(self.library)
        clock[0] += costs[libraries.index(self.library)]

    class Event:  # torch.cuda.Event, on the emulated clock
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.time = None

        def record(self, stream=None):
            self.time = clock[0]

        def elapsed_time(self, end):
            return (end.time - self.time) * 1e3  # milliseconds, as CUDA events

    real_prepare = tuning.CudaBench.prepare

    def prepare(self, lowered):
        run, out = real_prepare(self, lowered)
        prepared.append((self, out))
        return run, out

    monkeypatch.setattr(cuda_runner, "gpu_available", lambda: True)  # where the CUDA runner reads it
    monkeypatch.setattr(cuda_runner, "_default_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(CudaKernel, "__call__", launch)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(tuning.CudaBench, "prepare", prepare)
    result = ts.autotune(
        linear, "ampere", shapes=SHAPES, space={"block_m": [16, 32]}, workers=0, repeats=2, cache=False, progress=False
    )
    (tuned,) = result.kernels
    assert [c.status for c in tuned.candidates] == ["measured"] * 3, tuned.table()
    assert len(libraries) == 3 and all(lib.name.endswith(".cuda.so") for lib in libraries)
    assert [c.seconds for c in tuned.candidates] == pytest.approx(costs)  # events / calls, in seconds
    assert tuned.best_index == 2 and result.best["fused_matmul_cast"].block_m == 32
    # Each warm-up's output, read back to the host, is A @ W of the bench's inputs (in the parameter order).
    assert len(prepared) == 3
    for bench, out in prepared:
        a, w = (bench.arrays[name].float().numpy() for name in ("A", "W"))
        assert out.dtype == np.float32 and out.shape == (40, 48)
        np.testing.assert_allclose(out, a @ w, rtol=2e-2, atol=2e-2)  # f16 output: one rounding, K=24


# ---------------------------------------------------------------------------------------------
# tessera tune
# ---------------------------------------------------------------------------------------------


def test_cli_tune(tmp_path, capsys):
    source = tmp_path / "scores.py"
    source.write_text(
        "import tessera as ts\nfrom tessera import Tensor, ops\n\n"
        "@ts.kernel\n"
        'def scores(X: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:\n'
        "    return ops.softmax(ops.matmul(X, W), axis=-1)\n"
    )
    out_json = tmp_path / "tuned.json"
    rc = main(
        ["tune", str(source), "--shapes", "M=40,N=48,K=24", "--space", '{"block_m": [16, 32]}', "--repeats", "3"]
        + ["--workers", "2", "--json", str(out_json), "--quiet"]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "matmul (gemm)" in out and "softmax (softmax)" in out and "sched.autotune  best of 3" in out
    assert "schedule overrides (tessera compile --schedule '...'):" in out
    assert set(yaml.safe_load(out_json.read_text())) >= {"kernel", "kernels", "schedule"}

    rc = main(["tune", str(source), "--target", "hopper", "--shapes", "M=4096,N=4096,K=4096", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0 and "shared memory 320 KiB > 227 KiB" in out and "(not measured)" in out

    rc = main(["tune", str(source), "--shapes", "M=40", "--quiet"])
    assert rc == 1 and "autotuning is per shape" in capsys.readouterr().err


def test_cli_compile_timeout_reaches_autotune(tmp_path, capsys, monkeypatch):
    source = tmp_path / "mm.py"
    source.write_text(
        "import tessera as ts\nfrom tessera import Tensor, ops\n\n"
        "@ts.kernel\n"
        'def mm(X: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:\n'
        "    return ops.matmul(X, W)\n"
    )
    rc = main(["tune", str(source), "--shapes", "M=40,N=48,K=24", "--dry-run", "--compile-timeout", "0"])
    assert rc == 1 and "compile_timeout" in capsys.readouterr().err
    seen = {}

    def autotune(*args, **kwargs):
        seen.update(kwargs)
        raise ts.AutotuneError("stop here")

    monkeypatch.setattr(ts, "autotune", autotune)
    main(["tune", str(source), "--shapes", "M=40,N=48,K=24", "--compile-timeout", "42.5"])
    assert seen["compile_timeout"] == 42.5
