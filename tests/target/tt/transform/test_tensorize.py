"""tt.Tensorize: tile ops recognised from the IR (never from names) and annotated for the code generator."""

from __future__ import annotations

import math

from tvm.script import tirx as T

from tessera_tvm._tvm import tvm
from tessera_tvm.target.tt.transform.tensorize import match_gelu

from .helpers import WORMHOLE, assert_pass, run_pass
from .tile_ops import copy, fill, gemm


def _shard(shape, tiles):
    return {
        "memory": "dram_interleaved",
        "layout": "tiled",
        "tile_shape": [32, 32],
        "shape": shape,
        "tiles": tiles,
        "dtype": "bfloat16",
        "page_size": 2048,
        "dram_banks": 12,
    }


def _cb(cb_id, name, role, dram, tile, pages=2):
    return {
        "id": cb_id,
        "name": name,
        "role": role,
        "dram": dram,
        "tile": tile,
        "num_pages": pages,
        "page_size": 2048,
        "data_format": "Float16_b",
    }


SHARDS = {
    "A": _shard([64, 64], [2, 2]),
    "B": _shard([64, 96], [2, 3]),
    "bias": _shard([96], [1, 3]),
    "C": _shard([64, 96], [2, 3]),
}
CBS = [
    _cb(0, "A_s", "input", "A", "A_s"),
    _cb(1, "B_s", "input", "B", "B_s"),
    _cb(2, "bias", "input", "bias", ""),
    _cb(16, "C_l", "output", "C", "C_l"),
]
SPILL = {
    "id": 24,
    "name": "C_l_tmp24",
    "role": "intermediate",
    "dram": "",
    "tile": "",
    "num_pages": 1,
    "page_size": 2048,
    "data_format": "Float16_b",
}
R2 = 1.0 / math.sqrt(2.0)


# C = gelu(A @ B + bias): the epilogue needs the accumulator in a CB for the row-broadcast add.
@T.prim_func
def before(
    A: T.Buffer((64, 64), "bfloat16"),
    B: T.Buffer((64, 96), "bfloat16"),
    bias: T.Buffer((96,), "bfloat16"),
    C: T.Buffer((64, 96), "bfloat16"),
    start_tile: T.int32,
    num_tiles: T.int32,
):
    T.func_attr({"tt.arch": WORMHOLE, "tt.shard": SHARDS, "tt.circular_buffers": CBS})
    for tile_id in T.serial(
        start_tile, start_tile + num_tiles, annotations={"tt.persistent": {"grid": [3, 2], "order": "row_major"}}
    ):
        bx: T.int32 = tile_id % 3
        by: T.int32 = tile_id // 3
        with T.sblock("tilelang_root"):
            T.reads()
            T.writes()
            A_s = T.sblock_alloc_buffer((32, 32), "bfloat16", scope="tt.cb")
            B_s = T.sblock_alloc_buffer((32, 32), "bfloat16", scope="tt.cb")
            C_l = T.sblock_alloc_buffer((32, 32), scope="tt.cb")
            T.evaluate(fill(C_l[0, 0]))
            for k in range(2):
                T.evaluate(copy(A[by * 32, k * 32], A_s[0, 0]))
                T.evaluate(copy(B[k * 32, bx * 32], B_s[0, 0]))
                T.evaluate(gemm(A_s[0, 0], B_s[0, 0], C_l[0, 0]))
            for i, j in T.grid(32, 32):
                x: T.float32 = C_l[i, j] + T.Cast("float32", bias[bx * 32 + j])
                C_l[i, j] = T.float32(0.5) * x * (T.float32(1) + T.erf(x * T.float32(R2)))
            T.evaluate(copy(C_l[0, 0], C[by * 32, bx * 32]))


MATMUL = {"kind": "matmul", "in0": 0, "in1": 1, "transpose": 0}
MATMUL_HW = {**MATMUL, "out": 24}  # the hardware init's output CB: the first one packed to
BIAS_ADD = {"kind": "binary", "fn": "add", "bcast": "rows", "in0": 24, "in1": 2}
CBS_WITH_SPILL = [*CBS, SPILL]  # (TVMScript cannot unpack inside a function body)


@T.prim_func
def expected(
    A: T.Buffer((64, 64), "bfloat16"),
    B: T.Buffer((64, 96), "bfloat16"),
    bias: T.Buffer((96,), "bfloat16"),
    C: T.Buffer((64, 96), "bfloat16"),
    start_tile: T.int32,
    num_tiles: T.int32,
):
    T.func_attr(
        {
            "tt.arch": WORMHOLE,
            "tt.shard": SHARDS,
            "tt.circular_buffers": CBS_WITH_SPILL,
            # two FPU modes per tile (matmul, row-broadcast add): hardware init hoisted, short inits per
            # phase; one SFPU op (gelu): its init hoisted
            "tt.compute_init": {"hw": MATMUL_HW, "fpu": None, "sfpu": "gelu"},
        }
    )
    for tile_id in T.serial(
        start_tile, start_tile + num_tiles, annotations={"tt.persistent": {"grid": [3, 2], "order": "row_major"}}
    ):
        bx: T.int32 = tile_id % 3
        by: T.int32 = tile_id // 3
        with T.sblock("tilelang_root"):
            T.reads()
            T.writes()
            A_s = T.sblock_alloc_buffer((32, 32), "bfloat16", scope="tt.cb")
            B_s = T.sblock_alloc_buffer((32, 32), "bfloat16", scope="tt.cb")
            C_l = T.sblock_alloc_buffer((32, 32), scope="tt.cb")
            # T.clear of the accumulator: a fresh DST
            with T.attr({"tile_op": "fill", "ops": [{"op": "acquire", "init": MATMUL}]}, "tt.compute", 0):
                T.evaluate(fill(C_l[0, 0]))
            for k in range(2):
                with T.attr({"cb": 0, "buffer": "A", "page": by * 2 + k}, "tt.read", 0):
                    with T.attr({"tile_op": "copy_in", "ops": []}, "tt.compute", 0):
                        T.evaluate(copy(A[by * 32, k * 32], A_s[0, 0]))
                with T.attr({"cb": 1, "buffer": "B", "page": k * 3 + bx}, "tt.read", 0):
                    with T.attr({"tile_op": "copy_in", "ops": []}, "tt.compute", 0):
                        T.evaluate(copy(B[k * 32, bx * 32], B_s[0, 0]))
                with T.attr(
                    {
                        "tile_op": "matmul",
                        "ops": [
                            {
                                "op": "matmul",
                                "in0": 0,
                                "in1": 1,
                                "dst": 0,
                                "transpose": 0,
                                "wait": [0, 1],
                                "pop": [0, 1],
                            }
                        ],
                    },
                    "tt.compute",
                    0,
                ):
                    T.evaluate(gemm(A_s[0, 0], B_s[0, 0], C_l[0, 0]))
            # the epilogue: spill A@B to c_24, add the bias row (c_2) broadcast, gelu on the SFPU
            with T.attr({"cb": 2, "buffer": "bias", "page": bx}, "tt.read", 0):
                with T.attr(
                    {
                        "tile_op": "elementwise",
                        "ops": [
                            {"op": "pack", "dst": 0, "cb": 24, "commit": True},
                            {"op": "release"},
                            {"op": "acquire", "init": BIAS_ADD},
                            {
                                "op": "binary",
                                "fn": "add",
                                "bcast": "rows",
                                "in0": 24,
                                "in1": 2,
                                "dst": 0,
                                "wait": [24, 2],
                                "pop": [24, 2],
                            },
                            {"op": "sfpu", "fn": "gelu", "dst": 0, "init": False},
                        ],
                    },
                    "tt.compute",
                    0,
                ):
                    for i, j in T.grid(32, 32):
                        x: T.float32 = C_l[i, j] + T.Cast("float32", bias[bx * 32 + j])
                        C_l[i, j] = T.float32(0.5) * x * (T.float32(1) + T.erf(x * T.float32(R2)))
            with T.attr(
                {"tile_op": "copy_out", "ops": [{"op": "pack", "dst": 0, "cb": 16, "commit": True}, {"op": "release"}]},
                "tt.compute",
                0,
            ):
                with T.attr({"cb": 16, "buffer": "C", "page": by * 3 + bx}, "tt.write", 0):
                    T.evaluate(copy(C_l[0, 0], C[by * 32, bx * 32]))


def test_gemm_with_bias_and_gelu_epilogue():
    assert_pass("tt.Tensorize", before, expected)


# C = relu(A + B) straight from DRAM: one FPU op, then the SFPU on its DST tile, in one phase.
EW_SHARDS = {"A": _shard([64, 64], [2, 2]), "B": _shard([64, 64], [2, 2]), "C": _shard([64, 64], [2, 2])}
EW_CBS = [_cb(0, "A", "input", "A", ""), _cb(1, "B", "input", "B", ""), _cb(16, "C", "output", "C", "")]


@T.prim_func
def before_eltwise(
    A: T.Buffer((64, 64), "bfloat16"),
    B: T.Buffer((64, 64), "bfloat16"),
    C: T.Buffer((64, 64), "bfloat16"),
    start_tile: T.int32,
    num_tiles: T.int32,
):
    T.func_attr({"tt.arch": WORMHOLE, "tt.shard": EW_SHARDS, "tt.circular_buffers": EW_CBS})
    for tile_id in T.serial(
        start_tile, start_tile + num_tiles, annotations={"tt.persistent": {"grid": [2, 2], "order": "row_major"}}
    ):
        bx: T.int32 = tile_id % 2
        by: T.int32 = tile_id // 2
        for i, j in T.grid(32, 32):
            C[by * 32 + i, bx * 32 + j] = T.max(
                A[by * 32 + i, bx * 32 + j] + B[by * 32 + i, bx * 32 + j], T.bfloat16(0)
            )


ADD = {"kind": "binary", "fn": "add", "bcast": "none", "in0": 0, "in1": 1}
ADD_HW = {**ADD, "out": 16}


@T.prim_func
def expected_eltwise(
    A: T.Buffer((64, 64), "bfloat16"),
    B: T.Buffer((64, 64), "bfloat16"),
    C: T.Buffer((64, 64), "bfloat16"),
    start_tile: T.int32,
    num_tiles: T.int32,
):
    T.func_attr(
        {
            "tt.arch": WORMHOLE,
            "tt.shard": EW_SHARDS,
            "tt.circular_buffers": EW_CBS,
            "tt.compute_init": {"hw": ADD_HW, "fpu": ADD, "sfpu": "relu"},
        }
    )  # all hoisted
    for tile_id in T.serial(
        start_tile, start_tile + num_tiles, annotations={"tt.persistent": {"grid": [2, 2], "order": "row_major"}}
    ):
        bx: T.int32 = tile_id % 2
        by: T.int32 = tile_id // 2
        with T.attr({"cb": 0, "buffer": "A", "page": by * 2 + bx}, "tt.read", 0):
            with T.attr({"cb": 1, "buffer": "B", "page": by * 2 + bx}, "tt.read", 0):
                with T.attr(
                    {
                        "tile_op": "elementwise",
                        "ops": [
                            {"op": "acquire", "init": None},
                            {
                                "op": "binary",
                                "fn": "add",
                                "bcast": "none",
                                "in0": 0,
                                "in1": 1,
                                "dst": 0,
                                "wait": [0, 1],
                                "pop": [0, 1],
                            },
                            {"op": "sfpu", "fn": "relu", "dst": 0, "init": False},
                            {"op": "pack", "dst": 0, "cb": 16, "commit": True},
                            {"op": "release"},
                        ],
                    },
                    "tt.compute",
                    0,
                ):
                    with T.attr({"cb": 16, "buffer": "C", "page": by * 2 + bx}, "tt.write", 0):
                        for i, j in T.grid(32, 32):
                            C[by * 32 + i, bx * 32 + j] = T.max(
                                A[by * 32 + i, bx * 32 + j] + B[by * 32 + i, bx * 32 + j], T.bfloat16(0)
                            )


def test_elementwise_binary_then_sfpu_from_dram():
    assert_pass("tt.Tensorize", before_eltwise, expected_eltwise)


@T.prim_func
def before_clamped(
    X: T.Buffer((64, 64), "bfloat16"), Y: T.Buffer((64, 64), "bfloat16"), start_tile: T.int32, num_tiles: T.int32
):
    T.func_attr(
        {
            "tt.arch": WORMHOLE,
            "tt.shard": {"X": _shard([64, 64], [2, 2]), "Y": _shard([64, 64], [2, 2])},
            "tt.circular_buffers": [_cb(0, "X", "input", "X", ""), _cb(16, "Y", "output", "Y", "")],
        }
    )
    for tile_id in T.serial(
        start_tile, start_tile + num_tiles, annotations={"tt.persistent": {"grid": [2, 2], "order": "row_major"}}
    ):
        bx: T.int32 = tile_id % 2
        by: T.int32 = tile_id // 2
        for i, j in T.grid(32, 32):
            Y[by * 32 + i, bx * 32 + j] = T.max(X[by * 32 + i, bx * 32 + j], T.bfloat16(1))


def test_an_unmapped_operation_is_marked_for_the_verifier_not_guessed():
    func = run_pass("tt.Tensorize", before_clamped)["main"]
    found = []
    tvm.tirx.stmt_functor.post_order_visit(
        func.body,
        lambda n: found.append(n) if isinstance(n, tvm.tirx.AttrStmt) and n.attr_key.startswith("tt.") else None,
    )
    assert [n.attr_key for n in found] == ["tt.unsupported"]
    assert str(found[0].node["op"]) == "Max" and "no Tenstorrent tile operation" in str(found[0].node["reason"])
    assert "tt.compute_init" not in func.attrs


def test_gelu_is_recognised_structurally_in_both_forms():
    x, y = tvm.tirx.Var("x", "float32"), tvm.tirx.Var("y", "float32")
    half, one = tvm.tirx.const(0.5, "float32"), tvm.tirx.const(1.0, "float32")
    erf_form = half * x * (one + tvm.tirx.erf(x * tvm.tirx.const(R2, "float32")))
    assert match_gelu(erf_form)[0] == "gelu" and match_gelu(erf_form)[1].same_as(x)
    inner = tvm.tirx.const(math.sqrt(2 / math.pi), "float32") * (x + tvm.tirx.const(0.044715, "float32") * x * x * x)
    assert match_gelu(half * x * (one + tvm.tirx.tanh(inner)))[0] == "gelu_tanh"
    # erf of a different value, or a different scale, is not gelu
    assert match_gelu(half * x * (one + tvm.tirx.erf(y * tvm.tirx.const(R2, "float32")))) is None
    assert match_gelu(half * x * (one + tvm.tirx.erf(x * tvm.tirx.const(0.5, "float32")))) is None
