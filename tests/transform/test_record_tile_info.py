"""tessera.RecordTileInfo: tile shape, stages, dtypes, threads and epilogue of a tile program."""

from __future__ import annotations

import pytest

from tessera_tvm._tvm import tvm
from tessera_tvm.config import load_config
from tessera_tvm.registry import BuildContext, get_pass
from tessera_tvm.transform.record_tile_info import ATTR, tile_info

from . import tile_programs as programs
from .tile_programs import lower


def record(func):
    cfg = load_config("hopper")
    run = get_pass("tessera.RecordTileInfo").factory(BuildContext(cfg, cfg.tvm_target()))
    return run(tvm.IRModule({"main": func}))["main"]


def test_records_attr_on_the_tile_program():
    before = programs.matmul_bias_relu_transposed()
    expected = programs.matmul_bias_relu_transposed(with_tile_info=True)
    tvm.ir.assert_structural_equal(record(before), expected)


def test_leaves_its_input_unchanged():
    before = programs.matmul(1024, 1024, 1024, 128, 128, 32)
    mod = tvm.IRModule({"main": before})
    cfg = load_config("hopper")
    get_pass("tessera.RecordTileInfo").factory(BuildContext(cfg, cfg.tvm_target()))(mod)
    assert ATTR not in mod["main"].attrs


def test_gemm_1024():
    assert tile_info(programs.matmul(1024, 1024, 1024, 128, 128, 32)) == {
        "tile": {"M": 128, "N": 128, "K": 32},
        "stages": 3,
        "dtype_in": "float16",
        "dtype_acc": "float32",
        "threads": 128,
        "epilogue": [],  # T.copy(C_l, C) narrows fp32 to fp16 on the store: not an epilogue
        "buffers": [
            "shared.dyn A_s 128x32 float16 (8192 B)",
            "shared.dyn B_s 32x128 float16 (8192 B)",
            "local.fragment C_l 128x128 float32 (65536 B)",
        ],
    }


def test_transposed_a_takes_k_from_its_first_axis():
    info = tile_info(programs.matmul_transposed_a())
    assert info["tile"] == {"M": 64, "N": 128, "K": 16}
    assert (info["stages"], info["threads"]) == (4, 256)


@pytest.mark.parametrize(
    ("activation", "epilogue"),
    [
        ("gelu", ["bias", "gelu", "cast"]),
        ("gelu_tanh", ["bias", "gelu", "cast"]),
        ("relu", ["bias", "relu", "cast"]),
        (None, ["bias", "cast"]),
    ],
)
def test_detects_epilogue(activation, epilogue):
    func = programs.linear(256, 256, 256, 128, 128, 32, activation=activation)
    assert tile_info(func)["epilogue"] == epilogue


def test_gemm_outside_any_loop():
    info = tile_info(programs.matmul_one_k_tile())
    del info["buffers"]
    assert info == {
        "tile": {"M": 64, "N": 64, "K": 32},
        "dtype_in": "bfloat16",
        "dtype_acc": "float32",
        "threads": 128,
        "epilogue": ["relu"],
    }


def test_residual_add_is_not_a_bias():
    assert tile_info(programs.matmul_residual())["epilogue"] == []


def test_frontend_epilogue_attr_wins():
    func = programs.matmul_bias_relu_transposed(epilogue=["bias", "silu"])
    assert tile_info(func)["epilogue"] == ["bias", "silu"]


def test_kernel_without_gemm_records_what_it_has():
    assert tile_info(programs.residual_add()) == {"threads": 64, "epilogue": []}


def test_cpu_gemm_has_no_stages():
    info = tile_info(programs.matmul_cpu(256, 256, 256, 64, 64, 32))
    assert info["tile"] == {"M": 64, "N": 64, "K": 32} and "stages" not in info


@pytest.mark.parametrize("config", ["hopper", "cpu"])
def test_attr_survives_lowering_on_the_host_function(config):
    mod = lower("matmul_cpu" if config == "cpu" else "matmul", config)
    host = mod["main"]
    assert int(host.attrs["calling_conv"]) == 1  # the packed host entry point, not the kernel
    assert host.attrs[ATTR]["tile"]["M"] == (64 if config == "cpu" else 128)
