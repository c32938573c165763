"""Specs with symbolic dims (a Relax model's dynamic batch): the helpers of tile/base.py and the tile
programs that loop over such a dim. Running them is tests/relax/test_torch_models.py's part."""

import pytest

from tessera_tvm import tvm
from tessera_tvm.config import load_config
from tessera_tvm.tile import AttentionSpec, GemmSpec, NormSpec, SpecError, TileSchedule, build_tile_program
from tessera_tvm.tile.base import bind_dims, clamp, is_symbolic, symbolic_dims


def test_only_int32_vars_are_symbolic_dims_and_bind_dims_replaces_each_by_name():
    b = tvm.tirx.Var("b", "int32")
    assert is_symbolic(b) and not is_symbolic(tvm.tirx.Var("b", "int64")) and not is_symbolic(8)
    spec = GemmSpec(b, 32, 16, batch=(b,), batch_b=(), dtype_a="float32")
    assert [str(d) for d in symbolic_dims(spec)] == ["b"]  # M and batch are the same dim, listed once
    bound = bind_dims(spec, {"b": 5})
    assert (bound.M, bound.batch, bound.shape_a, bound.shape_out) == (5, (5,), (5, 5, 16), (5, 5, 32))
    assert symbolic_dims(bound) == []
    assert clamp(64, 10) == 10 and clamp(64, b) == 64
    with pytest.raises(SpecError, match="positive int"):
        GemmSpec(tvm.tirx.Var("m", "int64"), 32, 16)  # a Relax (int64) var is not a kernel dim
    with pytest.raises(KeyError):
        bind_dims(spec, {"other": 5})


@pytest.mark.parametrize(
    "spec",
    [
        GemmSpec(64, 256, 64, batch=(tvm.tirx.Var("b", "int32"),), batch_b=(), dtype_a="float32"),
        NormSpec("rms_norm", (tvm.tirx.Var("rows", "int32"), 96), dtype_in="float32"),
        AttentionSpec(
            tvm.tirx.Var("b", "int32"), 2, 2, 40, 40, 32, causal=True, dtype_in="float32", dtype_out="float32"
        ),
    ],
    ids=["gemm batch", "norm rows", "attention batch"],
)
def test_tile_programs_take_a_symbolic_dim_as_a_buffer_dim_bound_at_call_time(spec):
    (dim,) = symbolic_dims(spec)
    schedule = TileSchedule.from_config(load_config("cpu"), bind_dims(spec, {str(dim.name): 64}))
    prim = build_tile_program(spec, schedule, "c", name="k")
    shapes = [prim.buffer_map[p].shape for p in prim.params]
    assert any(any(d.same_as(dim) for d in shape) for shape in shapes), shapes
    # The grid and the clamped edge loops span the symbolic dim, not the hint.
    assert str(dim.name) in str(prim.body)
