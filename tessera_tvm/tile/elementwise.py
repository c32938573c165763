"""Element-wise tile programs: ``out = expr(inputs...)`` with numpy broadcasting.

The output is viewed as ``[rows, cols]`` (cols = the last dimension, rows = the rest flattened);
each block owns a ``block_m x block_n`` tile. Output coordinates are unravelled from the row index
and each input reads the coordinates broadcasting maps them to, so inputs keep their own shapes.

GPU: a ``T.Parallel`` tile loop with an ``if`` that masks rows/columns past the edge (no shared
memory: each element is read once). CPU: serial loops clamped to the edge.
"""

from __future__ import annotations

import math

from .._tvm import T, prim_func
from .base import clamp
from .common import binary, broadcast_coords, const, declare_params, to_compute, unary, unravel
from .expr import Binary, Const, Input, Unary
from .schedule import TileSchedule
from .specs import ElementwiseSpec


def evaluate(expr, values: dict, dtype: str, host: bool = False):
    """The PrimExpr of ``expr`` given each input's (already cast) value (``host``: a CPU program)."""
    if isinstance(expr, Input):
        return values[expr.name]
    if isinstance(expr, Const):
        return const(expr.value, dtype)
    if isinstance(expr, Unary):
        return unary(expr.op, evaluate(expr.x, values, dtype, host), dtype, cast_to=expr.dtype, host=host)
    if isinstance(expr, Binary):
        return binary(expr.op, evaluate(expr.x, values, dtype, host), evaluate(expr.y, values, dtype, host), host=host)
    raise TypeError(f"not an expression node: {expr!r}")


def element_value(spec: ElementwiseSpec, inputs: list, row, col, host: bool = False):
    """``expr`` at output element (row, col) of the [rows, cols] view, cast to ``dtype_out``."""
    coords = [*unravel(row, spec.shape[:-1]), col]
    values = {}
    for arg, buf in zip(spec.operands, inputs[: len(spec.operands)], strict=True):
        index = broadcast_coords(coords, arg.shape, spec.shape)
        values[arg.name] = to_compute(buf[tuple(index)], spec.dtype_compute)
    return T.cast(evaluate(spec.expr, values, spec.dtype_compute, host), spec.dtype_out)


def _out_index(spec: ElementwiseSpec, row, col) -> tuple:
    return (*unravel(row, spec.shape[:-1]), col)


def _blocks(spec: ElementwiseSpec, schedule: TileSchedule) -> tuple:
    """(rows, cols, block_m, block_n, inputs, params): what both programs read of spec and schedule."""
    rows, cols = math.prod(spec.shape[:-1]), spec.shape[-1]
    return rows, cols, clamp(schedule.block_m, rows), schedule.block_n, len(spec.operands), spec.params()


def elementwise_cpu_program(spec: ElementwiseSpec, schedule: TileSchedule):
    """The element-wise tile program of the CPU: serial loops over each block's rows and columns."""
    rows, cols, block_m, block_n, n_inputs, params = _blocks(spec, schedule)

    @prim_func
    def main():
        io = declare_params(params)
        with T.Kernel(T.ceildiv(cols, block_n), T.ceildiv(rows, block_m)) as (bx, by):
            for i in T.serial(T.min(block_m, rows - by * block_m)):
                for j in T.serial(T.min(block_n, cols - bx * block_n)):
                    io.buffers[n_inputs][_out_index(spec, by * block_m + i, bx * block_n + j)] = element_value(
                        spec, io.buffers, by * block_m + i, bx * block_n + j, host=True
                    )

    return main


def elementwise_gpu_program(spec: ElementwiseSpec, schedule: TileSchedule):
    """The element-wise tile program of a thread-block target (CUDA, HIP): a T.Parallel block, masked."""
    rows, cols, block_m, block_n, n_inputs, params = _blocks(spec, schedule)

    @prim_func
    def main():
        io = declare_params(params)
        with T.Kernel(T.ceildiv(cols, block_n), T.ceildiv(rows, block_m), threads=schedule.threads) as (bx, by):
            for i, j in T.Parallel(block_m, block_n):
                if by * block_m + i < rows and bx * block_n + j < cols:
                    io.buffers[n_inputs][_out_index(spec, by * block_m + i, bx * block_n + j)] = element_value(
                        spec, io.buffers, by * block_m + i, bx * block_n + j
                    )

    return main
