"""Index expressions of the annotated IR (pages, loop bounds, block indices) printed as C++.

Only integer arithmetic on non-negative values reaches the kernels (tile ids, block indices,
loop counters, page numbers), so ``floordiv`` / ``floormod`` print as ``/`` and ``%`` on
``uint32_t``. Variables get C++ names from their IR names, made unique per kernel by ``Names``.
"""

from __future__ import annotations

import keyword
import re

from tessera_tvm._tvm import tvm
from tessera_tvm.errors import TesseraError

_CXX_KEYWORDS = {
    "auto",
    "bool",
    "break",
    "case",
    "char",
    "class",
    "const",
    "constexpr",
    "continue",
    "default",
    "delete",
    "do",
    "double",
    "else",
    "enum",
    "extern",
    "float",
    "for",
    "goto",
    "if",
    "inline",
    "int",
    "long",
    "namespace",
    "new",
    "operator",
    "private",
    "public",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "struct",
    "switch",
    "template",
    "this",
    "throw",
    "try",
    "typedef",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "while",
    "main",
    "std",
    "tt",
}


class CodegenError(TesseraError):
    """The annotated IR holds something the Tenstorrent code generator cannot print."""


class Names:
    """Unique C++ identifiers for IR variables and generated names, per kernel."""

    def __init__(self, reserved: set[str] | None = None):
        self.taken: set[str] = set(reserved or ())
        self.vars: list[tuple[object, str]] = []

    def fresh(self, hint: str) -> str:
        base = re.sub(r"\W", "_", hint) or "v"
        if base[0].isdigit():
            base = f"v_{base}"
        if base in _CXX_KEYWORDS or keyword.iskeyword(base):
            base = f"{base}_"
        name, n = base, 1
        while name in self.taken:
            name = f"{base}_{n}"
            n += 1
        self.taken.add(name)
        return name

    def bind(self, var, hint: str | None = None) -> str:
        name = self.fresh(hint or str(var.name))
        self.vars.append((var, name))
        return name

    def of(self, var) -> str:
        for known, name in self.vars:
            if known.same_as(var):
                return name
        raise CodegenError(f"variable {var} is used before the kernel defines it")


_PRECEDENCE = {
    "Mul": 5, "FloorDiv": 5, "FloorMod": 5, "Add": 4, "Sub": 4,
    "LT": 3, "LE": 3, "GT": 3, "GE": 3, "EQ": 2, "NE": 2, "And": 1, "Or": 0,
}  # fmt: skip
_OPERATOR = {
    "Mul": "*", "FloorDiv": "/", "FloorMod": "%", "Add": "+", "Sub": "-",
    "LT": "<", "LE": "<=", "GT": ">", "GE": ">=", "EQ": "==", "NE": "!=", "And": "&&", "Or": "||",
}  # fmt: skip


def cxx(expr, names: Names) -> str:
    """``expr`` as a C++ ``uint32_t`` expression."""
    return _print(expr, names, 0)


def _print(expr, names: Names, parent: int, right: bool = False) -> str:
    tirx = tvm.tirx
    if isinstance(expr, int):
        return str(expr)
    if isinstance(expr, tirx.IntImm):
        if expr.value < 0:
            raise CodegenError(f"negative index constant {expr.value} in a Tenstorrent kernel")
        return str(int(expr.value))
    if isinstance(expr, tirx.Var):
        return names.of(expr)
    if isinstance(expr, tirx.Cast):
        return _print(expr.value, names, parent, right)
    kind = type(expr).__name__
    if kind in ("Min", "Max"):  # unsigned operands: a conditional, no <algorithm> in kernels
        a, b = _print(expr.a, names, 0), _print(expr.b, names, 0)
        return f"({a} {'<' if kind == 'Min' else '>'} {b} ? {a} : {b})"
    if kind not in _PRECEDENCE:
        raise CodegenError(f"cannot print {kind} ({expr}) in a Tenstorrent kernel")
    own = _PRECEDENCE[kind]
    text = f"{_print(expr.a, names, own)} {_OPERATOR[kind]} {_print(expr.b, names, own, right=True)}"
    needs = own < parent or (right and own == parent)
    return f"({text})" if needs else text


def used_vars(expr) -> list:
    found: list = []
    tvm.tirx.stmt_functor.post_order_visit(
        tvm.tirx.Evaluate(expr) if not isinstance(expr, int) else tvm.tirx.Evaluate(0),
        lambda n: found.append(n) if isinstance(n, tvm.tirx.Var) else None,
    )
    return found
