"""Tile programs for the Tenstorrent target (codegen kind ``tt``): what ``tt.Tensorize`` recognises.

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
other broadcasts, mixed input dtypes, other unary or binary ops) raises
:class:`UnsupportedTTOperationError` naming the operation.
"""

from __future__ import annotations

import math

from tessera_tvm._tvm import T, named, prim_func
from tessera_tvm.tile.base import SpecError
from tessera_tvm.tile.common import binary, declare_params, unary
from tessera_tvm.tile.expr import Binary, Const, Input, Unary, expr_nodes
from tessera_tvm.tile.schedule import TileSchedule
from tessera_tvm.tile.specs import (
    AttentionSpec,
    ElementwiseSpec,
    GemmSpec,
    KernelSpec,
    NormSpec,
    ReduceSpec,
    SoftmaxSpec,
)

from ..backend import backend_for
from .ir import UnsupportedTTOperationError

__all__ = ["TILE", "TT_SCHEDULE", "UnsupportedTTOperationError", "tt_program"]

#: The Tensix tile: every block computes one TILE x TILE output tile with a TILE-wide K step.
TILE = 32
#: The tile schedule of every Tenstorrent program (``stages``/``threads`` are not used).
TT_SCHEDULE = TileSchedule(block_m=TILE, block_n=TILE, block_k=TILE, stages=1, threads=1)

TT_DTYPES = ("bfloat16", "float16", "float32")
# What the SFPU/FPU programs take: the Tenstorrent manifest's (src/target/tt/backend.py).
_MANIFEST = backend_for("tt")
TT_EPILOGUE = _MANIFEST.epilogue_ops
TT_UNARY = _MANIFEST.unary_ops
TT_BINARY = _MANIFEST.binary_ops
TT_SCALAR_BINARY = _MANIFEST.binary_ops  # with a scalar operand: binop_with_scalar on the SFPU

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


#: A GEMM block of bm x bn tiles keeps bm*bn accumulators in DST: fp32 DST holds 8 tiles, half of
#: them for math while the packer drains the other half (tile_regs_acquire/commit/wait/release).
TT_MAX_BLOCK_TILES = 4


def _check_gemm_block(spec: GemmSpec, schedule: TileSchedule) -> tuple[int, int]:
    """(bm, bn): the output tiles per block of a GEMM schedule (``block_m``/``block_n`` multiples of 32;
    ``block_k`` stays 32). (1, 1) is the one-tile block every other check expects."""
    bm, bn = schedule.block_m // TILE, schedule.block_n // TILE
    if schedule.block_m % TILE or schedule.block_n % TILE or schedule.block_k != TILE or (bm, bn) == (1, 1):
        return (1, 1)  # _check_schedule names the problem, if any
    where = f"gemm kernel: block_m x block_n is {schedule.block_m} x {schedule.block_n}"
    if bm * bn > TT_MAX_BLOCK_TILES:
        raise SpecError(
            f"{where} = {bm * bn} tiles; a block keeps one fp32 accumulator per tile in DST, which has "
            f"{TT_MAX_BLOCK_TILES} for math (use at most {TT_MAX_BLOCK_TILES} tiles, e.g. 64 x 64)"
        )
    if spec.transpose_a:
        raise _unsupported(
            "matmul with transpose_a in blocks larger than a tile",
            f"{schedule.block_m} x {schedule.block_n}; transpose_a runs one 32x32 tile per block",
            what="transpose_a with blocks larger than 32x32",
        )
    entries = math.prod(spec.batch)
    m_tiles, n_tiles = -(-spec.M // TILE), -(-spec.N // TILE)
    if _batched(spec.batch) and spec.M % TILE and bm > 1:
        raise SpecError(f"{where}: a batched GEMM with a block over rows needs M a multiple of {TILE} (M={spec.M})")
    if (m_tiles * entries) % bm or n_tiles % bn or (_batched(spec.batch) and m_tiles % bm):
        raise SpecError(
            f"{where}, but the output is {m_tiles * entries} x {n_tiles} tiles of 32x32 (M={spec.M}, N={spec.N}"
            f"{f', {entries} batch entries' if entries > 1 else ''}): blocks must tile it exactly "
            "(Tenstorrent moves whole tiles and has no masked edge blocks)"
        )
    return bm, bn


def _check_schedule(spec: KernelSpec, schedule: TileSchedule) -> None:
    blocks = [schedule.block_m, schedule.block_n] + ([schedule.block_k] if isinstance(spec, GemmSpec) else [])
    if any(b != TILE for b in blocks):
        names = "block_m x block_n" + (" x block_k" if isinstance(spec, GemmSpec) else "")
        raise SpecError(
            f"{spec.family} kernel: {names} is {' x '.join(map(str, blocks))}; the Tenstorrent target computes "
            f"one {TILE}x{TILE} tile per block with a {TILE}-wide K step (use {TILE} for each)"
        )


def tt_program(spec: KernelSpec, schedule: TileSchedule):
    """The TileLang PrimFunc of ``spec`` for the Tenstorrent pipeline (32x32 tiles)."""
    if isinstance(spec, GemmSpec):
        _check_gemm(spec)
        sub = _check_gemm_block(spec, schedule)
        if sub == (1, 1):
            _check_schedule(spec, schedule)
            return _gemm_program(spec)
        return _gemm_block_program(spec, *sub)
    if isinstance(spec, ElementwiseSpec):
        _check_elementwise(spec)
        _check_schedule(spec, schedule)
        return _elementwise_program(spec)
    if isinstance(spec, SoftmaxSpec):
        raise _unsupported("softmax", "a row reduction + broadcast; only GEMM and element-wise kernels lower")
    if isinstance(spec, NormSpec):
        raise _unsupported(spec.kind, "a row reduction; only GEMM and element-wise kernels lower")
    if isinstance(spec, AttentionSpec):
        _check_attention(spec)
        _check_schedule(spec, schedule)
        return _attention_program(spec)
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
    if spec.transpose_a and _batched(spec.batch_a) and spec.K % TILE:
        raise _unsupported(
            "batched matmul with transpose_a and a ragged K",
            f"K={spec.K}: with a batched, transposed A, K must be a multiple of {TILE} so that no tile straddles "
            "two batch entries",
            what="a batched transposed A with K not a multiple of 32",
        )
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
            value = unary(op.kind, value, "float32", cast_to=op.dtype, propagate_nan=False)  # the SFPU's relu
    return value


def _by_name(params, buffers) -> dict:
    return {p.name: buf for p, buf in zip(params, buffers, strict=True)}


def _view(arg, rows: int):
    """``arg`` declared as the 2-D ``[rows, last dim]`` view of its row-major memory."""
    return arg._replace(shape=(rows, arg.shape[-1])) if len(arg.shape) > 1 else arg


def _gemm_program(spec: GemmSpec):
    M, N, K = spec.M, spec.N, spec.K
    tb, ta = spec.transpose_b, spec.transpose_a
    entries = math.prod(spec.batch)  # every batch entry's rows, one after the other
    rows = entries * M
    a_batched, b_batched = _batched(spec.batch_a), _batched(spec.batch_b)
    b_rows = (N if tb else K) * (entries if b_batched else 1)
    params = spec.params()
    n_ops = len(spec.epilogue_operands())
    view = [
        _view(params[0], (K if ta else M) * (entries if a_batched else 1)),
        _view(params[1], b_rows),
        *[_view(p, rows) if len(p.shape) > 1 else p for p in params[2:]],
    ]
    compute = any(op.kind != "cast" for op in spec.epilogue)
    m_tiles = M // TILE  # with a batched B (M a multiple of 32): the row tiles of one batch entry
    if ta:
        return _gemm_transposed_a_program(spec, view, n_ops, compute, rows, m_tiles)

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


def _gemm_block_program(spec: GemmSpec, bm: int, bn: int):
    """A block of bm x bn output tiles: per K step, bm A tiles and bn B tiles are read once and
    multiplied into bm*bn accumulators that stay in DST for the whole K loop (``matmul_tiles`` into
    DST tiles 0..bm*bn-1), so each A tile is read once per bn outputs instead of once per output."""
    M, N, K = spec.M, spec.N, spec.K
    tb = spec.transpose_b
    entries = math.prod(spec.batch)
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
    m_tiles = -(-M // TILE)
    tiles = [(i, j) for i in range(bm) for j in range(bn)]  # Python lists: expanded while building

    @prim_func
    def main():
        io = declare_params(view)
        operands = _by_name(params[2 : 2 + n_ops], io.buffers[2 : 2 + n_ops])
        with T.Kernel(T.ceildiv(N, TILE * bn), T.ceildiv(rows, TILE * bm)) as (bx, by):
            A_s = [named(T.alloc_shared((TILE, TILE), spec.dtype_a), f"A_s{i}") for i in range(bm)]
            B_s = [named(T.alloc_shared((TILE, TILE), spec.dtype_b), f"B_s{j}") for j in range(bn)]
            C_l = {t: named(T.alloc_fragment((TILE, TILE), "float32"), f"C_l{t[0]}{t[1]}") for t in tiles}
            for t in tiles:
                T.clear(C_l[t])
            for k in T.serial(T.ceildiv(K, TILE)):
                for i in list(range(bm)):
                    row_tile = by * bm + i  # of the [entries * M, K] view (whole blocks: _check_gemm_block)
                    if b_batched and not a_batched:
                        T.copy(io.buffers[0][(row_tile % m_tiles) * TILE, k * TILE], A_s[i])
                    else:
                        T.copy(io.buffers[0][row_tile * TILE, k * TILE], A_s[i])
                for j in list(range(bn)):
                    base = ((by * bm) // m_tiles) * (N if tb else K) if b_batched else 0
                    col_tile = bx * bn + j
                    if tb:
                        T.copy(io.buffers[1][base + col_tile * TILE, k * TILE], B_s[j])
                    else:
                        T.copy(io.buffers[1][base + k * TILE, col_tile * TILE], B_s[j])
                for t in tiles:
                    T.gemm(A_s[t[0]], B_s[t[1]], C_l[t], transpose_B=tb)
            for t in tiles:
                if compute:
                    for i, j in T.Parallel(TILE, TILE):
                        C_l[t][i, j] = _epilogue_value(
                            spec, C_l[t][i, j], operands, bx * bn + t[1], by * bm + t[0], i, j, rows
                        )
                T.copy(C_l[t], io.buffers[-1][(by * bm + t[0]) * TILE, (bx * bn + t[1]) * TILE])

    return main


def _gemm_transposed_a_program(spec: GemmSpec, view, n_ops: int, compute: bool, rows: int, m_tiles: int):
    """``transpose_a``: A is ``[K, M]``, so the A tile of output block (m, k) is A's tile (k, m)
    transposed on its way into DST (``transpose_wh_tile``), packed, and multiplied. The matmul cannot
    accumulate in DST across the K loop around that (DST is packed every step), so each step's
    product is added to the accumulator, which travels between steps through a CB of its own."""
    N, K = spec.N, spec.K
    tb = spec.transpose_b
    a_batched, b_batched = _batched(spec.batch_a), _batched(spec.batch_b)
    params = spec.params()

    @prim_func
    def main():
        io = declare_params(view)
        operands = _by_name(params[2 : 2 + n_ops], io.buffers[2 : 2 + n_ops])
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(rows, TILE)) as (bx, by):
            A_s = T.alloc_shared((TILE, TILE), spec.dtype_a)
            A_t = T.alloc_fragment((TILE, TILE), "float32")
            B_s = T.alloc_shared((TILE, TILE), spec.dtype_b)
            P_l = T.alloc_fragment((TILE, TILE), "float32")
            C_l = T.alloc_fragment((TILE, TILE), "float32")
            T.clear(C_l)
            batched = a_batched or b_batched  # then M is whole tiles: entry e's rows are tiles e*m_tiles..
            entry = by // m_tiles if batched else 0
            m = by % m_tiles if batched else by
            for k in T.serial(T.ceildiv(K, TILE)):
                a_row = entry * K + k * TILE if a_batched else k * TILE  # this entry's [K, M] block of A
                T.copy(io.buffers[0][a_row, m * TILE], A_s)
                for i, j in T.Parallel(TILE, TILE):
                    A_t[i, j] = A_s[j, i]
                base = entry * (N if tb else K) if b_batched else 0
                if tb:
                    T.copy(io.buffers[1][base + bx * TILE, k * TILE], B_s)
                else:
                    T.copy(io.buffers[1][base + k * TILE, bx * TILE], B_s)
                T.clear(P_l)
                T.gemm(A_t, B_s, P_l, transpose_B=tb)
                for i, j in T.Parallel(TILE, TILE):
                    C_l[i, j] = C_l[i, j] + P_l[i, j]
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
    _check_one_dtype("element-wise", {p.name: p.dtype for p in spec.operands})  # the output may differ: a cast
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
        return unary(expr.op, _evaluate(expr.x, values), "float32", cast_to=expr.dtype, propagate_nan=False)
    return binary(expr.op, _evaluate(expr.x, values), _evaluate(expr.y, values), propagate_nan=False)


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


def _reduce_program(spec: ReduceSpec):
    """Per 32-row block: every 32x32 tile of the rows goes through ``T.reduce`` into one (32, 1)
    accumulator (``reduce_tile`` accumulating in DST), which is stored as the block's rows of the
    [rows, 1] output view. A mean multiplies the sums by 1/N in DST (the SFPU's binop with a scalar).

    The zero padding of a ragged last tile adds nothing to a sum, but would enter a maximum: a max
    reduces the whole tiles in the loop, then the last tile plus a mask tile of -inf past the last
    column (generated by the reader), and takes the larger of the two (``binary_max_tile``)."""
    rows, cols = math.prod(spec.shape[:-1]), spec.shape[-1]
    x_view = spec.inputs()[0]._replace(shape=(rows, cols))
    out_view = spec.outputs()[0]._replace(shape=(rows, 1))
    kind = "sum" if spec.kind == "mean" else spec.kind
    init = -math.inf if kind == "max" else 0.0
    ragged = cols % TILE if kind == "max" else 0  # columns in the last tile when it is partial
    full = cols // TILE if ragged else T.ceildiv(cols, TILE)  # the tiles reduced as they are

    @prim_func
    def main():
        io = declare_params([x_view, out_view])
        with T.Kernel(1, T.ceildiv(rows, TILE)) as (bx, by):
            X_f = T.alloc_fragment((TILE, TILE), spec.dtype_in)
            R_f = T.alloc_fragment((TILE, 1), "float32")
            T.fill(R_f, init)
            if not ragged or cols > TILE:
                for t in T.serial(full):
                    T.copy(io.buffers[0][by * TILE, t * TILE], X_f)
                    if kind == "max":
                        T.reduce_max(X_f, R_f, dim=1, clear=False)
                    else:
                        T.reduce_sum(X_f, R_f, dim=1, clear=False)
            if ragged:  # the last tile with its padding at -inf
                X_m = T.alloc_fragment((TILE, TILE), "float32")
                R_last = T.alloc_fragment((TILE, 1), "float32")
                T.copy(io.buffers[0][by * TILE, (cols // TILE) * TILE], X_f)
                for i, j in T.Parallel(TILE, TILE):
                    X_m[i, j] = T.cast(X_f[i, j], "float32") + T.if_then_else(
                        j >= ragged, T.float32(-math.inf), T.float32(0)
                    )
                T.fill(R_last, T.float32(-math.inf))
                T.reduce_max(X_m, R_last, dim=1, clear=False)
                for i, j in T.Parallel(TILE, 1):
                    R_f[i, j] = T.max(R_f[i, j], R_last[i, j])
            if spec.kind == "mean":  # the row sums times 1/N, on the SFPU, while they are in DST
                for i, j in T.Parallel(TILE, 1):
                    R_f[i, j] = R_f[i, j] * T.float32(1.0 / cols)
            T.copy(R_f, io.buffers[1][by * TILE, 0])

    return main


# ---------------------------------------------------------------------------------------------
# Flash attention
# ---------------------------------------------------------------------------------------------

TT_HEAD_DIMS = (32, 64, 128)


def _check_attention(spec: AttentionSpec) -> None:
    _check_dtypes("attention", {"dtype_in": spec.dtype_in, "dtype_out": spec.dtype_out})
    _check_one_dtype("attention", {"dtype_in": spec.dtype_in, "dtype_out": spec.dtype_out})
    if spec.bias is not None:
        raise _unsupported(
            "attention with a bias (an attention mask)",
            "the reader generates only a causal mask tile; a bias tensor would be a fourth input stream",
            what="an attention bias",
        )
    if spec.D not in TT_HEAD_DIMS:
        raise _unsupported(
            f"attention with head dim {spec.D}",
            f"supported head dims: {', '.join(map(str, TT_HEAD_DIMS))} (the output block is D/32 tiles held in CBs)",
            what=f"head dim {spec.D}",
        )
    ragged = {n: v for n, v in (("S_q", spec.S_q), ("S_kv", spec.S_kv)) if v % TILE}
    if ragged:
        found = ", ".join(f"{n}={v}" for n, v in ragged.items())
        raise _unsupported(
            "attention with ragged sequence lengths",
            f"{found}: sequence lengths must be multiples of {TILE} (padded keys would need a mask tile)",
            what="sequence lengths that are not multiples of 32",
        )


def _attention_program(spec: AttentionSpec):
    """One block per 32 query rows of one (batch, head): Q K^T over D/32 tiles into DST, the online
    softmax on (32, 1) columns (running max ``m`` and sum ``l``, carried through circular buffers from
    one key block to the next) and D/32 output tiles ``acc[d]`` rescaled by ``exp(m_old - m_new)``
    before each P V_d is added; the outputs are divided by ``l`` after the last key block.

    Q, K, V and O are declared as their ``[rows, D]`` views; a causal mask is a tile of -inf/0 the
    reader generates for the key block (``tt.Tensorize`` turns the ``if_then_else`` into it), and the
    key loop stops at the last block a query of the block can see."""
    B, H, H_kv, S_q, S_kv, D = spec.B, spec.H, spec.H_kv, spec.S_q, spec.S_kv, spec.D
    n_d, q_blocks, kv_blocks = D // TILE, S_q // TILE, S_kv // TILE
    group, offset = spec.groups, spec.causal_offset
    q, k, v = spec.inputs()  # no bias (_check_attention)
    views = [q._replace(shape=(B * H * S_q, D)), k._replace(shape=(B * H_kv * S_kv, D))]
    views += [v._replace(shape=(B * H_kv * S_kv, D)), spec.outputs()[0]._replace(shape=(B * H * S_q, D))]
    dt = spec.dtype_in
    tiles = list(range(n_d))  # the output block's tiles, one buffer each

    @prim_func
    def main():
        io = declare_params(views)  # indexed, not unpacked: TileLang names a buffer after the variable
        with T.Kernel(1, B * H * q_blocks) as (bx, by):
            q_s = T.alloc_shared((TILE, TILE), dt)
            k_s = T.alloc_shared((TILE, TILE), dt)
            v_s = T.alloc_shared((TILE, TILE), dt)
            S = T.alloc_fragment((TILE, TILE), "float32")
            PV = T.alloc_fragment((TILE, TILE), "float32")
            m = T.alloc_fragment((TILE, 1), "float32")
            m_cur = T.alloc_fragment((TILE, 1), "float32")
            m_new = T.alloc_fragment((TILE, 1), "float32")
            alpha = T.alloc_fragment((TILE, 1), "float32")
            l_sum = T.alloc_fragment((TILE, 1), "float32")
            l_cur = T.alloc_fragment((TILE, 1), "float32")
            inv_l = T.alloc_fragment((TILE, 1), "float32")
            acc = [named(T.alloc_fragment((TILE, TILE), "float32"), f"acc{d}") for d in tiles]
            bh = by // q_blocks
            qb = by % q_blocks
            kv_row = ((bh // H) * H_kv + (bh % H) // group) * S_kv  # this head's kv head, first row
            T.fill(m, T.float32(-math.inf))
            T.fill(l_sum, 0)
            for d in tiles:  # a Python list: expanded while the program is built
                T.fill(acc[d], 0)
            # causal: the key blocks up to the one holding key qb*32 + 31 + offset
            n_kv = T.min(kv_blocks, (qb * TILE + TILE - 1 + offset) // TILE + 1) if spec.causal else kv_blocks
            for kb in T.serial(n_kv):
                T.fill(S, 0)
                for d in T.serial(n_d):
                    T.copy(io.buffers[0][by * TILE, d * TILE], q_s)
                    T.copy(io.buffers[1][kv_row + kb * TILE, d * TILE], k_s)
                    T.gemm(q_s, k_s, S, transpose_B=True)
                for i, j in T.Parallel(TILE, TILE):
                    if spec.causal:
                        masked = kb * TILE + j > qb * TILE + i + offset
                        S[i, j] = S[i, j] * T.float32(spec.scale) + T.if_then_else(
                            masked, T.float32(-math.inf), T.float32(0)
                        )
                    else:
                        S[i, j] = S[i, j] * T.float32(spec.scale)
                T.fill(m_cur, T.float32(-math.inf))
                T.reduce_max(S, m_cur, dim=1, clear=False)
                for i, j in T.Parallel(TILE, 1):
                    m_new[i, j] = T.max(m[i, j], m_cur[i, j])
                for i, j in T.Parallel(TILE, TILE):
                    S[i, j] = T.exp(S[i, j] - m_new[i, 0])
                for i, j in T.Parallel(TILE, 1):
                    alpha[i, j] = T.exp(m[i, j] - m_new[i, j])
                T.fill(l_cur, 0)
                T.reduce_sum(S, l_cur, dim=1, clear=False)
                for i, j in T.Parallel(TILE, 1):
                    l_sum[i, j] = l_sum[i, j] * alpha[i, j] + l_cur[i, j]
                for d in tiles:
                    T.fill(PV, 0)
                    T.copy(io.buffers[2][kv_row + kb * TILE, d * TILE], v_s)
                    T.gemm(S, v_s, PV)
                    for i, j in T.Parallel(TILE, TILE):
                        acc[d][i, j] = acc[d][i, j] * alpha[i, 0] + PV[i, j]
                T.copy(m_new, m)
            for i, j in T.Parallel(TILE, 1):
                inv_l[i, j] = T.float32(1) / l_sum[i, j]
            for d in tiles:
                for i, j in T.Parallel(TILE, TILE):
                    acc[d][i, j] = acc[d][i, j] * inv_l[i, 0]
                T.copy(acc[d], io.buffers[3][by * TILE, d * TILE])

    return main
