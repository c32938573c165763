"""NaN through max-like operations (issue #37, item 3): relu, clamp, max/min and max reductions keep
a NaN as torch does, on every thread-block target too. What the sources show; running them on NaN
is tests/frontend/test_numerics.py's part (CPU)."""

import re
import shutil

import pytest

import tessera_tvm
from tessera_tvm.tile import EpilogueOp, GemmSpec, ReduceSpec, SoftmaxSpec, build_tile_program

#: ``if ((lanes[i] != lanes[i])) { condval = lanes[i]; }``: a running max that keeps its NaN (nan_max).
KEEPS_NAN = re.compile(r"if \(\((\w+\[\w+\]) != \1\)\) \{\s*condval\w* = \1;")


def _source(spec, target: str, config: str) -> str:
    return tessera_tvm.lower(build_tile_program(spec, None, target), config, build=False).source


def test_cpu_relu_epilogue_is_a_select_that_keeps_nan():
    """Before: ``((v) > (0.0f) ? (v) : (0.0f))``, which is 0 for a NaN; now ``acc < 0 ? 0 : acc``."""
    source = _source(GemmSpec(64, 64, 32, dtype_a="float32", epilogue=(EpilogueOp("relu"),)), "c", "cpu")
    assert re.search(
        r"if \(\((acc\[[^]]*\]) < 0.000000e\+00f\)\) \{\s*condval = 0.000000e\+00f;\s*\} else \{\s*condval = \1;",
        source,
    )


def test_cpu_max_reduction_keeps_nan_through_the_inline_helper():
    source = _source(ReduceSpec((64, 300), axis=1, kind="max"), "c", "cpu")
    assert "lanes[lane_1] = tessera_nan_maxf(lanes[lane_1], " in source


@pytest.mark.parametrize("config", ["hopper", "rocm"])
def test_gpu_max_reduction_adds_back_its_nan_lanes(config):
    """T.reduce_max combines lanes with fmaxf, which drops NaN; the kernel adds the NaN lanes' sum."""
    target = "hip" if config == "rocm" else "cuda"
    source = _source(ReduceSpec((64, 300), axis=1, kind="max"), target, config)
    assert len(KEEPS_NAN.findall(source)) >= 2  # each lane (nan_max), and the NaN lanes added back
    assert "+ nans[" in source


def test_gpu_softmax_lanes_keep_nan():
    source = _source(SoftmaxSpec((64, 300)), "cuda", "hopper")
    assert KEEPS_NAN.search(source)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_nvcc_builds_the_nan_keeping_max_reduction(tmp_path):
    spec = ReduceSpec((64, 300), axis=1, kind="max")
    lowered = tessera_tvm.lower(build_tile_program(spec, None, "cuda"), "hopper", out_dir=tmp_path)
    assert lowered.artifacts["cubin"].stat().st_size > 0


def test_x_minus_x_keeps_nan_but_a_minus_b_stays_a_subtraction():
    from tessera_tvm._tvm import tvm
    from tessera_tvm.tile.common import binary

    a = tvm.tirx.decl_buffer((4,), "float32", name="A")
    b = tvm.tirx.decl_buffer((4,), "float32", name="B")
    i = tvm.tirx.Var("i", "int32")
    assert isinstance(binary("sub", a[i], b[i]), tvm.tirx.Sub)  # like buffers, same index: not x - x
    assert not isinstance(binary("sub", a[i], a[i]), tvm.tirx.Sub)  # x - x: NaN for NaN and inf, not 0
