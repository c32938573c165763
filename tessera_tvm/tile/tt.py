"""Tile programs for the Tenstorrent target (``target_kind="tt"``): what ``tt.Tensorize`` recognises.

Every program computes one 32x32 output tile per block (the Tensix tile) with a 32-wide K step, in
the shape the TT pipeline (configs/tenstorrent.yaml) accepts:

- GEMM: ``T.clear`` of a float32 accumulator, a K loop of ``T.copy`` DRAM -> 32x32 tile for A and B
  and ``T.gemm`` (``transpose_B`` for ``transpose_b``), then an optional element-wise epilogue on the
  accumulator (bias row, residual (+) or gate (*) tiles of an [M, N] operand, scale / add_scalar,
  relu / gelu (erf, tanh) / exp, in order) and ``T.copy`` of the tile out.
- Element-wise: one masked ``T.Parallel(32, 32)`` loop whose store is an expression of same-shape
  inputs built from + - * of tiles, + - * / with a scalar (the SFPU's binop with a scalar) and
  exp / relu / gelu; the output is viewed as ``[rows, last dim]`` (the
  buffers are declared with that 2-D shape) and ``tt.TilePad`` drops the edge masks.

Buffers are all bfloat16, all float16 (IEEE half, ``tt::DataFormat::Float16``) or all float32; a
GEMM accumulates in float32 whatever its buffers. A ``cast`` step (epilogue or expression) adds no
instruction: on Tenstorrent values are rounded to a circular buffer's format whenever a tile is packed.

An element-wise operand may also be a row (``[N]``, ``add/mul_tiles_bcast_rows``) or a column
(``[M, 1]``, ``add/sub/mul_tiles_bcast_cols``) broadcast over the tile; subtracting a row is not
supported (tt-metal v0.62.2 has no row form of it).

A batched GEMM is one 2-D GEMM over every batch entry's rows (each buffer declared as its
``[rows, last dim]`` view); with a batched B, each entry's B tiles are read at its own offset.

A row reduction (sum, max, mean over the last axis) reduces each 32x32 tile of a row block into a
(32, 1) accumulator (``T.reduce`` -> ``reduce_tile``), stored into the ``[rows, 1]`` output view.

Anything else (softmax, norms, attention, other reductions, transposed-A GEMMs, partly broadcast batches,
other broadcasts, mixed buffer dtypes, other unary or binary ops) raises
:class:`UnsupportedTTOperationError` naming the operation.
"""

from __future__ import annotations

import math

from tessera_tvm.transform.tt.common import UnsupportedTTOperationError

from .._tvm import T, prim_func
from .base import SpecError
from .common import binary, declare_params, unary
from .expr import Binary, Const, Input, Unary, expr_nodes
from .schedule import TileSchedule
from .specs import AttentionSpec, ElementwiseSpec, GemmSpec, KernelSpec, NormSpec, ReduceSpec, SoftmaxSpec

__all__ = ["TILE", "TT_SCHEDULE", "UnsupportedTTOperationError", "tt_program"]

#: The Tensix tile: every block computes one TILE x TILE output tile with a TILE-wide K step.
TILE = 32
#: The tile schedule of every Tenstorrent program (``stages``/``threads`` are not used).
TT_SCHEDULE = TileSchedule(block_m=TILE, block_n=TILE, block_k=TILE, stages=1, threads=1)

TT_DTYPES = ("bfloat16", "float16", "float32")
TT_EPILOGUE = (
    "bias",
    "residual",
    "gate",
    "scale",
    "add_scalar",
    "relu",
    "gelu_erf",
    "gelu_tanh",
    "exp",
    "sigmoid",
    "silu",
    "cast",
)
# sqrt and 1/x run on the SFPU; rsqrt, sigmoid (1 / (1 + exp(-x))) and silu (x * sigmoid) compose them.
TT_UNARY = ("exp", "relu", "gelu_erf", "gelu_tanh", "sqrt", "rsqrt", "sigmoid", "silu", "neg", "cast")
TT_BINARY = ("add", "sub", "mul", "div")
TT_SCALAR_BINARY = ("add", "sub", "mul", "div")  # with a scalar operand: binop_with_scalar on the SFPU

_NOT_YET = "the Tenstorrent target does not support {what} yet"


def _unsupported(op: str, detail: str = "", what: str | None = None) -> UnsupportedTTOperationError:
    message = f"{op}: " + _NOT_YET.format(what=what or op)
    return UnsupportedTTOperationError(message + (f" ({detail})" if detail else ""))


def _check_dtypes(kind: str, dtypes: dict[str, str]) -> None:
    for field, dtype in dtypes.items():
        if dtype not in TT_DTYPES:
            raise _unsupported(
                f"{kind} with {field}={dtype}",
                f"Tenstorrent tiles here are {' or '.join(TT_DTYPES)}",
                what=f"{dtype} buffers",
            )


def _check_one_dtype(kind: str, dtypes: dict[str, str]) -> None:
    if len(set(dtypes.values())) > 1:
        found = ", ".join(f"{k}={v}" for k, v in dtypes.items())
        raise _unsupported(f"{kind} with mixed buffer dtypes", found, what="buffers of different dtypes in one kernel")


def _check_schedule(spec: KernelSpec, schedule: TileSchedule) -> None:
    blocks = [schedule.block_m, schedule.block_n] + ([schedule.block_k] if isinstance(spec, GemmSpec) else [])
    if any(b != TILE for b in blocks):
        names = "block_m x block_n" + (" x block_k" if isinstance(spec, GemmSpec) else "")
        raise SpecError(
            f"{spec.family} kernel: {names} is {' x '.join(map(str, blocks))}; the Tenstorrent target computes "
            f"one {TILE}x{TILE} tile per block with a {TILE}-wide K step (use {TILE} for each)"
        )


def tt_program(spec: KernelSpec, schedule: TileSchedule, target_kind: str = "tt"):
    """The TileLang PrimFunc of ``spec`` for the Tenstorrent pipeline (32x32 tiles)."""
    if isinstance(spec, GemmSpec):
        _check_gemm(spec)
        _check_schedule(spec, schedule)
        return _gemm_program(spec)
    if isinstance(spec, ElementwiseSpec):
        _check_elementwise(spec)
        _check_schedule(spec, schedule)
        return _elementwise_program(spec)
    if isinstance(spec, SoftmaxSpec):
        raise _unsupported("softmax", "a row reduction + broadcast; only GEMM and element-wise kernels lower")
    if isinstance(spec, NormSpec):
        raise _unsupported(spec.kind, "a row reduction; only GEMM and element-wise kernels lower")
    if isinstance(spec, AttentionSpec):
        raise _unsupported("attention", "flash attention; only GEMM and element-wise kernels lower")
    if isinstance(spec, ReduceSpec):
        _check_reduce(spec)
        _check_schedule(spec, schedule)
        return _reduce_program(spec)
    raise _unsupported(type(spec).__name__)


# ---------------------------------------------------------------------------------------------
# GEMM
# ---------------------------------------------------------------------------------------------


def _batched(shape: tuple[int, ...]) -> bool:
    return math.prod(shape) > 1


def _check_batch(spec: GemmSpec) -> None:
    """A batched GEMM runs as one 2-D GEMM over the rows of every batch entry: A may be shared or
    batched like the output; a batched B needs each entry's rows to start on a tile (M, K, and N with
    transpose_b, multiples of 32), so that no tile straddles two entries."""
    if not _batched(spec.batch):
        return
    for name, shape in (("A", spec.batch_a), ("B", spec.batch_b)):
        if _batched(shape) and shape != spec.batch:
            raise _unsupported(
                "batched matmul with a partly broadcast batch",
                f"{name}'s batch {list(shape)} vs the output's {list(spec.batch)}; a batch is either the output's "
                "or absent (a shared operand)",
                what="partly broadcast batches",
            )
    if _batched(spec.batch_b):
        dims = {"M": spec.M, "K": spec.K, **({"N": spec.N} if spec.transpose_b else {})}
        ragged = {d: v for d, v in dims.items() if v % TILE}
        if ragged:
            found = ", ".join(f"{d}={v}" for d, v in ragged.items())
            raise _unsupported(
                "batched matmul with a batched B and ragged tiles",
                f"{found}: with a batched B, {', '.join(dims)} must be multiples of {TILE} so that no tile "
                "straddles two batch entries",
                what="batched B with dims that are not multiples of 32",
            )


def _check_gemm(spec: GemmSpec) -> None:
    _check_batch(spec)
    if spec.transpose_a:
        raise _unsupported("matmul with transpose_a", "transpose A first (transpose_b is supported)")
    if spec.dtype_acc != "float32":
        raise _unsupported(f"matmul accumulating in {spec.dtype_acc}", "the accumulator is float32")
    _check_dtypes("matmul", {"dtype_a": spec.dtype_a, "dtype_b": spec.dtype_b, "dtype_out": spec.dtype_out})
    for op in spec.epilogue:
        if op.kind not in TT_EPILOGUE:
            raise _unsupported(
                f"epilogue {op.kind}", f"supported epilogues: {', '.join(TT_EPILOGUE)}", what=f"the {op.kind} epilogue"
            )
        if op.kind == "cast" or op.operand is not None:
            _check_dtypes(f"epilogue {op.kind}", {"dtype": op.dtype or spec.dtype_out})
    buffers = {"dtype_a": spec.dtype_a, "dtype_b": spec.dtype_b, "dtype_out": spec.dtype_out}
    _check_one_dtype("matmul", {**buffers, **{p.name: p.dtype for p in spec.epilogue_operands()}})
    if sum(op.kind == "bias" for op in spec.epilogue) > 1:
        raise _unsupported("epilogue bias twice", "one bias row per GEMM", what="two bias epilogues")


def _epilogue_value(spec: GemmSpec, acc, operands: dict, bx, by, i, j, rows: int):
    """The accumulator element after the epilogue ops, in order (float32); ``rows``: the output
    view's (every batch entry's M rows)."""
    value = acc
    row, col = by * TILE + i, bx * TILE + j
    for op in spec.epilogue:
        if op.kind == "bias":
            # The bias row, masked past N (tt.TilePad pads it with zeros and drops the mask).
            value = value + T.if_then_else(col < spec.N, T.cast(operands[op.operand][col], "float32"), T.float32(0))
        elif op.kind in ("residual", "gate"):
            # A tile of an [M, N] operand, masked past the edges (padded with zeros by tt.TilePad):
            # the tensorizer adds or multiplies it into the accumulator tile on the FPU.
            tile = T.if_then_else(
                T.And(row < rows, col < spec.N), T.cast(operands[op.operand][row, col], "float32"), T.float32(0)
            )
            value = value + tile if op.kind == "residual" else value * tile
        elif op.kind == "scale":  # the SFPU's binop with a scalar (mul_unary_tile / add_unary_tile)
            value = value * T.float32(op.value)
        elif op.kind == "add_scalar":
            value = value + T.float32(op.value)
        else:
            value = unary(op.kind, value, "float32", cast_to=op.dtype)
    return value


def _by_name(params, buffers) -> dict:
    return {p.name: buf for p, buf in zip(params, buffers, strict=True)}


def _view(arg, rows: int):
    """``arg`` declared as the 2-D ``[rows, last dim]`` view of its row-major memory."""
    return arg._replace(shape=(rows, arg.shape[-1])) if len(arg.shape) > 1 else arg


def _gemm_program(spec: GemmSpec):
    M, N, K = spec.M, spec.N, spec.K
    tb = spec.transpose_b
    entries = math.prod(spec.batch)  # every batch entry's rows, one after the other
    rows = entries * M
    a_batched, b_batched = _batched(spec.batch_a), _batched(spec.batch_b)
    b_rows = (N if tb else K) * (entries if b_batched else 1)
    params = spec.params()
    n_ops = len(spec.epilogue_operands())
    view = [
        _view(params[0], M * (entries if a_batched else 1)),
        _view(params[1], b_rows),
        *[_view(p, rows) if len(p.shape) > 1 else p for p in params[2:]],
    ]
    compute = any(op.kind != "cast" for op in spec.epilogue)
    m_tiles = M // TILE  # with a batched B (M a multiple of 32): the row tiles of one batch entry

    @prim_func
    def main():
        io = declare_params(view)
        operands = _by_name(params[2 : 2 + n_ops], io.buffers[2 : 2 + n_ops])
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(rows, TILE)) as (bx, by):
            A_s = T.alloc_shared((TILE, TILE), spec.dtype_a)
            B_s = T.alloc_shared((TILE, TILE), spec.dtype_b)
            C_l = T.alloc_fragment((TILE, TILE), "float32")
            T.clear(C_l)
            for k in T.serial(T.ceildiv(K, TILE)):
                if b_batched and not a_batched:  # a shared A: this entry's rows of it
                    T.copy(io.buffers[0][(by % m_tiles) * TILE, k * TILE], A_s)
                else:
                    T.copy(io.buffers[0][by * TILE, k * TILE], A_s)
                base = (by // m_tiles) * (N if tb else K) if b_batched else 0  # this entry's B
                if tb:
                    T.copy(io.buffers[1][base + bx * TILE, k * TILE], B_s)
                else:
                    T.copy(io.buffers[1][base + k * TILE, bx * TILE], B_s)
                T.gemm(A_s, B_s, C_l, transpose_B=tb)
            if compute:
                for i, j in T.Parallel(TILE, TILE):
                    C_l[i, j] = _epilogue_value(spec, C_l[i, j], operands, bx, by, i, j, rows)
            T.copy(C_l, io.buffers[-1][by * TILE, bx * TILE])

    return main


# ---------------------------------------------------------------------------------------------
# Element-wise
# ---------------------------------------------------------------------------------------------


def _check_elementwise(spec: ElementwiseSpec) -> None:
    buffers = {"dtype_out": spec.dtype_out, **{p.name: p.dtype for p in spec.operands}}
    _check_dtypes("element-wise", buffers)
    _check_one_dtype("element-wise", buffers)
    for p in spec.operands:
        _broadcast_kind(spec, p)
    _check_scalars(spec.expr)
    for node in expr_nodes(spec.expr):
        if isinstance(node, Unary) and node.op not in TT_UNARY:
            raise _unsupported(node.op, f"supported unary ops: {', '.join(TT_UNARY)}")
        if isinstance(node, Unary) and node.op == "cast":
            _check_dtypes("cast", {"dtype": node.dtype})
        scalar = isinstance(node, Binary) and (isinstance(node.x, Const) or isinstance(node.y, Const))
        if isinstance(node, Binary) and node.op not in (TT_SCALAR_BINARY if scalar else TT_BINARY):
            raise _unsupported(
                node.op,
                f"supported binary ops: {', '.join(TT_BINARY)} of tiles, {', '.join(TT_SCALAR_BINARY)} with a scalar",
            )
    if isinstance(spec.expr, Input):
        raise _unsupported(
            "copy", "an element-wise kernel that computes nothing", what="plain copies from the frontend"
        )


def _broadcast_kind(spec: ElementwiseSpec, p) -> str:
    """How operand ``p`` meets the output's ``[rows, last dim]`` view: ``"tile"`` (the output's
    shape), ``"row"`` (``[N]`` or ``[1, ..., 1, N]``: row 0 of its tile across every row) or
    ``"col"`` (``[..., 1]`` with the output's leading dims: column 0 across every column)."""
    shape, out = tuple(p.shape), tuple(spec.shape)
    if shape == out:
        return "tile"
    if shape[-1:] == out[-1:] and math.prod(shape[:-1]) == 1:
        return "row"
    if len(shape) == len(out) and shape[:-1] == out[:-1] and shape[-1] == 1:
        return "col"
    raise _unsupported(
        f"broadcast of {p.name}",
        f"{p.name} is {list(p.shape)} but the output is {list(spec.shape)}; an operand has the output's shape, "
        "its last dim only (a row, broadcast down) or its leading dims with a last dim of 1 (a column, broadcast "
        "across)",
        what="this broadcast in element-wise kernels",
    )


def _check_scalars(expr) -> None:
    """Scalars are operands of + - * / with a tile (the SFPU's binop with a scalar, or its reciprocal
    for a scalar divided by a tile); a scalar on its own has no Tenstorrent operation."""
    if isinstance(expr, Const):
        raise _unsupported(
            f"scalar constant {expr.value!r}", "a scalar on its own, not an operand of + - * /", what="lone scalars"
        )
    if isinstance(expr, Unary):
        _check_scalars(expr.x)
    elif isinstance(expr, Binary):
        if isinstance(expr.x, Const) and isinstance(expr.y, Const):
            raise _unsupported(f"{expr.op} of two scalars", "fold it first", what="scalar-only expressions")
        for side in (expr.x, expr.y):
            if not isinstance(side, Const):
                _check_scalars(side)


def _evaluate(expr, values: dict):
    if isinstance(expr, Const):
        return T.float32(expr.value)
    if isinstance(expr, Input):
        return values[expr.name]
    if isinstance(expr, Unary):
        return unary(expr.op, _evaluate(expr.x, values), "float32", cast_to=expr.dtype)
    return binary(expr.op, _evaluate(expr.x, values), _evaluate(expr.y, values))


def _elementwise_program(spec: ElementwiseSpec):
    rows, cols = math.prod(spec.shape[:-1]), spec.shape[-1]
    kinds = [_broadcast_kind(spec, p) for p in spec.operands]
    # The [rows, last dim] view of each buffer; a row operand is [last dim], a column [rows, 1].
    shapes = {"tile": (rows, cols), "row": (cols,), "col": (rows, 1)}
    view = [p._replace(shape=shapes[k]) for p, k in zip(spec.operands, kinds, strict=True)]
    view.append(spec.outputs()[0]._replace(shape=(rows, cols)))
    n_in = len(spec.operands)

    def load(buf, kind, r, c):
        return buf[c] if kind == "row" else buf[r, 0] if kind == "col" else buf[r, c]

    def value(buffers, r, c):
        loaded = {
            p.name: T.cast(load(buf, k, r, c), "float32")
            for p, buf, k in zip(spec.operands, buffers, kinds, strict=False)
        }
        return T.cast(_evaluate(spec.expr, loaded), spec.dtype_out)

    @prim_func
    def main():
        io = declare_params(view)
        with T.Kernel(T.ceildiv(cols, TILE), T.ceildiv(rows, TILE)) as (bx, by):
            for i, j in T.Parallel(TILE, TILE):
                if by * TILE + i < rows and bx * TILE + j < cols:
                    io.buffers[n_in][by * TILE + i, bx * TILE + j] = value(io.buffers, by * TILE + i, bx * TILE + j)

    return main


# ---------------------------------------------------------------------------------------------
# Row reductions
# ---------------------------------------------------------------------------------------------


def _check_reduce(spec: ReduceSpec) -> None:
    if spec.axis != (len(spec.shape) - 1,):
        raise _unsupported(
            f"reduce_{spec.kind} over axes {list(spec.axis)}",
            f"of a {len(spec.shape)}-D tensor; the Tenstorrent target reduces the last axis (row reductions)",
            what="reductions over other axes",
        )
    _check_dtypes(f"reduce_{spec.kind}", {"dtype_in": spec.dtype_in, "dtype_out": spec.dtype_out})
    _check_one_dtype(f"reduce_{spec.kind}", {"dtype_in": spec.dtype_in, "dtype_out": spec.dtype_out})
    if spec.kind == "max" and spec.shape[-1] % TILE:
        raise _unsupported(
            "reduce_max over a ragged last axis",
            f"the last axis is {spec.shape[-1]}, not a multiple of {TILE}: the padding of its last tile would "
            "enter the maximum",
            what="max over a last axis that is not a multiple of 32",
        )


def _reduce_program(spec: ReduceSpec):
    """Per 32-row block: every 32x32 tile of the rows goes through ``T.reduce`` into one (32, 1)
    accumulator (``reduce_tile`` accumulating in DST), which is stored as the block's rows of the
    [rows, 1] output view. A mean multiplies the sums by 1/N in DST (the SFPU's binop with a scalar)."""
    rows, cols = math.prod(spec.shape[:-1]), spec.shape[-1]
    x_view = spec.inputs()[0]._replace(shape=(rows, cols))
    out_view = spec.outputs()[0]._replace(shape=(rows, 1))
    kind = "sum" if spec.kind == "mean" else spec.kind
    init = -math.inf if kind == "max" else 0.0

    @prim_func
    def main():
        io = declare_params([x_view, out_view])
        with T.Kernel(1, T.ceildiv(rows, TILE)) as (bx, by):
            X_f = T.alloc_fragment((TILE, TILE), spec.dtype_in)
            R_f = T.alloc_fragment((TILE, 1), "float32")
            T.fill(R_f, init)
            for t in T.serial(T.ceildiv(cols, TILE)):
                T.copy(io.buffers[0][by * TILE, t * TILE], X_f)
                if kind == "max":
                    T.reduce_max(X_f, R_f, dim=1, clear=False)
                else:
                    T.reduce_sum(X_f, R_f, dim=1, clear=False)
            if spec.kind == "mean":  # the row sums times 1/N, on the SFPU, while they are in DST
                for i, j in T.Parallel(TILE, 1):
                    R_f[i, j] = R_f[i, j] * T.float32(1.0 / cols)
            T.copy(R_f, io.buffers[1][by * TILE, 0])

    return main
