"""Expressions of element-wise kernels: the tree an ``ElementwiseSpec`` computes per element.

``Input`` (an operand's value at the current element), ``Const``, ``Unary`` and ``Binary`` nodes
(their ops in ``UNARY_OPS`` / ``BINARY_OPS``) make up an ``Expr``; ``expr_nodes`` walks a tree and
``expr_text`` prints it on one line for schedule and tile dumps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .. import op_table
from .base import SpecError, _check_dtype

#: The tile names of the op table's unary and binary ops, in its order.
UNARY_OPS = tuple(op.name for op in op_table.UNARY)
BINARY_OPS = tuple(op.name for op in op_table.BINARY)


@dataclass(frozen=True)
class Input:
    """The value of input ``name`` at the current element (broadcast to the output shape)."""

    name: str


@dataclass(frozen=True)
class Const:
    """A scalar constant."""

    value: float


@dataclass(frozen=True)
class Unary:
    """``op(x)``; ``cast`` rounds to ``dtype`` (then computation continues in the compute dtype)."""

    op: str
    x: Expr
    dtype: str | None = None

    def __post_init__(self) -> None:
        if self.op not in UNARY_OPS:
            raise SpecError(f"Unary: op is {self.op!r}; expected one of {', '.join(UNARY_OPS)}")
        if self.op == "cast":
            _check_dtype("Unary(cast)", "dtype", self.dtype)


@dataclass(frozen=True)
class Binary:
    """``op(x, y)``."""

    op: str
    x: Expr
    y: Expr

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise SpecError(f"Binary: op is {self.op!r}; expected one of {', '.join(BINARY_OPS)}")


Expr = Input | Const | Unary | Binary


def expr_nodes(expr: Expr) -> Iterator[Expr]:
    """Every node of ``expr``, parents before children."""
    yield expr
    if isinstance(expr, Unary):
        yield from expr_nodes(expr.x)
    elif isinstance(expr, Binary):
        yield from expr_nodes(expr.x)
        yield from expr_nodes(expr.y)


def expr_text(expr: Expr) -> str:
    """A readable one-line form of ``expr`` (for schedule/tile dumps)."""
    if isinstance(expr, Input):
        return expr.name
    if isinstance(expr, Const):
        return repr(expr.value)
    if isinstance(expr, Unary):
        return f"cast<{expr.dtype}>({expr_text(expr.x)})" if expr.op == "cast" else f"{expr.op}({expr_text(expr.x)})"
    return f"{expr.op}({expr_text(expr.x)}, {expr_text(expr.y)})"
