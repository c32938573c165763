"""Element-wise trees left between offloaded kernels, found for ``partition_for_tessera``.

After the anchored kernels (GEMM with its epilogue, attention, norms, softmax) are matched, what
stays in a Relax function are chains such as RoPE's ``x * cos + rotate_half(x) * sin`` or a residual
add that follows no GEMM. Each tree of element-wise ops whose inner values are used once (the rule of
Tessera's own fusion, graph/fusion.py) becomes one element-wise Tessera kernel: its root binding is
replaced by the kernel's call and the inner bindings are left dead (``remove_all_unused``).

Only float tensors of rank >= 1 qualify (0-d values stay with TVM; a 0-d constant such as hardswish's
``+ 3`` is a constant of the kernel), and a tree that is a single ``astype`` stays with TVM (a cast
alone is data movement); tensor constants (RoPE's tables) become inputs of the kernel.
"""

from __future__ import annotations

from typing import Any

from .._tvm import tvm
from ..graph.fusion import is_elementwise
from ..graph.nodes import Node, constant_value, node_of

relax = tvm.relax

#: dtypes an element-wise kernel reads and writes here.
_FLOATS = ("float32", "float16", "bfloat16")


def _is_float_tensor(expr) -> bool:
    """A float tensor of rank >= 1 (a 0-d tensor would be read as [1] by the kernel; TVM keeps those)."""
    sinfo = expr.struct_info
    return (
        isinstance(sinfo, relax.TensorStructInfo)
        and str(sinfo.dtype) in _FLOATS
        and sinfo.shape is not None
        and sinfo.ndim >= 1
    )


def _elementwise_node(var, value) -> Node | None:
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)):
        return None
    node = node_of(var, value)
    if not is_elementwise(node):
        return None
    if not _is_float_tensor(var) or not all(
        _is_float_tensor(a) or constant_value(a) is not None  # a scalar constant: a Const of the kernel
        for a in node.args
        if isinstance(a, relax.Var | relax.Constant)
    ):
        return None
    return node


def _count_uses(func) -> dict[Any, int]:
    """How often each var is read in ``func`` (every binding value and the body's result)."""
    counts: dict[Any, int] = {}

    def visit(expr) -> None:
        if isinstance(expr, relax.Var):
            counts[expr] = counts.get(expr, 0) + 1
        elif isinstance(expr, relax.Call):
            for a in expr.args:
                visit(a)
        elif isinstance(expr, relax.Tuple):
            for f in expr.fields:
                visit(f)
        elif isinstance(expr, relax.TupleGetItem):
            visit(expr.tuple_value)
        elif expr is not None:  # anything else (If, nested functions): count its free vars once
            for v in relax.analysis.free_vars(expr):
                counts[v] = counts.get(v, 0) + 1

    body = func.body
    for block in body.blocks:
        for binding in block.bindings:
            visit(binding.value)
    visit(body.body)
    return counts


def elementwise_trees(func) -> dict[Any, list[Node]]:
    """The element-wise trees of ``func``'s dataflow blocks: root binding var -> nodes in program
    order (the root last). A producer joins its consumer's tree when it is element-wise, in the same
    block, read once, and not a value the block hands out."""
    if not isinstance(func.body, relax.SeqExpr):
        return {}
    uses = _count_uses(func)
    trees: dict[Any, list[Node]] = {}
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        nodes = [_elementwise_node(b.var, b.value) if isinstance(b, relax.VarBinding) else None for b in block.bindings]
        order = {n.var: i for i, n in enumerate(nodes) if n is not None}
        by_var = {n.var: n for n in nodes if n is not None}
        taken: set[Any] = set()
        for root in reversed([n for n in nodes if n is not None]):
            if root.var in taken:
                continue
            members, stack = [], [root]
            while stack:
                node = stack.pop()
                members.append(node)
                taken.add(node.var)
                for a in node.args:
                    inner = by_var.get(a) if isinstance(a, relax.DataflowVar) else None
                    if inner is not None and inner.var not in taken and uses.get(a, 0) == 1:
                        stack.append(inner)
            if len(members) == 1 and root.op == "astype":
                continue
            trees[root.var] = sorted(members, key=lambda n: order[n.var])
    return trees
