"""Both ways between Tessera kernels and Relax modules.

    mod, gv = tessera_tvm.relax.add_kernel(mod, linear, shapes={"M": 64, "K": 32, "N": 48})
    # gv is a Relax function in mod: the kernel's Graph IR, callable from the user's functions

    kernel = tessera_tvm.relax.from_relax(mod["main"])     # a @tessera.kernel
    ts.compile(kernel, target="cpu")(a, w, b)              # when main uses only Tessera's op set

``from_relax`` builds a ``tessera.Kernel`` whose body interprets the Relax function with
``tessera.ops`` (``tessera/relax_import.py``, the kernel frontend's, registered here when ``tessera``
is imported: this package never imports the frontend). An operator outside Tessera's op set is an
error naming it and the op set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import op_table
from .._tvm import tvm
from ..errors import TesseraError
from ..graph.nodes import rebuild

relax = tvm.relax


class NotInOpSet(TesseraError):
    """A Relax function uses an operator Tessera's op set does not have."""


# ---------------------------------------------------------------------------------------------
# Tessera -> Relax
# ---------------------------------------------------------------------------------------------


def kernel_function(kernel, shapes: dict[str, int] | None = None, name: str | None = None):
    """The Relax function of a ``@tessera.kernel``'s Graph IR (after simplification, before fusion)."""
    if not hasattr(kernel, "graph") or not hasattr(kernel, "name"):
        raise TesseraError(f"expected a @tessera.kernel, found {type(kernel).__name__}")
    graph = kernel.graph(shapes)
    flat = graph.simplified
    flat.name = name or kernel.name
    func = rebuild(flat)
    if shapes:  # the Graph IR keeps dims symbolic; Relax users get the bound values
        func = func.bind_symbolic_vars({k: int(v) for k, v in shapes.items()})
    return relax.utils.copy_with_new_vars(func).with_attr("global_symbol", flat.name)


def add_kernel(mod, kernel, *, shapes: dict[str, int] | None = None, name: str | None = None):
    """``mod`` plus the kernel's Graph IR as a public Relax function; returns ``(module, GlobalVar)``.

    Dims the kernel names are bound from ``shapes`` (unbound ones stay symbolic, which
    ``partition_for_tessera`` then leaves to TVM). Call it from your own functions like any other
    Relax function; ``partition_for_tessera`` offloads its operators like the rest of the module.
    """
    func = kernel_function(kernel, shapes, name)
    symbol = str(func.attrs["global_symbol"])
    if any(str(gv.name_hint) == symbol for gv in mod.get_global_vars()):
        raise TesseraError(f"the module already has a function named {symbol!r}; pass name=...")
    bb = relax.BlockBuilder(mod)
    gv = bb.add_func(func, symbol)  # a GlobalVar with the function's struct info: callable as relax.Call(gv, ...)
    return bb.get(), gv


# ---------------------------------------------------------------------------------------------
# Relax -> Tessera
# ---------------------------------------------------------------------------------------------

#: Relax operators with a Tessera op, for the error message (permute_dims: as a matmul operand
#: transpose or around attention; ones/zeros: as a norm's absent weight/bias).
OP_SET = (
    *(op.relax[0] for op in op_table.ANCHORS if op.frontend),
    *(op.relax for op in (*op_table.OPS, op_table.CLIP) if op.frontend),
    "permute_dims", "ones", "zeros",
)  # fmt: skip


_kernel_frontend: Callable[..., Any] | None = None


def register_kernel_frontend(build: Callable[..., Any]) -> None:
    """Called by the kernel frontend (``tessera``) as it is imported: ``build(func, name=...)`` makes
    the ``@tessera.kernel`` that :func:`from_relax` returns. tessera_tvm never imports the frontend
    (ARCHITECTURE.md, "Layers"), so the frontend registers it from above."""
    global _kernel_frontend
    _kernel_frontend = build


def from_relax(func, *, name: str | None = None):
    """A ``@tessera.kernel`` computing the Relax function ``func`` (which must use Tessera's op set):
    ``tessera.from_relax``, which ``import tessera`` registers here. Without it, a TesseraError
    saying so."""
    if _kernel_frontend is None:
        raise TesseraError(
            "from_relax returns a @tessera.kernel, built by the kernel frontend: `import tessera` first "
            "(tessera.from_relax is the same function)"
        )
    return _kernel_frontend(func, name=name)
