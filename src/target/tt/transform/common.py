"""What the Tenstorrent passes share: errors, config access and read-only helpers on tile programs.

The attribute names the passes and the code generator share (``tt.arch`` ... ``tt.compute_init``,
with their meaning in pipeline order), their readers (:func:`attr`, :func:`to_python`,
:func:`prim_funcs`, :func:`persistent_loop`) and the Tenstorrent errors are
``tessera_tvm.target.tt.ir``'s, the backend's side of the contract; they are re-exported here, so
the passes keep writing ``common.SCHEDULE``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tessera_tvm._tvm import tvm
from tessera_tvm.target.tt.ir import (  # noqa: F401  (re-exported: the passes' names for the contract)
    ARCH,
    CB_SCOPE,
    CIRCULAR_BUFFERS,
    COMPUTE,
    COMPUTE_CONFIG,
    COMPUTE_INIT,
    CORE_MAP,
    DEFAULTS,
    PADDING,
    PERSISTENT,
    READ,
    SCHEDULE,
    SHARD,
    WRITE,
    TTLoweringError,
    TTResourceError,
    TTVerificationError,
    UnsupportedTTOperationError,
    attr,
    persistent_loop,
    prim_funcs,
    to_python,
)
from tessera_tvm.transform.analysis import kernel_name, op_name

_BLOCK_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
# The free buffers and variables TVMScript declares before printing a statement on its own.
_DECLARATION = re.compile(r"^\w+ = T\.(Buffer|handle|bool|int\d+|uint\d+|float\d+|bfloat16)\(")


# ---------------------------------------------------------------------------------------------
# Functions, attrs, config
# ---------------------------------------------------------------------------------------------


def require_attr(func, key: str, name: str, producer: str) -> Any:
    value = attr(func, key)
    if value is None:
        raise TTLoweringError(
            f"kernel {name!r} has no {key} attribute; run {producer} before this pass "
            "(configs/tenstorrent.yaml has the pipeline order)"
        )
    return value


def module_pass(transform: Callable[[str, Any], Any], *, name: str):
    """A ``prim_func_pass`` applying ``transform(kernel_name, func) -> func`` to every PrimFunc."""
    from tessera_tvm.registry import prim_func_pass

    return prim_func_pass(lambda gv, func: transform(kernel_name(gv, func), func), name=name)


def tt_options(ctx) -> dict[str, Any]:
    """The config's ``tt:`` section, or a LoweringError naming the config when it has none."""
    options = ctx.config.tt_dict
    if not options:
        raise TTLoweringError(
            f"the tt.* passes need a Tenstorrent config (codegen.kind: tt with a `tt:` section); "
            f"config {ctx.config.name!r} has none"
        )
    return options


# ---------------------------------------------------------------------------------------------
# IR helpers
# ---------------------------------------------------------------------------------------------


def tile_op(stmt) -> tuple[str, Any] | None:
    """``(op name, call)`` when ``stmt`` is a TileLang tile operation (``T.copy``, ``T.gemm``, ...)."""
    if isinstance(stmt, tvm.tirx.Evaluate):
        name = op_name(stmt.value)
        if name is not None and name.startswith("tl.tileop."):
            return name, stmt.value
    return None


def region(arg) -> tuple[Any, list, list] | None:
    """``(buffer, start indices, extents)`` of a ``T.region(...)`` operand of a tile op."""
    if op_name(arg) == "tl.tileop.region" or op_name(arg) == "tl.region":
        load = arg.args[0]
        if isinstance(load, tvm.tirx.BufferLoad):
            return load.buffer, list(load.indices), list(arg.args[2:])
    if isinstance(arg, tvm.tirx.BufferLoad):
        return arg.buffer, list(arg.indices), [1] * len(arg.indices)
    return None


def is_dram(buffer) -> bool:
    return buffer.scope() == "global"


def const_int(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tvm.tirx.IntImm) else None


def launch_grid(func) -> list[tuple[str, Any, int]]:
    """``(tag, var, extent)`` of the ``blockIdx`` launch attrs of a kernel, outermost first."""
    found: list = []

    def visit(node):
        if (
            isinstance(node, tvm.tirx.AttrStmt)
            and node.attr_key == "thread_extent"
            and str(node.node.thread_tag) in _BLOCK_TAGS
        ):
            extent = const_int(node.value)
            found.append((str(node.node.thread_tag), node.node.var, extent))

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return list(reversed(found))


def first_line(stmt) -> str:
    """The first line of a statement's TVMScript, for error messages."""
    try:
        text = stmt.script()
    except Exception:  # pragma: no cover - printing is best effort in an error path
        return type(stmt).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    lines = [
        ln for ln in lines if not ln.startswith(("@T.", "def ", "from ", "import ")) and not _DECLARATION.match(ln)
    ]
    return lines[0] if lines else type(stmt).__name__


# ---------------------------------------------------------------------------------------------
# Circular buffers
# ---------------------------------------------------------------------------------------------


def cb_ranges(num_cbs: int) -> dict[str, int]:
    """First CB id of each role, tt-metal's convention scaled to the arch's CB count:
    inputs from 0, outputs from num_cbs/2 (c_16 of 32), intermediates from 3*num_cbs/4 (c_24)."""
    return {"input": 0, "output": num_cbs // 2, "intermediate": 3 * num_cbs // 4}


def l1_bytes(cbs: list[dict]) -> int:
    return sum(cb["num_pages"] * cb["page_size"] for cb in cbs)


def check_circular_buffers(name: str, cbs: list[dict], arch: dict, config_name: str) -> None:
    """Raise ``TTResourceError`` when the CBs of kernel ``name`` do not fit one core of ``arch``."""
    limit = arch["num_cbs"]
    first = cb_ranges(limit)
    # Inputs and outputs keep tt-metal's ranges; intermediates start at c_24 and, when a kernel needs
    # more (attention's carried tiles), take the ids inputs and outputs leave free.
    ends = {"input": first["output"], "output": first["intermediate"]}
    for role, end in ends.items():
        ids = sorted(cb["id"] for cb in cbs if cb.get("role") == role)
        if ids and (ids[-1] >= end or ids[0] < first[role]):
            raise TTResourceError(
                name,
                f"{role} circular buffers",
                len(ids),
                end - first[role],
                config_name,
                f"arch {arch['name']!r} has {limit} CB ids per core and {role} CBs take "
                f"c_{first[role]}..c_{end - 1}; use fewer {role} tiles",
            )
    over = [cb for cb in cbs if cb["id"] >= limit]
    if over:
        raise TTResourceError(
            name,
            "as circular-buffer id",
            max(cb["id"] for cb in over),
            limit - 1,
            config_name,
            f"CB {over[0]['name']!r} got id {over[0]['id']} but arch {arch['name']!r} has "
            f"{limit} CB ids per core; use fewer tile buffers or epilogue operands",
        )
    total = l1_bytes(cbs)
    if total > arch["l1_bytes"]:
        detail = ", ".join(f"CB {cb['id']} {cb['name']}: {cb['num_pages']} x {cb['page_size']} B" for cb in cbs)
        raise TTResourceError(
            name,
            "bytes of L1 per core for circular buffers",
            total,
            arch["l1_bytes"],
            config_name,
            f"lower tt.LowerMemorySpace's input_pages/output_pages ({detail})",
        )
