"""tessera.MarkParallelGrid, tessera.LowerParallelGrid and tessera.ImportCpuRuntime: the CPU grid on all cores."""

from __future__ import annotations

import numpy as np
import pytest
import tilelang.language as T_tl
from tvm.script import tirx as T

import tessera_tvm
from tessera_tvm._tvm import tvm
from tessera_tvm.config import load_config
from tessera_tvm.registry import BuildContext, get_pass
from tessera_tvm.transform.import_cpu_runtime import import_cpu_runtime
from tessera_tvm.transform.lower_parallel_grid import lower_parallel_grid
from tessera_tvm.transform.mark_parallel_grid import mark_parallel_grid
from tessera_tvm.transform.parallel_region import ANNOTATION, next_block, parallel_begin, parallel_end

# ------------------------------------------------------------------------------- LowerParallelGrid


@T.prim_func(private=True)
def two_dim_grid(A: T.handle("float32", "global"), B: T.handle("float32", "global")) -> T.int32:
    A_1 = T.decl_buffer((256,), data=A)
    B_1 = T.decl_buffer((256,), data=B)
    acc = T.alloc_buffer((16,), scope="local")  # hoisted here by tl.StorageRewrite
    for bx in T.serial(4, annotations={"tessera.parallel_grid": 1}):
        for by in T.serial(2, annotations={"tessera.parallel_grid": 1}):
            for i in range(16):
                acc[i] = A_1[bx * 32 + by * 16 + i] * T.float32(2.0)
            for i in range(16):
                B_1[bx * 32 + by * 16 + i] = acc[i]
    return 0


@T.prim_func(private=True)
def two_dim_grid_lowered(A: T.handle("float32", "global"), B: T.handle("float32", "global")) -> T.int32:
    A_1 = T.decl_buffer((256,), data=A)
    B_1 = T.decl_buffer((256,), data=B)
    T.evaluate(parallel_begin(8))
    acc = T.alloc_buffer((16,), scope="local")  # inside the region: one per thread
    for _claim in range(8):  # claims until the grid is used up
        block: T.int32 = next_block()
        if block >= 8:
            T.evaluate(T.break_loop())
        bx: T.int32 = T.truncdiv(block, 2)
        by: T.int32 = T.truncmod(block, 2)
        for i in range(16):
            acc[i] = A_1[bx * 32 + by * 16 + i] * T.float32(2.0)
        for i in range(16):
            B_1[bx * 32 + by * 16 + i] = acc[i]
    T.evaluate(parallel_end())
    return 0


def test_grid_nest_becomes_one_region_with_private_arrays():
    tvm.ir.assert_structural_equal(lower_parallel_grid(two_dim_grid), two_dim_grid_lowered, map_free_vars=True)


@T.prim_func(private=True)
def grid_over_a_dim_of_2_to_the_31(A: T.handle("float32", "global")) -> T.int32:
    A_1 = T.decl_buffer((T.int64(2**31),), data=A)
    for bx in T.serial(2, annotations={"tessera.parallel_grid": 1}):
        for by in T.serial(T.int64(2**24), annotations={"tessera.parallel_grid": 1}):
            for i in range(T.int64(64)):
                A_1[by * T.int64(128) + T.Cast("int64", bx) * T.int64(64) + i] = T.float32(0.0)
    return 0


@T.prim_func(private=True)
def grid_over_a_dim_of_2_to_the_31_lowered(A: T.handle("float32", "global")) -> T.int32:
    A_1 = T.decl_buffer((T.int64(2**31),), data=A)
    T.evaluate(parallel_begin(2**25))
    for _claim in range(2**25):
        block: T.int32 = next_block()
        if block >= 2**25:
            T.evaluate(T.break_loop())
        bx: T.int32 = T.truncdiv(block, 2**24)
        by: T.int64 = T.Cast("int64", T.truncmod(block, 2**24))  # the int64 loop's index, widened
        for i in range(T.int64(64)):
            A_1[by * T.int64(128) + T.Cast("int64", bx) * T.int64(64) + i] = T.float32(0.0)
    T.evaluate(parallel_end())
    return 0


def test_grid_loops_with_int64_extents_take_the_int32_block_index():
    """A grid over a dim of 2^31 or more has int64 extents (before: a TVM dtype check failed)."""
    lowered = lower_parallel_grid(grid_over_a_dim_of_2_to_the_31)
    tvm.ir.assert_structural_equal(lowered, grid_over_a_dim_of_2_to_the_31_lowered, map_free_vars=True)


@T.prim_func(private=True)
def grid_of_2_to_the_31_blocks(A: T.handle("float32", "global")) -> T.int32:
    A_1 = T.decl_buffer((T.int64(2**33),), data=A)
    for bx in T.serial(T.int64(2**31), annotations={"tessera.parallel_grid": 1}):
        for i in range(T.int64(4)):
            A_1[bx * T.int64(4) + i] = T.float32(0.0)
    return 0


def test_a_grid_of_more_blocks_than_the_int32_counter_takes_is_refused():
    with pytest.raises(
        tessera_tvm.errors.LoweringError, match=r"2147483648 blocks; the CPU parallel region .* at most"
    ):
        lower_parallel_grid(grid_of_2_to_the_31_blocks.with_attr("global_symbol", "huge"))


@T.prim_func(private=True)
def array_shared_with_the_tail(A: T.handle("float32", "global"), B: T.handle("float32", "global")) -> T.int32:
    A_1 = T.decl_buffer((64,), data=A)
    B_1 = T.decl_buffer((64,), data=B)
    total = T.alloc_buffer((1,), scope="local")
    total[0] = T.float32(0.0)
    for bx in T.serial(4, annotations={"tessera.parallel_grid": 1}):
        for i in range(16):
            total[0] = total[0] + A_1[bx * 16 + i]
    B_1[0] = total[0]
    return 0


@T.prim_func(private=True)
def array_shared_with_the_tail_serial(A: T.handle("float32", "global"), B: T.handle("float32", "global")) -> T.int32:
    A_1 = T.decl_buffer((64,), data=A)
    B_1 = T.decl_buffer((64,), data=B)
    total = T.alloc_buffer((1,), scope="local")
    total[0] = T.float32(0.0)
    for bx in range(4):
        for i in range(16):
            total[0] = total[0] + A_1[bx * 16 + i]
    B_1[0] = total[0]
    return 0


def test_array_used_outside_the_grid_keeps_it_serial():
    """Moving ``total`` into a region would give each thread its own partial sum: the loop stays serial."""
    tvm.ir.assert_structural_equal(lower_parallel_grid(array_shared_with_the_tail), array_shared_with_the_tail_serial)


@T.prim_func(private=True)
def one_block(A: T.handle("float32", "global")) -> T.int32:
    A_1 = T.decl_buffer((16,), data=A)
    for bx in T.serial(1, annotations={"tessera.parallel_grid": 1}):
        for i in range(16):
            A_1[bx * 16 + i] = T.float32(1.0)
    return 0


@T.prim_func(private=True)
def one_block_serial(A: T.handle("float32", "global")) -> T.int32:
    A_1 = T.decl_buffer((16,), data=A)
    for bx in range(1):
        for i in range(16):
            A_1[bx * 16 + i] = T.float32(1.0)
    return 0


def test_grid_of_one_block_gets_no_region():
    tvm.ir.assert_structural_equal(lower_parallel_grid(one_block), one_block_serial)


@T.prim_func(private=True)
def unannotated(A: T.handle("float32", "global")) -> T.int32:
    A_1 = T.decl_buffer((64,), data=A)
    for bx in range(4):
        for i in range(16):
            A_1[bx * 16 + i] = A_1[bx * 16 + i] + T.float32(1.0)
    return 0


def test_loops_without_the_annotation_stay_serial():
    tvm.ir.assert_structural_equal(lower_parallel_grid(unannotated), unannotated)


# ------------------------------------------------------------------------------- ImportCpuRuntime


def test_runtime_header_is_imported_only_when_used():
    assert import_cpu_runtime(unannotated).same_as(unannotated)
    lowered = import_cpu_runtime(two_dim_grid_lowered)
    assert isinstance(lowered.body, tvm.tirx.AttrStmt)
    assert lowered.body.attr_key == "pragma_import_c"
    assert lowered.body.value.value == "#include <tessera/cpu.h>\n"


# ------------------------------------------------------------------------------- MarkParallelGrid


def _materialized(func):
    cfg = load_config("cpu")
    ctx = BuildContext(cfg, cfg.tvm_target())
    mod = tvm.IRModule({"main": func})
    with cfg.tvm_target():
        mod = tvm.tirx.transform.BindTarget(cfg.tvm_target())(mod)
        mod = get_pass("tl.MaterializeKernelLaunch").factory(
            ctx, lower_thread_binding=False, unsupported_annotations=["cluster_dims"]
        )(mod)
    return mod["main"]


def _annotated_extents(func) -> list[int]:
    found = []

    def visit(node):
        if isinstance(node, tvm.tirx.For) and ANNOTATION in node.annotations:
            found.append(int(node.extent))

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return sorted(found)


def _copy_program(n: int, atomic: bool = False):
    @T_tl.prim_func
    def main(A: T_tl.Tensor((n, 64), "float32"), B: T_tl.Tensor((n, 64), "float32")):
        with T_tl.Kernel(2, T_tl.ceildiv(n, 16)) as (bx, by):
            for i, j in T_tl.grid(16, 32):
                if atomic:
                    T_tl.atomic_add(B[0, 0], A[by * 16 + i, bx * 32 + j])
                else:
                    B[by * 16 + i, bx * 32 + j] = A[by * 16 + i, bx * 32 + j]

    return main


def test_grid_loops_around_the_kernel_body_are_annotated():
    marked = mark_parallel_grid(_materialized(_copy_program(48)))
    assert _annotated_extents(marked) == [2, 3]  # bx, by


def test_grid_whose_blocks_use_atomics_is_not_annotated():
    """CPU atomics are lowered to plain read-modify-writes: blocks on other threads would race."""
    func = _materialized(_copy_program(48, atomic=True))
    assert _annotated_extents(mark_parallel_grid(func)) == []


def test_the_cpu_pipeline_marks_and_lowers_the_grid():
    lowered = tessera_tvm.lower(_copy_program(48), "cpu", build=False)
    assert "tessera.MarkParallelGrid" in [r.name for r in lowered.pass_log]
    source = lowered.source
    assert "#include <tessera/cpu.h>" in source
    assert "TESSERA_PARALLEL_BEGIN(6);" in source and "TESSERA_PARALLEL_END();" in source
    assert (
        source.index("TESSERA_PARALLEL_BEGIN")
        < source.index("int32_t block = TESSERA_NEXT_BLOCK();")
        < source.index("TESSERA_PARALLEL_END")
    )


def test_a_grid_with_a_symbolic_extent_is_a_parallel_region_too():
    # With a symbolic dim, tl.InjectAssumes wraps the grid nest in a `tl.assume` attribute, after
    # the block's arrays: the arrays must still move into the region (before, every kernel of a
    # model exported with a dynamic batch or sequence length ran on one core).
    from tessera_tvm.tile import GemmSpec, TileSchedule, build_tile_program

    rows = tvm.tirx.Var("rows", "int32")
    spec = GemmSpec(rows, 96, 64, dtype_a="float32")
    lowered = tessera_tvm.lower(build_tile_program(spec, TileSchedule(block_m=16, block_n=32, block_k=32), "c"), "cpu")
    source = lowered.source
    assert "TESSERA_PARALLEL_BEGIN(" in source and "rows" in source.split("TESSERA_PARALLEL_BEGIN(")[1].split(";")[0]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((50, 64)).astype(np.float32), rng.standard_normal((64, 96)).astype(np.float32)
    out = np.zeros((50, 96), np.float32)
    lowered(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------------------- threads at run time


def _thread_counts(blocks: int):
    """A kernel whose block b writes the size of the team that ran it into out[b]."""

    @T_tl.prim_func
    def main(out: T_tl.Tensor((blocks,), "int32")):
        with T_tl.Kernel(blocks) as bx:
            out[bx] = T_tl.call_extern("int32", "tessera_thread_count")

    return main


@pytest.fixture(scope="module")
def team_kernel():
    return tessera_tvm.lower(_thread_counts(8), "cpu")


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_tessera_num_threads_sets_the_team(team_kernel, threads, monkeypatch):
    monkeypatch.setenv("TESSERA_NUM_THREADS", threads)
    out = np.zeros(8, dtype=np.int32)
    team_kernel(out)
    assert (out == int(threads)).all()


def test_omp_num_threads_applies_without_tessera_num_threads(team_kernel, monkeypatch):
    """OMP_NUM_THREADS is read by libgomp once, at load; the kernel caps the team at it."""
    monkeypatch.delenv("TESSERA_NUM_THREADS", raising=False)
    out = np.zeros(8, dtype=np.int32)
    team_kernel(out)
    assert 1 <= out.min() == out.max() <= 8


@pytest.mark.parametrize("value", ["0", "-2", "many", ""])
def test_invalid_tessera_num_threads_is_ignored(team_kernel, value, monkeypatch):
    monkeypatch.setenv("TESSERA_NUM_THREADS", value)
    default = np.zeros(8, dtype=np.int32)
    monkeypatch.delenv("TESSERA_NUM_THREADS")
    team_kernel(default)
    monkeypatch.setenv("TESSERA_NUM_THREADS", value)
    out = np.zeros(8, dtype=np.int32)
    team_kernel(out)
    assert (out == default).all()


def test_team_is_never_larger_than_the_grid(monkeypatch):
    monkeypatch.setenv("TESSERA_NUM_THREADS", "4")
    kernel = tessera_tvm.lower(_thread_counts(3), "cpu")
    out = np.zeros(3, dtype=np.int32)
    kernel(out)
    assert (out == 3).all()
