"""Schedule IR: defaults from the target config, readable text, JSON, overrides and their rejection."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops
from tessera.schedule import Schedule

SHAPES = {"M": 4096, "N": 4096, "K": 4096}


@ts.kernel
def linear(
    A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16], b: Tensor["N", ts.f16]
) -> Tensor["M", "N", ts.f16]:
    return ops.gelu(ops.matmul(A, W) + b)


def schedule_of(target, schedule=None, kernel=linear, shapes=SHAPES) -> Schedule:
    return ts.compile(kernel, target=target, shapes=shapes, schedule=schedule, build=False).schedules[0]


def test_defaults_come_from_the_config():
    s = schedule_of("ampere")
    assert (s.block_m, s.block_n, s.block_k, s.stages, s.threads) == (128, 128, 32, 3, 128)
    assert s.mma == (16, 8, 16) and not s.warp_specialized
    h = schedule_of("hopper")  # the H200 sweep's fastest 8192^3 GEMM (configs/hopper.yaml)
    assert (h.block_m, h.block_n, h.block_k, h.stages, h.threads, h.swizzle) == (128, 256, 64, 4, 256, 10)
    assert h.warp_specialized and h.launch_threads == 256 + 128
    assert h.smem_bytes == 4 * (128 * 64 + 64 * 256) * 2
    assert h.grid == (16, 32, 1)


def test_hopper_blocks_shrunk_to_a_small_problem_keep_one_consumer_warp_group():
    small = schedule_of("hopper", shapes={"M": 256, "N": 128, "K": 256})  # N=128 < the default 256
    assert (small.block_m, small.block_n, small.threads) == (128, 128, 128)
    wide = schedule_of("hopper", shapes={"M": 256, "N": 512, "K": 256})
    assert (wide.block_m, wide.block_n, wide.threads) == (128, 256, 256)
    # an override is taken as given, even where the defaults would have shrunk the threads
    assert schedule_of("hopper", {"threads": 256}, shapes={"M": 256, "N": 128, "K": 256}).threads == 256


def test_hopper_attention_takes_the_configs_attention_schedule():
    @ts.kernel
    def attention(
        Q: Tensor["B", "H", "S", "D", ts.bf16],
        K: Tensor["B", "H", "S", "D", ts.bf16],
        V: Tensor["B", "H", "S", "D", ts.bf16],
    ) -> Tensor["B", "H", "S", "D", ts.bf16]:
        return ops.flash_attention(Q, K, V)

    shapes = {"B": 1, "H": 8, "S": 1024, "D": 128}
    h = schedule_of("hopper", kernel=attention, shapes=shapes)
    assert (h.block_m, h.block_n, h.threads, h.stages) == (128, 128, 256, 2)
    a = schedule_of("ampere", kernel=attention, shapes=shapes)  # no per-kind entry: the derived default
    assert (a.block_m, a.block_n, a.threads) == (64, 64, 128)


@ts.kernel
def bf16_attention(
    Q: Tensor["B", "H", "S", "D", ts.bf16],
    K: Tensor["B", "H", "S", "D", ts.bf16],
    V: Tensor["B", "H", "S", "D", ts.bf16],
) -> Tensor["B", "H", "S", "D", ts.bf16]:
    return ops.flash_attention(Q, K, V, causal=True)


ATTENTION_SHAPES = {"B": 1, "H": 8, "S": 1024, "D": 128}


def test_attention_overlap_is_a_hopper_schedule_field():
    h = schedule_of("hopper", {"overlap": True}, kernel=bf16_attention, shapes=ATTENTION_SHAPES)
    assert h.overlap and h.stages == 2  # the overlapped loop's two K/V stages
    assert "overlap=softmax(kb)|PV(kb-1)" in h.text()
    assert Schedule.from_json(h.to_json()) == h
    assert not schedule_of("hopper", kernel=bf16_attention, shapes=ATTENTION_SHAPES).overlap  # off by default
    assert "overlap" not in schedule_of("hopper").to_json()  # JSON without it stays as it was
    # a switch of attention's program: a GEMM given it (an override for every kernel) ignores it
    assert not schedule_of("hopper", {"overlap": True}).overlap


@ts.kernel
def f32_attention(
    Q: Tensor["B", "H", "S", "D", ts.f32], K: Tensor["B", "H", "S", "D", ts.f32], V: Tensor["B", "H", "S", "D", ts.f32]
):
    return ops.flash_attention(Q, K, V)


@pytest.mark.parametrize(
    ("target", "kernel", "message"),
    [
        ("ampere", bf16_attention, "overlap issues Hopper's asynchronous warpgroup MMA (hardware.wgmma), which ampere"),
        ("cpu", bf16_attention, "overlap is a GPU attention schedule; cpu runs attention without tensor cores"),
        ("hopper", f32_attention, "overlap takes float16 or bfloat16 attention, not float32"),
    ],
    ids=["ampere", "cpu", "f32"],
)
def test_attention_overlap_where_it_cannot_run_is_rejected(target, kernel, message):
    with pytest.raises(ts.ScheduleError, match=re.escape(message)):
        schedule_of(target, {"overlap": True}, kernel=kernel, shapes=ATTENTION_SHAPES)
    with pytest.raises(ts.ScheduleError, match="schedule field overlap of kernel flash_attention is 1; expected True"):
        schedule_of("hopper", {"overlap": 1}, kernel=kernel, shapes=ATTENTION_SHAPES)


def test_a_config_may_switch_attention_overlap_on(tmp_path):
    data = yaml.safe_load(Path(tessera_tvm.load_config("hopper").source).read_text())
    data["name"] = "hopper_overlap"
    data["schedule"]["attention"]["overlap"] = True
    path = tmp_path / "hopper_overlap.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert schedule_of(str(path), kernel=bf16_attention, shapes=ATTENTION_SHAPES).overlap
    assert not schedule_of(str(path)).overlap  # the GEMM's schedule does not take it
    data["schedule"]["attention"]["overlap"] = "yes"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(tessera_tvm.errors.ConfigError, match=r"schedule.attention.overlap: expected true or false"):
        tessera_tvm.load_config(str(path))


def test_text_has_one_line_per_aspect():
    text = schedule_of("hopper").text()
    lines = text.splitlines()
    assert [line.split()[0] for line in lines] == [
        "sched.kernel",
        "sched.tile",
        "sched.pipeline",
        "sched.memory",
        "sched.swizzle",
        "sched.epilogue",
        "sched.launch",
    ]
    assert "block_m=128 block_n=256 block_k=64  mma=64x256x16" in text
    assert "A: global -> shared (128x64 f16 x4, TMA)" in text
    assert "sched.epilogue  acc f32 -> cast f16 -> bias b -> gelu_erf -> store f16" in text
    assert "grid=[16, 32, 1] threads=384 (256 compute + 128 TMA producer) smem=196608 B" in text


def test_ampere_copies_are_cp_async_not_tma():
    # Ampere has no bulk tensor copy engine; the config's tma_copy_annotation only marks copies.
    text = schedule_of("ampere").text()
    assert "A: global -> shared (128x32 f16 x3, cp.async)" in text and "TMA" not in text


def test_cpu_schedule_text():
    text = schedule_of("cpu", shapes={"M": 100, "N": 70, "K": 33}).text()
    assert "stages=1 threads=1 (CPU: the grid's blocks are shared among the cores' threads)" in text
    # 128x128 fp32 accumulator + the packed A/B panels of the GEMM micro-kernel, (128 + 64) x 64 fp32 each.
    assert "acc: local (128x128 f32)" in text and f"local={128 * 128 * 4 + 2 * (128 + 64) * 64 * 4} B" in text


def test_cpu_grid_in_schedule_and_metadata(tmp_path, monkeypatch):
    # The C kernel's grid is the loops tessera.MarkParallelGrid marks: the metadata reports the
    # blocks the threads share, the grid the schedule planned.
    shapes = {"M": 1000, "N": 1000, "K": 256}
    monkeypatch.setattr("os.cpu_count", lambda: 3)  # 4 column blocks do not keep 3 cores equally busy
    k = ts.compile(linear, target="cpu", shapes=shapes, build=False)
    (sched,) = k.schedules
    assert sched.parallel_grid and sched.grid == (4, 5, 1)  # N / 256 blocks in x, M / 224 in y
    assert k.metadata[0]["launch"]["grid"] == [4, 5, 1]
    # On 2 cores they do: a block per column packs B once and runs the column's 5 row blocks (another
    # M, so that the plan above is not reused).
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    shared = ts.compile(linear, target="cpu", shapes={**shapes, "M": 1100}, build=False)
    assert shared.schedules[0].grid == (4, 1, 1) and shared.metadata[0]["launch"]["grid"] == [4, 1, 1]
    assert "global -> workspace (packed once per block)" in shared.inspect_ir("sched")
    # A CPU config without the parallel_grid feature keeps its blocks serial, and says so.
    data = yaml.safe_load(Path(tessera_tvm.load_config("cpu").source).read_text())
    data["name"] = "cpu_serial"
    data["features"]["parallel_grid"] = False
    path = tmp_path / "cpu_serial.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    serial = ts.compile(linear, target=str(path), shapes={"M": 1000, "N": 1000, "K": 256}, build=False)
    assert not serial.schedules[0].parallel_grid
    assert "(CPU: blocks run as serial loops)" in serial.inspect_ir("sched")
    assert serial.metadata[0]["launch"]["grid"] == [1, 1, 1]


def test_json_round_trip():
    s = schedule_of("rocm")
    again = Schedule.from_json(s.to_json())
    assert again == s and hash(again) == hash(s)
    with pytest.raises(ts.ScheduleError, match=r"Schedule JSON: unknown keys \['colour'\], missing keys \[\]"):
        Schedule.from_json({**s.as_dict(), "colour": 1})


def test_override_for_every_kernel_and_by_name():
    s = schedule_of("ampere", {"block_m": 64, "stages": 2})
    assert (s.block_m, s.stages) == (64, 2)
    s = schedule_of("ampere", {"block_m": 64, "fused_matmul_cast_add_gelu": {"block_n": 64, "swizzle": 8}})
    assert (s.block_m, s.block_n, s.swizzle) == (64, 64, 8)
    assert "sched.swizzle   rasterize=8" in s.text()


def test_override_reaches_the_tile_program_and_metadata():
    k = ts.compile(
        linear, target="ampere", shapes=SHAPES, schedule={"block_m": 64, "block_n": 64, "stages": 2}, build=False
    )
    assert k.metadata[0]["launch"]["grid"] == [64, 64, 1]
    assert k.metadata[0]["tile"]["stages"] == 2


def test_decorator_form():
    @ts.schedule(block_n=64)
    @ts.kernel
    def narrow(A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16]) -> Tensor["M", "N", ts.f16]:
        return ops.matmul(A, W)

    assert schedule_of("ampere", kernel=narrow).block_n == 64
    # ts.compile's schedule= wins over the decorator's.
    assert schedule_of("ampere", {"block_n": 128}, kernel=narrow).block_n == 128

    @ts.kernel(schedule={"stages": 2})
    def staged(A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16]) -> Tensor["M", "N", ts.f16]:
        return ops.matmul(A, W)

    assert schedule_of("hopper", kernel=staged).stages == 2


@pytest.mark.parametrize(
    "target, override, message",
    [
        (
            "hopper",
            {"block_m": 256, "block_n": 256, "block_k": 128, "stages": 4},
            "schedule for kernel fused_matmul_cast_add_gelu on hopper with override {'block_m': 256, 'block_n': 256, "
            "'block_k': 128, 'stages': 4} cannot be held: it needs 524288 bytes of shared memory but target 'hopper' "
            "allows at most 232448; lower stages or block_m/block_n/block_k; rejected before lowering",
        ),
        (
            "hopper",
            {"block_m": 96},
            "schedule for kernel fused_matmul_cast_add_gelu on hopper: block_m=96 is not a multiple of the MMA's M=64 "
            "(schedule.mma is 64x256x16); rejected before lowering",
        ),
        (
            "ampere",
            {"block_n": 132},
            "block_n=132 is not a multiple of 8 (the MMA's N) (schedule.mma is 16x8x16); rejected before lowering",
        ),
        ("rocm", {"block_k": 36}, "block_k=36 is not a multiple of the MMA's K=8 (schedule.mma is 32x32x8)"),
        (
            "hopper",
            {"threads": 2048},
            "cannot be held: it needs 2048 threads per block but target 'hopper' allows at most 1024; lower "
            "schedule.threads; rejected before lowering",
        ),
        (
            "cpu",
            {"block_m": 1024, "block_n": 1024},
            # the 1024x1024 fp32 accumulator + two (1024 + 64) x 128 packed fp32 panels
            "cannot be held: it needs 5308416 bytes of local arrays but target 'cpu' allows at most 1048576",
        ),
        (
            "hopper",
            {"blok_m": 64},
            "kernel linear: schedule key 'blok_m' is neither a schedule field nor a fused kernel (did you mean "
            "'block_m'?); fields: block_m, block_n, block_k, stages, threads, swizzle, overlap, kv_packs_per_head, conv_algorithm; kernels: fused_matmul_cast_add_gelu",
        ),
        (
            "hopper",
            {"fused_matmul_cast_add_gelu": {"stages": 0}},
            "kernel linear: schedule field stages of kernel fused_matmul_cast_add_gelu is 0; expected an int >= 1",
        ),
        (
            "hopper",
            {"fused_matmul_cast_add_gelu": {"colour": 1}},
            "kernel linear: schedule['fused_matmul_cast_add_gelu'] has unknown field 'colour'",
        ),
    ],
)
def test_overrides_the_target_cannot_hold_are_rejected_before_lowering(monkeypatch, target, override, message):
    import tessera_tvm

    def must_not_lower(*args, **kwargs):
        raise AssertionError("lowered a rejected schedule")

    monkeypatch.setattr(tessera_tvm, "lower", must_not_lower)
    # On 3 cores a CPU GEMM's column blocks alone do not keep them busy: each block packs its own B
    # panel on its stack (on 2 cores B is packed once per column into the thread's workspace).
    monkeypatch.setattr("os.cpu_count", lambda: 3)
    with pytest.raises(ts.ScheduleError, match=re.escape(message)):
        ts.compile(linear, target=target, shapes=SHAPES, schedule=override)


def test_schedule_per_fused_kernel():
    @ts.kernel
    def mlp_in(
        x: Tensor["M", "K", ts.f16], g: Tensor["K", ts.f16], w: Tensor["K", "N", ts.f16]
    ) -> Tensor["M", "N", ts.f16]:
        return ops.gelu(ops.matmul(ops.layer_norm(x, g), w))

    k = ts.compile(mlp_in, target="hopper", shapes=SHAPES, build=False)
    norm, gemm = k.schedules
    assert (norm.family, norm.kernel, gemm.family) == ("norm", "layer_norm", "gemm")
    assert norm.epilogue == ("layer_norm", "* g", "store f16")
    assert k.inspect_ir("sched").count("sched.kernel") == 2


def _variant(tmp_path, base: str, name: str, hardware: dict) -> str:
    data = yaml.safe_load(Path(tessera_tvm.load_config(base).source).read_text())
    data["name"] = name
    data["hardware"] = {**data.get("hardware", {}), **hardware}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_hardware_facts_come_from_the_config(tmp_path):
    """A new target like one we have is a new YAML file: its copies, warp groups and pipeline
    rules are the `hardware:` facts, not the arch string or the target kind."""
    tma_ampere = schedule_of(_variant(tmp_path, "ampere", "ampere_tma", {"tma": True})).text()
    assert "A: global -> shared (128x32 f16 x3, TMA)" in tma_ampere
    hopper = schedule_of("hopper")
    assert hopper.warp_specialized and hopper.launch_threads == hopper.threads + 128
    wide = schedule_of(_variant(tmp_path, "hopper", "hopper_256", {"producer_threads": 256}))
    assert wide.warp_specialized and wide.launch_threads == wide.threads + 256
    assert f"threads={wide.threads + 256} ({wide.threads} compute + 256 TMA producer)" in wide.text()
    none = schedule_of(_variant(tmp_path, "hopper", "hopper_no_producers", {"producer_threads": 0}))
    assert not none.warp_specialized and none.launch_threads == none.threads
    assert Schedule.from_json(wide.to_json()) == wide


def test_causal_attention_stages_follow_pipelined_dynamic_loops(tmp_path):
    from tessera_tvm.tile import AttentionSpec, TileSchedule

    spec = AttentionSpec(1, 4, 4, 256, 256, 64, causal=True)
    assert TileSchedule.from_config("ampere", spec).stages == 1  # hardware.pipelined_dynamic_loops: false
    able = _variant(tmp_path, "ampere", "ampere_dynamic_ok", {"pipelined_dynamic_loops": True})
    assert TileSchedule.from_config(able, spec).stages == 2


@pytest.mark.parametrize(
    ("hardware", "message"),
    [
        ({"tma": "yes"}, r"hardware.tma: expected true or false"),
        ({"producer_threads": -1}, r"hardware.producer_threads: expected an int >= 0"),
        ({"wgma": True}, r"hardware.wgma: unknown key \(did you mean 'wgmma'\?\)"),
    ],
)
def test_bad_hardware_facts_are_config_errors(tmp_path, hardware, message):
    with pytest.raises(tessera_tvm.ConfigError, match=message):
        tessera_tvm.load_config(_variant(tmp_path, "hopper", "hopper_bad", hardware))
