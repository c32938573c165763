"""Every generated file passes ``g++ -std=c++17 -fsyntax-only`` against the pinned API's headers,
the plan validates against plan.schema.json, and the kernels have the structure the API requires."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

import tessera_tvm
from tessera_tvm.target.tt import INCLUDE_DIR, TT_METAL_VERSION
from tessera_tvm.target.tt.emulate import TENSOR_ACCESSOR_INTERLEAVED_DRAM_ARGS, validate_plan

from .codegen_cases import kernel_dir, lowered

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

CASES = [
    ("gemm", 64, 96, 128),
    ("gemm", 50, 70, 45),
    ("gemm", 64, 64, 64, "bfloat16", "float32", True),
    ("gemm_bias_act", 50, 70, 45, "gelu"),
    ("gemm_bias_act", 64, 64, 64, "gelu_tanh"),
    ("gemm_relu", 64, 96, 64),
    ("eltwise", 64, 128, "add"),
    ("eltwise", 45, 70, "mul"),
    ("unary", 64, 96, "exp"),
    ("unary", 33, 100, "gelu"),
    ("add_relu", 64, 64),
    ("mul_add", 64, 96),
    ("gemm", 256, 288, 64),  # all 64 cores: the host's CoreRangeSet spans 8 rows
    ("exp_relu", 64, 96),
    ("copy_through", 50, 70),
]
IDS = ["-".join(map(str, case)) for case in CASES]


def _ct_args(plan: dict, role: str) -> list[int]:
    args: list[int] = []
    for arg in plan["kernels"][role].get("compile_time_args", []):
        args.extend(TENSOR_ACCESSOR_INTERLEAVED_DRAM_ARGS if isinstance(arg, dict) else [int(arg)])
    return args


def _syntax_check(path, ct_args=None) -> subprocess.CompletedProcess:
    cmd = ["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", "-I", str(INCLUDE_DIR)]
    if ct_args:
        cmd.append("-DKERNEL_COMPILE_TIME_ARGS=" + ",".join(map(str, ct_args)))
    return subprocess.run([*cmd, str(path)], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_generated_file_passes_the_syntax_check(case):
    art = lowered(*case)
    plan = json.loads(art.artifacts["plan"].read_text())
    jobs = [
        (art.artifacts["reader"], _ct_args(plan, "reader")),
        (art.artifacts["compute"], None),
        (art.artifacts["writer"], _ct_args(plan, "writer")),
        (art.artifacts["host"], None),
    ]
    with ThreadPoolExecutor() as pool:
        results = list(pool.map(lambda job: _syntax_check(*job), jobs))
    failures = {str(path.name): proc.stderr for (path, _), proc in zip(jobs, results, strict=True) if proc.returncode}
    assert not failures, failures


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_plan_validates_and_names_the_generated_kernels(case):
    art = lowered(*case)
    plan = json.loads(art.artifacts["plan"].read_text())
    assert validate_plan(plan, kernel_dir=kernel_dir(art)).name == "wormhole_b0"
    assert plan["tt_metal_version"] == TT_METAL_VERSION
    assert {k["source"] for k in plan["kernels"].values()} == {"reader.cpp", "compute.cpp", "writer.cpp"}


def test_artifacts_and_source_of_lower():
    art = lowered("gemm_bias_act", 50, 70, 45, "gelu")
    assert {"reader", "compute", "writer", "host", "plan"} <= set(art.artifacts)
    assert [p.name for k, p in art.artifacts.items() if k in ("reader", "compute", "writer", "host", "plan")] == [
        "reader.cpp",
        "compute.cpp",
        "writer.cpp",
        "main.cpp",
        "tt.plan.json",
    ]
    # .source: the three device kernels, in order, each under a banner
    banners = re.findall(r"^// ===== (\S+) =====$", art.source, re.M)
    assert banners == ["reader.cpp", "compute.cpp", "writer.cpp"]
    assert art.artifacts["compute"].read_text() in art.source
    assert art.metadata[0]["launch"] == {"arch": "wormhole_b0", "grid": [6, 1], "cores": 6, "tiles": 6}
    assert art.metadata[0]["epilogue"] == ["bias", "gelu"]  # from the tt.compute ops after the matmul
    assert [r.name for r in art.pass_log] == tessera_tvm.pass_names("tenstorrent")


def _before_tile_loop(text: str) -> str:
    return text.split("for (uint32_t tile_id")[0]


def test_compute_kernel_uses_the_real_api_with_inits_hoisted():
    gemm = lowered("gemm", 64, 96, 128).artifacts["compute"].read_text()
    head, loop = _before_tile_loop(gemm), gemm.split("for (uint32_t tile_id")[1]
    assert "mm_init(cb_A_s, cb_B_s, cb_C_l, 0);" in head and "mm_init" not in loop  # one FPU mode: hoisted
    assert re.search(
        r"tile_regs_acquire\(\);\s+for \(uint32_t k = 0; k < 4; \+\+k\) \{\s+cb_wait_front\(cb_A_s, 1\);"
        r"\s+cb_wait_front\(cb_B_s, 1\);\s+matmul_tiles\(cb_A_s, cb_B_s, 0, 0, 0, 0\);",
        loop,
    )
    order = [
        loop.index(call)
        for call in ("tile_regs_commit();", "tile_regs_wait();", "pack_tile(0, cb_C_l);", "tile_regs_release();")
    ]
    assert order == sorted(order)

    eltwise = lowered("eltwise", 64, 128, "add").artifacts["compute"].read_text()
    head = _before_tile_loop(eltwise)
    assert "binary_op_init_common(cb_A_s, cb_B_s, cb_C_s);" in head and "add_tiles_init(cb_A_s, cb_B_s);" in head
    assert "add_tiles(cb_A_s, cb_B_s, 0, 0, 0);" in eltwise

    unary = lowered("unary", 33, 100, "gelu").artifacts["compute"].read_text()
    head = _before_tile_loop(unary)
    assert "init_sfpu(cb_X, cb_Y);" in head and "gelu_tile_init<false>();" in head
    assert "copy_tile(cb_X, 0, 0);" in unary and "gelu_tile<false>(0);" in unary

    epilogue = lowered("gemm_bias_act", 50, 70, 45, "gelu").artifacts["compute"].read_text()
    head, loop = _before_tile_loop(epilogue), epilogue.split("for (uint32_t tile_id")[1]
    assert "gelu_tile_init<false>();" in head and "gelu_tile_init" not in loop  # one SFPU op: hoisted
    # two FPU modes per tile: short inits where the mode changes, the hardware init hoisted
    assert "mm_init(" in head and "mm_init_short(cb_A_s, cb_B_s, 0);" in loop
    assert "add_bcast_rows_init_short(cb_C_l_tmp24, cb_bias);" in loop
    assert "add_tiles_bcast_rows(cb_C_l_tmp24, cb_bias, 0, 0, 0);" in loop


def test_data_movement_kernels_use_tensor_accessors_and_the_cb_protocol():
    reader = lowered("gemm_bias_act", 50, 70, 45, "gelu").artifacts["reader"].read_text()
    assert "constexpr auto A_args = TensorAccessorArgs<0>();" in reader
    assert "constexpr auto bias_args = TensorAccessorArgs<B_args.next_compile_time_args_offset()>();" in reader
    assert "noc_async_read_tile(by * 2 + k, A, get_write_ptr(cb_A_s));" in reader  # page of tile (by, k)
    assert "noc_async_read_tile(bx, bias, get_write_ptr(cb_bias));" in reader  # the bias row's tile
    writer = lowered("gemm_bias_act", 50, 70, 45, "gelu").artifacts["writer"].read_text()
    assert re.search(
        r"cb_wait_front\(cb_C_l, 1\);\s+noc_async_write_tile\(by \* 3 \+ bx, C, get_read_ptr\(cb_C_l\)\);"
        r"\s+noc_async_write_barrier\(\);\s+cb_pop_front\(cb_C_l, 1\);",
        writer,
    )
    host = lowered("gemm_bias_act", 50, 70, 45, "gelu").artifacts["host"].read_text()
    for call in (
        "CreateDevice(0)",
        "CreateBuffer(config)",
        "CreateCircularBuffer(program, cores, config)",
        "CreateKernel(",
        "SetRuntimeArgs(program, reader, core, {buf_A->address(), buf_B->address(), "
        "buf_bias->address(), work.start_tile, work.num_tiles});",
        "EnqueueWriteBuffer(cq, buf_A, host_A, false)",
        "EnqueueProgram(cq, program, false)",
        "EnqueueReadBuffer(cq, buf_C, host_C, true)",
        "CloseDevice(device)",
    ):
        assert call in host, call
