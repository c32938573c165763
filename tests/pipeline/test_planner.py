"""The kernel planner (tessera_tvm.planner): one path from a kernel spec to its schedule and tile
program for ts.compile, the autotuner and Relax offload."""

from __future__ import annotations

import dataclasses

import pytest

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops
from tessera.errors import ScheduleError
from tessera.schedule import choose_schedule
from tessera_tvm import planner, tvm
from tessera_tvm.relax import partition_for_tessera
from tessera_tvm.tile import ElementwiseSpec, GemmSpec, Input, TileSchedule, Unary, build_tile_program

relax = tvm.relax
ROWS, DEPTH, COLS = 64, 32, 48


@ts.kernel
def matmul(A: Tensor["M", "K", ts.f32], W: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.matmul(A, W)


def _relax_matmul() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorStructInfo((ROWS, DEPTH), "float32"))
    w = relax.Var("w", relax.TensorStructInfo((DEPTH, COLS), "float32"))
    with bb.function("main", [a, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(a, w))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture
def planned(monkeypatch):
    """Every schedule the planner chooses in the test: (family, config name, TileSchedule)."""
    calls = []
    choose = planner.schedule_for

    def spy(spec, config, overrides=None, *, hints=None):
        tile = choose(spec, config, overrides, hints=hints)
        calls.append((spec.family, tessera_tvm.load_config(config).name, tile))
        return tile

    monkeypatch.setattr(planner, "schedule_for", spy)
    return calls


def test_ts_compile_and_relax_offload_choose_a_gemms_schedule_through_the_planner(planned):
    compiled = ts.compile(matmul, target="cpu", shapes={"M": ROWS, "K": DEPTH, "N": COLS}, build=False)
    assert [(f, c) for f, c, _ in planned] == [("gemm", "cpu")]
    _, report = partition_for_tessera(_relax_matmul(), "cpu")
    assert [o.ops for o in report.offloaded] == ["matmul"]
    relax_calls = planned[1:]  # the pattern's check, then the rewrite
    assert relax_calls and {(f, c) for f, c, _ in relax_calls} == {("gemm", "cpu")}
    # the same problem gets the same schedule whichever frontend asked
    assert {tile for _, _, tile in planned} == {compiled.schedules[0].tile_schedule()}
    assert planned[0][2] == planner.schedule_for(GemmSpec(ROWS, COLS, DEPTH, dtype_a="float32"), "cpu")


def test_an_override_the_mma_cannot_take_is_refused_with_its_reasons():
    spec = GemmSpec(256, 256, 256, dtype_a="float16")
    with pytest.raises(planner.MmaError) as info:
        planner.schedule_for(spec, "hopper", {"block_m": 48})
    assert info.value.problems == ("block_m=48 is not a multiple of the MMA's M=64",)
    with pytest.raises(
        ScheduleError, match=r"block_m=48 is not a multiple of the MMA's M=64 \(schedule.mma is 64x256x16\)"
    ):
        choose_schedule("k", "matmul", spec, "hopper", {"block_m": 48})
    assert planner.schedule_for(spec, "hopper", {"block_m": 64}).block_m == 64


def test_a_configs_programs_are_built_for_its_codegen_kind_not_its_tvm_kind():
    config = tessera_tvm.load_config("tenstorrent")
    assert (config.tvm_kind, config.codegen_kind, config.target_kind) == ("c", "tt", "c")
    spec = ElementwiseSpec((64, 64), (("x", (64, 64), "bfloat16"),), Unary("relu", Input("x")), "bfloat16")
    schedule = planner.schedule_for(spec, config)
    prim, held = planner.tile_program(spec, schedule, config, "relu_kernel")
    assert held == spec
    assert prim.script() == build_tile_program(spec, schedule, "tt", name="relu_kernel").script()
    assert prim.script() != build_tile_program(spec, schedule, "c", name="relu_kernel").script()


def test_the_cpu_holds_fp8_as_float32_and_relax_offload_refuses_a_kernel_held_otherwise(monkeypatch):
    spec = ElementwiseSpec((8, 16), (("x", (8, 16), "float8_e4m3fn"),), Unary("relu", Input("x")), "float32")
    assert planner.held_spec(spec, "cpu").operands[0].dtype == "float32"
    assert planner.held_spec(spec, "hopper") == spec
    schedule = planner.schedule_for(spec, "cpu")
    _, held = planner.tile_program(spec, schedule, "cpu", "relu_fp8")
    assert held.operands[0].dtype == "float32"

    def narrowed(spec, config):  # a backend that would hold the GEMM's float32 operands as float16
        return dataclasses.replace(spec, dtype_a="float16", dtype_b="float16") if isinstance(spec, GemmSpec) else spec

    monkeypatch.setattr(planner, "held_spec", narrowed)
    _, report = partition_for_tessera(_relax_matmul(), "cpu")
    assert report.offloaded == []
    (left,) = [n for n in report.not_offloaded if n.op == "R.matmul"]
    assert "cpu's kernels hold gemm parameters in other dtypes" in left.reason


def test_a_schedule_for_a_symbolic_dim_is_chosen_at_its_hint():
    m = tvm.tirx.Var("m", "int32")
    spec = GemmSpec(m, COLS, DEPTH, dtype_a="float32")
    assert planner.schedule_for(spec, "cpu", hints={"m": 4096}) == planner.schedule_for(
        GemmSpec(4096, COLS, DEPTH, dtype_a="float32"), "cpu"
    )
    assert isinstance(planner.schedule_for(spec, "cpu", hints={"m": 8}), TileSchedule)
