"""tt.VerifyTTIR: a valid module passes unchanged; every kind of violation fails with a clear error."""

from __future__ import annotations

import functools

import pytest

import tessera_tvm
from tessera_tvm._tvm import tvm
from tessera_tvm.errors import TesseraError
from tessera_tvm.pipeline import run_phase
from tessera_tvm.target.tt.transform.common import TTResourceError, TTVerificationError, UnsupportedTTOperationError
from tests.target.tt import programs

from .helpers import run_pass


@functools.cache
def _lowered(name: str, *args):
    """A program through the tenstorrent pipeline (VerifyTTIR included: these are valid)."""
    mod = run_phase(getattr(programs, name)(*args), "tenstorrent", "lower_and_legalize")
    return run_phase(mod, "tenstorrent", "optimize_for_target")


def gemm_bias():
    return _lowered("gemm_bias_act", 64, 96, 64)


def verify(mod):
    return run_pass("tt.VerifyTTIR", mod)


def with_attr(mod, key, value):
    return tvm.IRModule({"main": mod["main"].with_attr(key, value)})


def attr(mod, key):
    from tessera_tvm.target.tt.transform.common import to_python

    return to_python(mod["main"].attrs[key])


def mutate_annotations(mod, key, change):
    """``mod`` with ``change(payload) -> payload`` applied to every ``key`` AttrStmt."""
    from tessera_tvm.target.tt.transform.common import to_python

    def post(node):
        if node.attr_key == key:
            return tvm.tirx.AttrStmt(change(to_python(node.node)), node.attr_key, node.value, node.body)
        return None

    func = mod["main"]
    return tvm.IRModule(
        {"main": func.with_body(tvm.tirx.stmt_functor.ir_transform(func.body, None, post, ["tirx.AttrStmt"]))}
    )


def test_a_valid_module_passes_unchanged():
    mod = gemm_bias()
    tvm.ir.assert_structural_equal(verify(mod)["main"], mod["main"])


def test_unsupported_operation_is_named_with_its_location():
    with pytest.raises(UnsupportedTTOperationError) as info:
        tessera_tvm.lower(programs.row_max(64, 64), "tenstorrent")
    msg = str(info.value)
    assert "kernel 'main': unsupported operation T.reduce at tile body › statement 3 of 5" in msg
    assert "the result 'R_f' must be a (32, 1) buffer" in msg and '"max"' in msg


def test_unsupported_expression_inside_an_elementwise_loop():
    with pytest.raises(
        UnsupportedTTOperationError,
        match=r"unsupported operation Max at tile body: .*T.bfloat16\(1\.0\)\)+ has no Tenstorrent tile operation",
    ):
        tessera_tvm.lower(programs.clamped(64, 64), "tenstorrent")


def test_a_scalar_multiply_is_a_binop_with_scalar_on_the_sfpu():
    source = tessera_tvm.lower(programs.scaled(64, 64), "tenstorrent").source
    assert "binop_with_scalar_tile_init();" in source and "mul_unary_tile(0, 0x40000000u);  // x * 2.0" in source


def test_blocks_larger_than_a_tile_are_rejected():
    with pytest.raises(UnsupportedTTOperationError, match="64x64 region; the Tenstorrent target moves 32x32 tiles"):
        tessera_tvm.lower(programs.gemm_64(128, 128, 64), "tenstorrent")


def test_cb_ids_over_the_arch_limit():
    mod = with_attr(gemm_bias(), "tt.arch", {**attr(gemm_bias(), "tt.arch"), "num_cbs": 16})
    with pytest.raises(
        TTResourceError, match="arch 'wormhole_b0' has 16 CB ids per core and output CBs take c_8..c_11"
    ):
        verify(mod)


def test_l1_over_budget():
    mod = with_attr(gemm_bias(), "tt.arch", {**attr(gemm_bias(), "tt.arch"), "l1_bytes": 16384})
    with pytest.raises(TTResourceError, match=r"needs 18432 bytes of L1 per core .* at most 16384"):
        verify(mod)


def test_doubly_assigned_and_unassigned_tiles():
    sched = attr(gemm_bias(), "tt.schedule")
    twice = {**sched, "assignments": [[0, 0, 2], [1, 1, 1], *sched["assignments"][2:]]}
    with pytest.raises(TTVerificationError, match="output tile 1 is assigned to cores 0 and 1"):
        verify(with_attr(gemm_bias(), "tt.schedule", twice))
    missing = {**sched, "assignments": sched["assignments"][:-1]}
    with pytest.raises(TTVerificationError, match="output tiles 5 are assigned to no core"):
        verify(with_attr(gemm_bias(), "tt.schedule", missing))


def test_core_outside_the_worker_grid():
    cmap = attr(gemm_bias(), "tt.core_map")
    bad = {**cmap, "cores": [[9, 0], *cmap["cores"][1:]]}
    with pytest.raises(TTVerificationError, match=r"core 0 is mapped to \(9, 0\), outside the 8x8 worker grid"):
        verify(with_attr(gemm_bias(), "tt.core_map", bad))


def test_dst_index_over_capacity():
    def to_dst_16(node):
        return {**node, "ops": [{**op, "dst": 16} if "dst" in op else op for op in node["ops"]]}

    # a GEMM holds float32: fp32_dest_acc_en (auto) halves DST to 8 tiles
    with pytest.raises(TTVerificationError, match="uses DST tile 16 but DST holds 8 tiles"):
        verify(mutate_annotations(gemm_bias(), "tt.compute", to_dst_16))


def test_cb_pushes_must_equal_pops():
    def drop_pops(node):
        return {**node, "ops": [{**op, "pop": []} if op["op"] == "matmul" else op for op in node["ops"]]}

    with pytest.raises(TTVerificationError, match=r"CB 0: 2 page\(s\) pushed but 0 popped per tile"):
        verify(mutate_annotations(gemm_bias(), "tt.compute", drop_pops))


def test_every_output_tile_written_exactly_once():
    def to_page_zero(node):
        return {**node, "page": tvm.tirx.IntImm("int32", 0)}

    with pytest.raises(TTVerificationError, match=r"output 'C': tiles 0 are written more than once"):
        verify(mutate_annotations(gemm_bias(), "tt.write", to_page_zero))


def test_reads_stay_inside_their_buffer():
    def past_the_end(node):
        return {**node, "page": node["page"] + 100} if node["buffer"] == "bias" else node

    with pytest.raises(TTVerificationError, match="read of 'bias' touches page 100 but it has 3 pages"):
        verify(mutate_annotations(gemm_bias(), "tt.read", past_the_end))


def test_a_module_that_was_not_tensorized():
    mod = run_phase(programs.gemm(64, 64, 64), "tenstorrent", "lower_and_legalize")
    for name in (
        "tt.InferSchedule",
        "tt.InferShard",
        "tt.GridToPersistent",
        "tt.ShardToCoreMap",
        "tt.LowerMemorySpace",
        "tt.TilePad",
    ):
        mod = run_pass(name, mod)
    with pytest.raises(TesseraError, match="unsupported operation T.fill at .* was not tensorized"):
        verify(mod)
