"""tessera.LowerParallelGrid: the annotated grid of a CPU kernel as one parallel region.

Runs last, on the device module, and rewrites each outermost loop nest that
``tessera.MarkParallelGrid`` annotated into one parallel region (tessera/cpu_parallel.h says what
the C looks like):

    T.tessera.parallel_begin(blocks)                 # TESSERA_PARALLEL_BEGIN: a team of threads
    acc = T.alloc_buffer(...)                        # the blocks' arrays, moved in: one per thread
    for claim in range(blocks):
        block: T.int32 = T.tessera.next_block()      # TESSERA_NEXT_BLOCK: an atomic counter
        if block >= blocks:
            T.break_loop()
        bx: T.int32 = block // ny
        by: T.int32 = block % ny
        <the block's body>
    T.tessera.parallel_end()                         # TESSERA_PARALLEL_END

Threads claim blocks one at a time from a shared counter (dynamic scheduling), which balances
grids whose blocks differ in cost (causal attention, ragged edges) and cores that are busy with
other work (a static split waits for its slowest thread). The arrays the blocks use were hoisted
to the top of the kernel by ``tl.StorageRewrite``; they move into the region so that every thread
has its own. A nest that uses an array also used outside it stays serial.
"""

from __future__ import annotations

import math

from tessera_tvm._tvm import tvm
from tessera_tvm.errors import LoweringError
from tessera_tvm.registry import BuildContext, register_pass, tessera_module_pass

from . import analysis
from .parallel_region import ANNOTATION, PARALLEL_BEGIN, next_block, parallel_begin, parallel_end

_FLAT_DECLS = (tvm.tirx.Bind, tvm.tirx.DeclBuffer, tvm.tirx.AllocBuffer)


def _is_grid_loop(node) -> bool:
    return isinstance(node, tvm.tirx.For) and ANNOTATION in node.annotations


def _nest(loop) -> tuple[list, list, object]:
    """(grid loops, declarations between them, the innermost body) of the nest starting at ``loop``."""
    loops, decls, node = [loop], [], loop.body
    while True:
        if _is_grid_loop(node):
            loops.append(node)
            node = node.body
        elif (
            isinstance(node, tvm.tirx.SeqStmt)
            and _is_grid_loop(node.seq[-1])
            and all(isinstance(s, _FLAT_DECLS) for s in node.seq[:-1])
        ):
            decls.extend(node.seq[:-1])
            loops.append(node.seq[-1])
            node = node.seq[-1].body
        else:
            return loops, decls, node


def _data_vars(stmt) -> set:
    """Buffer data variables ``stmt`` reads, writes or takes the address of."""
    found: set = set()

    def visit(node):
        if isinstance(node, tvm.tirx.BufferLoad | tvm.tirx.BufferStore):
            found.add(node.buffer.data)
        elif isinstance(node, tvm.tirx.DeclBuffer):
            found.add(node.buffer.data)
        elif isinstance(node, tvm.tirx.Var):
            found.add(node)

    tvm.tirx.stmt_functor.post_order_visit(stmt, visit)
    return found


#: Most blocks one region may have: tessera/cpu_parallel.h claims them with an int32 counter, which
#: each of up to 1024 threads advances once past the last block.
MAX_BLOCKS = 2**31 - 1 - 1024


def _int32_extents(loops, kernel: str) -> list:
    """The grid extents as int32. A grid over a dim of 2^31 or more (an int64 extent) has a constant
    block count that fits the region's int32 counter, or the kernel cannot run as one region."""
    extents = [lp.extent for lp in loops]
    if all(str(e.dtype) == "int32" for e in extents):
        return extents
    analyzer = tvm.arith.Analyzer()
    wide = [analyzer.simplify(tvm.tirx.Cast("int64", e) if str(e.dtype) != "int64" else e) for e in extents]
    if not all(isinstance(e, tvm.tirx.IntImm) for e in wide):
        shape = " x ".join(str(e) for e in wide)
        raise LoweringError(
            f"tessera.LowerParallelGrid: kernel {kernel!r} has a grid of {shape} blocks with a 64-bit extent "
            "that is not a constant; the CPU parallel region counts blocks in int32: bind the dim to a value"
        )
    blocks = math.prod(int(e.value) for e in wide)
    if blocks > MAX_BLOCKS:
        shape = " x ".join(str(int(e.value)) for e in wide)
        raise LoweringError(
            f"tessera.LowerParallelGrid: kernel {kernel!r} has a grid of {shape} = {blocks} blocks; the CPU "
            f"parallel region counts blocks in int32 and takes at most {MAX_BLOCKS}: use larger blocks"
        )
    return [tvm.tirx.IntImm("int32", int(e.value)) for e in wide]


def _region(loop, private: list, kernel: str = "kernel"):
    """The parallel region replacing the grid nest at ``loop``; ``private`` are the arrays moved in."""
    tirx = tvm.tirx
    loops, decls, body = _nest(loop)
    extents = _int32_extents(loops, kernel)
    blocks = extents[0]
    for extent in extents[1:]:
        blocks = blocks * extent
    blocks = tvm.arith.Analyzer().simplify(blocks)
    block, claim = tirx.Var("block", "int32"), tirx.Var("claim", "int32")
    binds, stride = [], 1
    # The innermost loop varies fastest. block >= 0, so C's / and % (truncating) are floor division:
    # this pass runs after tl.LowerIntrin, which is what would lower floordiv/floormod.
    for lp, extent in reversed(list(zip(loops, extents, strict=True))):
        index = block if _is_one(stride) else tirx.truncdiv(block, stride)
        if lp is not loops[0]:
            index = tirx.truncmod(index, extent)
        if index.dtype != lp.loop_var.dtype:  # the grid index of a 64-bit grid loop (a dim of 2^31 or more)
            index = tirx.Cast(lp.loop_var.dtype, index)
        binds.append(tirx.Bind(lp.loop_var, index if _is_zero(lp.min) else lp.min + index))
        stride = tvm.arith.Analyzer().simplify(stride * extent)
    binds.reverse()
    inner = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    done = tirx.IfThenElse(block >= blocks, tirx.Evaluate(tirx.op.break_loop()), None)
    # Each thread claims blocks until the grid is used up: at most `blocks` claims.
    grid = tirx.For(
        claim,
        0,
        blocks,
        tirx.ForKind.SERIAL,
        tirx.SeqStmt([tirx.Bind(block, next_block()), done, *binds, *decls, *inner]),
    )
    return tirx.SeqStmt([tirx.Evaluate(parallel_begin(blocks)), *private, grid, tirx.Evaluate(parallel_end())])


def _is_zero(expr) -> bool:
    return isinstance(expr, tvm.tirx.IntImm) and int(expr.value) == 0


def _is_one(expr) -> bool:
    return isinstance(expr, int) and expr == 1 or isinstance(expr, tvm.tirx.IntImm) and int(expr.value) == 1


def _is_one_block(loop) -> bool:
    loops, _, _ = _nest(loop)
    extents = [lp.extent for lp in loops]
    return all(isinstance(e, tvm.tirx.IntImm) for e in extents) and math.prod(int(e.value) for e in extents) <= 1


def _allocations(stmt) -> set:
    """Data variables of the arrays allocated in ``stmt``."""
    found: set = set()
    tvm.tirx.stmt_functor.post_order_visit(
        stmt, lambda n: found.add(n.buffer.data) if isinstance(n, tvm.tirx.AllocBuffer) else None
    )
    return found


def _serial(loop):
    """The nest at ``loop`` without its grid annotations (it stays a serial loop nest)."""

    def post(node):
        if _is_grid_loop(node):
            annotations = {k: v for k, v in node.annotations.items() if k != ANNOTATION}
            return tvm.tirx.For(
                node.loop_var, node.min, node.extent, node.kind, node.body, node.thread_binding, annotations, node.step
            )
        return None

    return tvm.tirx.stmt_functor.ir_transform(loop, None, post, ["tirx.For"])


class _Lowering:
    """Lowers the grid nests of one function; ``arrays`` are all the arrays the function allocates."""

    def __init__(self, func):
        self.arrays = _allocations(func.body)
        self.name = str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else "kernel"

    def nest(self, loop, private: list, used_elsewhere: set):
        """The region for the nest at ``loop`` (``private``: sibling arrays moved into it), or the nest
        left serial when it uses an array it cannot take along."""
        if _is_one_block(loop):
            return _serial(loop)
        moved = {p.buffer.data for p in private}
        foreign = (_data_vars(loop) & self.arrays) - _allocations(loop) - moved
        if foreign or moved & used_elsewhere:
            return _serial(loop)
        return _region(loop, private, self.name)

    def seq(self, stmts: list, outside: set) -> list:
        """Lower the statement list ``stmts``; ``outside`` are the data variables used outside it."""
        out = list(stmts)
        for i, stmt in enumerate(stmts):
            wrappers, nest = _peel_attrs(stmt)
            if not _is_grid_loop(nest):
                continue
            used_inside = _data_vars(stmt)
            allocated_before = set().union(*(_allocations(other) for other in stmts[:i]))
            # Arrays declared before the nest and used in it move in with it (with their aliases).
            movable = [
                j
                for j, other in enumerate(stmts[:i])
                if isinstance(other, tvm.tirx.AllocBuffer | tvm.tirx.DeclBuffer)
                and other.buffer.data in used_inside
                and other.buffer.data in allocated_before
            ]
            elsewhere = set(outside)
            for j, other in enumerate(stmts):
                if j != i and j not in movable:
                    elsewhere |= _data_vars(other)
            lowered = self.nest(nest, [stmts[j] for j in movable], elsewhere)
            if _is_region(lowered):
                for j in movable:
                    out[j] = None
            for wrapper in reversed(wrappers):
                lowered = _replace_body(wrapper, lowered)
            out[i] = lowered
        return [s for s in out if s is not None]

    def stmt(self, stmt, outside: set):
        tirx = tvm.tirx
        if isinstance(stmt, tirx.SeqStmt):
            lowered = self.seq(list(stmt.seq), outside)
            children = []
            for k, child in enumerate(lowered):
                if _is_region(_peel_attrs(child)[1]):
                    children.append(child)
                    continue
                rest = set(outside)
                for j, other in enumerate(lowered):
                    if j != k:
                        rest |= _data_vars(other)
                children.append(self.stmt(child, rest))
            return children[0] if len(children) == 1 else tirx.SeqStmt(children)
        if _is_grid_loop(stmt):
            return self.nest(stmt, [], outside)
        if isinstance(stmt, tirx.For | tirx.AttrStmt):
            return _replace_body(stmt, self.stmt(stmt.body, outside))
        if isinstance(stmt, tirx.IfThenElse):
            else_case = self.stmt(stmt.else_case, outside) if stmt.else_case is not None else None
            return tirx.IfThenElse(stmt.condition, self.stmt(stmt.then_case, outside), else_case)
        return stmt


def _peel_attrs(stmt) -> tuple[list, object]:
    """The AttrStmts wrapping ``stmt`` (outermost first) and what they wrap: with a symbolic dim,
    tl.InjectAssumes puts the grid nest inside a ``tl.assume`` attribute, which the arrays declared
    before it must not keep from moving into the parallel region."""
    wrappers = []
    while isinstance(stmt, tvm.tirx.AttrStmt):
        wrappers.append(stmt)
        stmt = stmt.body
    return wrappers, stmt


def _is_region(stmt) -> bool:
    return (
        isinstance(stmt, tvm.tirx.SeqStmt)
        and isinstance(stmt.seq[0], tvm.tirx.Evaluate)
        and analysis.op_name(stmt.seq[0].value) == PARALLEL_BEGIN
    )


def _replace_body(stmt, body):
    tirx = tvm.tirx
    if isinstance(stmt, tirx.For):
        return tirx.For(
            stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations, stmt.step
        )
    return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body)


def lower_parallel_grid(func):
    """``func`` with each outermost annotated grid nest turned into a parallel region."""
    return func.with_body(_Lowering(func).stmt(func.body, set()))


@register_pass("tessera.LowerParallelGrid", doc="turn annotated CPU grid loops into an OpenMP parallel region")
def _lower_parallel_grid(ctx: BuildContext):
    def run(mod, _pass_ctx):
        out = mod.clone()
        for gv, func in analysis.device_kernels(mod):
            if analysis.is_cpu_kernel(func):
                out[gv] = lower_parallel_grid(func)
        return out

    return tessera_module_pass(run, name="tessera.LowerParallelGrid")
