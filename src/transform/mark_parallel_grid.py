"""tessera.MarkParallelGrid: annotate the grid loops of a CPU kernel as parallel.

Runs in LowerAndLegalize right after ``tl.MaterializeKernelLaunch``, while the grid loops still sit
directly around TileLang's ``tilelang_root`` block, and annotates them
``{"tessera.parallel_grid": 1}`` (``tessera.LowerParallelGrid`` turns them into a parallel region;
parallel_region.py says why). A kernel whose blocks use atomics is left serial: the CPU lowering
turns atomics into plain read-modify-writes, which blocks on other threads would race on.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, prim_func_pass, register_pass

from . import analysis
from .parallel_region import ANNOTATION, ROOT_BLOCK


def _grid_loops(loop) -> list | None:
    """The loops from ``loop`` down to TileLang's root block, when they are nothing but loops."""
    loops, node = [], loop
    while isinstance(node, tvm.tirx.For):
        loops.append(node)
        node = node.body
    if isinstance(node, tvm.tirx.SBlockRealize) and node.block.name_hint == ROOT_BLOCK:
        return loops
    return None


def mark_parallel_grid(func):
    """``func`` with its grid loops annotated (unchanged when its blocks use atomics or it has no grid)."""
    if analysis.uses(func.body, lambda n: "atomic" in (analysis.op_name(n) or "")):
        return func

    def pre(node):
        loops = _grid_loops(node)
        if loops is None:
            return None
        body = loops[-1].body
        for loop in reversed(loops):
            annotations = {**dict(loop.annotations), ANNOTATION: tvm.tirx.IntImm("int32", 1)}
            body = tvm.tirx.For(
                loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, annotations, loop.step
            )
        return body

    body = tvm.tirx.stmt_functor.ir_transform(func.body, pre, None, ["tirx.For"])
    return func.with_body(body)


@register_pass(
    "tessera.MarkParallelGrid",
    doc="annotate the kernel grid loops of CPU kernels as parallel (not when blocks use atomics)",
)
def _mark_parallel_grid(ctx: BuildContext):
    return prim_func_pass(lambda _gv, func: mark_parallel_grid(func), name="tessera.MarkParallelGrid")
