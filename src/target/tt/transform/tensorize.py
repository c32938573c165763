"""tt.Tensorize: recognise the tile operations of each tile and annotate what the TT kernels do.

Recognition looks at the IR, never at names: ``tl.tileop.gemm`` / ``copy`` / ``fill`` calls, and
32x32 element-wise loop nests whose stores are analysed as expression trees over tiles:

    T.fill(acc, 0)                    the accumulator: a fresh DST (tile_regs_acquire zeroes it)
    T.gemm(a, b, acc)                 matmul of two input-CB tiles into DST (matmul_tiles; transpose_B too)
    T.copy(dram -> tile)              a reader tile pushed into the tile's input CB
    T.copy(tile -> dram)              pack the tile to its output CB; the writer stores it
    T.copy(tile -> tile)              an alias
    out[i, j] = f(...)                element-wise: x + y, x - y, x * y (FPU, both operands in CBs;
                                      a DRAM row vector ``v[c0 + j]`` broadcasts over rows), and the
                                      SFPU ops exp(x), relu = max(x, 0), gelu (erf and tanh forms)
                                      on the DST tile; an epilogue is this applied to the accumulator

Each recognised statement is wrapped in AttrStmts the code generator reads (and nothing else):

    tt.read     {cb, buffer, page}              reader: push DRAM page ``page`` (a PrimExpr) into CB ``cb``
    tt.compute  {tile_op, ops: [...]}           compute: the ops below, in order
    tt.write    {cb, buffer, page}              writer: pop CB ``cb`` into DRAM page ``page``

with compute ops

    {op: acquire, init}                         tile_regs_acquire; ``init``: the FPU mode to (re)initialise
    {op: matmul, in0, in1, dst, transpose, wait, pop}
    {op: binary, fn: add|sub|mul, bcast: none|rows, in0, in1, dst, wait, pop}
    {op: copy, cb, dst, wait, pop}              copy_tile of an input tile into DST
    {op: sfpu, fn: exp|gelu|gelu_tanh|relu|sqrt|recip|binop_scalar, dst, init[, mode: add|sub|mul|div|rsub, value]}
    {op: pack, dst, cb, commit}                 (tile_regs_commit + wait when ``commit``) pack to ``cb``
    {op: release}                               tile_regs_release

``wait`` / ``pop`` list the CBs whose front tile an op waits for first / pops last. A DST value an
FPU op needs as a CB operand is spilled to an intermediate CB (c_24.. of 32), added to
``tt.circular_buffers``. Inits are planned once per kernel: ``tt.compute_init`` holds the hardware
init and, when a kernel uses one FPU mode (or one SFPU op), that init too, hoisted out of the tile
loop; otherwise ``acquire``/``sfpu`` ops carry the short init where the mode changes.

A statement that cannot be mapped is wrapped in ``tt.unsupported {op, reason}`` and tensorization
of that kernel stops there; ``tt.VerifyTTIR`` reports it with its location.

``tensorizer`` does the recognition (with the expression patterns of ``tile_exprs``); this module
wraps the recorded statements in their annotations and registers the pass.
"""

from __future__ import annotations

from typing import Any

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, register_pass

from . import common
from .tensorizer import _Tensorizer
from .tile_exprs import match_gelu, same_expr

__all__ = ["UNSUPPORTED", "match_gelu", "same_expr", "tensorize", "tensorize_pass"]

UNSUPPORTED = "tt.unsupported"


# ---------------------------------------------------------------------------------------------
# Rewriting: wrap each recorded statement in its annotations
# ---------------------------------------------------------------------------------------------


def _annotate(stmt, records: list, position: list) -> Any:
    tirx = tvm.tirx
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_annotate(s, records, position) for s in stmt.seq])
    if isinstance(stmt, tirx.SBlockRealize):
        block = stmt.block
        new_block = tirx.SBlock(
            block.iter_vars,
            block.reads,
            block.writes,
            block.name_hint,
            _annotate(block.body, records, position),
            block.init,
            block.alloc_buffers,
            block.match_buffers,
            block.annotations,
        )
        return tirx.SBlockRealize(stmt.iter_values, stmt.predicate, new_block)
    if isinstance(stmt, tirx.Bind) and not stmt.var.dtype.startswith("float"):
        return stmt
    if isinstance(stmt, tirx.AllocBuffer | tirx.DeclBuffer):
        return stmt
    if isinstance(stmt, tirx.For) and _is_loop_of_statements(stmt):
        return tirx.For(
            stmt.loop_var,
            stmt.min,
            stmt.extent,
            stmt.kind,
            _annotate(stmt.body, records, position),
            stmt.thread_binding,
            stmt.annotations,
        )
    if position[0] >= len(records):
        return stmt  # after the statement tensorization stopped at
    record = records[position[0]]
    position[0] += 1
    if record.unsupported is not None:
        op, reason = record.unsupported
        return tirx.AttrStmt({"op": op, "reason": reason}, UNSUPPORTED, 0, stmt)
    body = stmt
    for write in reversed(record.writes):
        body = tirx.AttrStmt(write, common.WRITE, 0, body)
    body = tirx.AttrStmt({"tile_op": record.tile_op, "ops": record.ops}, common.COMPUTE, 0, body)
    for read in reversed(record.reads):
        body = tirx.AttrStmt(read, common.READ, 0, body)
    return body


def _is_loop_of_statements(loop) -> bool:
    inner = loop.body
    if not isinstance(inner, tvm.tirx.For):
        return True
    body = inner.body
    stmts = list(body.seq) if isinstance(body, tvm.tirx.SeqStmt) else [body]
    return any(common.tile_op(s) or isinstance(s, tvm.tirx.For) for s in stmts)


def tensorize(name: str, func):
    loop = common.persistent_loop(func)
    if loop is None:
        raise common.TTLoweringError(f"kernel {name!r} has no tt.persistent loop; run tt.GridToPersistent first")
    worker = _Tensorizer(name, func)
    worker.run(loop.body)
    inits = worker.finish()
    position = [0]

    def pre(node):
        if node.same_as(loop):
            return tvm.tirx.For(
                loop.loop_var,
                loop.min,
                loop.extent,
                loop.kind,
                _annotate(loop.body, worker.records, position),
                loop.thread_binding,
                loop.annotations,
            )
        return None

    body = tvm.tirx.stmt_functor.ir_transform(func.body, pre, None, ["tirx.For"])
    func = func.with_body(body).with_attr(common.CIRCULAR_BUFFERS, sorted(worker.cbs, key=lambda cb: cb["id"]))
    if inits is not None:
        func = func.with_attr(common.COMPUTE_INIT, inits)
    return func


@register_pass("tt.Tensorize", doc="recognise tile ops (gemm, copies, element-wise, SFPU, epilogues) and annotate them")
def tensorize_pass(ctx: BuildContext):
    return common.module_pass(tensorize, name="tt.Tensorize")
