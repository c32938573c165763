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
from .common import bfloat16_rounded, binary, broadcast_coords, const, declare_params, to_compute, unary, unravel
from .expr import Binary, Const, Input, Unary
from .schedule import TileSchedule
from .specs import ElementwiseSpec

#: Ops that integer operands compute exactly in int32; the others (exp, division, ...) compute in
#: float32 and round back to the integer dtype, as the reference's integer ops do.
INTEGER_OPS = frozenset({"add", "sub", "mul", "max", "min", "relu", "neg", "abs"})


def compute_dtype(dtype: str, floats: str = "float32") -> str:
    """What a value of ``dtype`` is computed in: int32 for integers (wrapping as the reference's
    int32 arithmetic), ``floats`` (the spec's ``dtype_compute``) for floats."""
    return "int32" if dtype.startswith("int") else floats


def evaluate(expr, values: dict, dtypes: dict, floats: str, host: bool = False):
    """``(value, dtype)``: the PrimExpr of ``expr`` given each input's value (already in its compute
    dtype, :func:`compute_dtype`) and dtype (``host``: a CPU program), and the dtype of the graph value
    it is. Integer values compute in int32 and an int8 result is rounded to int8 at each op, so they
    wrap as the reference's do; float values stay in ``floats`` until a cast rounds them. A constant
    is its ``Const`` node and dtype None until the op that reads it gives it one."""
    if isinstance(expr, Input):
        return values[expr.name], dtypes[expr.name]
    if isinstance(expr, Const):
        return expr, None
    if isinstance(expr, Unary):
        x, dtype = evaluate(expr.x, values, dtypes, floats, host)
        if expr.op == "cast":
            x = _in(x, compute_dtype(dtype or floats, floats))
            if host and expr.dtype == "bfloat16" and str(x.dtype) == "float32":
                # TVM's bfloat16 legalization for the C codegen computes in float32 and rounds only
                # where a value is stored: a cast inside the expression (x.bfloat16().float()) vanished
                return bfloat16_rounded(x), expr.dtype
            value = to_compute(x, expr.dtype)
            return to_compute(value, compute_dtype(expr.dtype, floats)), expr.dtype
        dtype = dtype or floats
        return _integer_rounded(expr.op, dtype, floats, lambda c: unary(expr.op, _in(x, c), c, host=host)), dtype
    if isinstance(expr, Binary):
        (x, dx), (y, dy) = (evaluate(e, values, dtypes, floats, host) for e in (expr.x, expr.y))
        dtype = dx or dy or floats
        return _integer_rounded(
            expr.op, dtype, floats, lambda c: binary(expr.op, _in(x, c), _in(y, c), host=host)
        ), dtype
    raise TypeError(f"not an expression node: {expr!r}")


def _in(value, dtype: str):
    """``value`` (a PrimExpr or a ``Const``) in compute dtype ``dtype``."""
    return const(value.value, dtype) if isinstance(value, Const) else to_compute(value, dtype)


def _integer_rounded(op: str, dtype: str, floats: str, compute):
    """``compute(c)`` in compute dtype ``c``: for an integer ``dtype``, int32 (float32 for ops that are
    not exact in integers) rounded to ``dtype`` and back to int32; ``floats`` otherwise."""
    if not dtype.startswith("int"):
        return compute(floats)
    value = compute("int32" if op in INTEGER_OPS else "float32")
    return value if dtype == "int32" and op in INTEGER_OPS else T.cast(T.cast(value, dtype), "int32")


def element_value(spec: ElementwiseSpec, inputs: list, row, col, host: bool = False):
    """``expr`` at output element (row, col) of the [rows, cols] view, cast to ``dtype_out``."""
    coords = [*unravel(row, spec.shape[:-1]), col]
    values, dtypes = {}, {}
    for arg, buf in zip(spec.operands, inputs[: len(spec.operands)], strict=True):
        index = broadcast_coords(coords, arg.shape, spec.shape)
        values[arg.name] = to_compute(buf[tuple(index)], compute_dtype(arg.dtype, spec.dtype_compute))
        dtypes[arg.name] = arg.dtype
    value, dtype = evaluate(spec.expr, values, dtypes, spec.dtype_compute, host)
    return T.cast(_in(value, compute_dtype(dtype or spec.dtype_out, spec.dtype_compute)), spec.dtype_out)


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
