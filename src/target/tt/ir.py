"""The Tenstorrent IR contract: the attributes the ``tt.*`` passes write and the code generator reads,
the readers both use, and the errors of the Tenstorrent path.

The passes (``tessera_tvm.target.tt.transform``) talk to each other and to the code generator
(:mod:`.codegen`) only through the attributes named here (``tt.*`` function attrs, ``tt.persistent``
loop annotations and ``tt.read`` / ``tt.write`` / ``tt.compute`` AttrStmts). They live in the backend,
below the passes, so that the code generator and the tile programs read them without importing the
passes (``tessera_tvm.target.tt.transform.common`` re-exports them). Their meaning, in pipeline order:

    tt.arch              ApplyTTDefaults   the arch row and resource limits the compile is checked against
    tt.compute_config    ApplyTTDefaults   math fidelity, fp32 DST accumulation, SFPU approximation
    tt.defaults          ApplyTTDefaults   schedule policy/order and DRAM layout the inference passes use
    tt.schedule          InferSchedule     output tiles per core: contiguous ranges, row-major
    tt.shard             InferShard        per DRAM buffer: interleaved tile layout, tiles, page size
    tt.persistent        GridToPersistent  the loop each core runs over its tiles (For annotation)
    tt.core_map          ShardToCoreMap    worker core (x, y) of every schedule entry
    tt.circular_buffers  LowerMemorySpace  CB id, role, pages and page size per tile buffer (+ Tensorize's spills)
    tt.padding           TilePad           logical and padded shape of buffers that are not whole tiles
    tt.read / tt.write   Tensorize         DRAM tile a statement reads into / writes from a CB (AttrStmt)
    tt.compute           Tensorize         the compute-kernel ops of a statement (AttrStmt)
    tt.compute_init      Tensorize         hardware and op inits hoisted out of the tile loop
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tessera_tvm._tvm import tvm
from tessera_tvm.errors import LoweringError, ResourceError

ARCH = "tt.arch"
COMPUTE_CONFIG = "tt.compute_config"
DEFAULTS = "tt.defaults"
SCHEDULE = "tt.schedule"
SHARD = "tt.shard"
PERSISTENT = "tt.persistent"
CORE_MAP = "tt.core_map"
CIRCULAR_BUFFERS = "tt.circular_buffers"
PADDING = "tt.padding"
READ = "tt.read"
WRITE = "tt.write"
COMPUTE = "tt.compute"
COMPUTE_INIT = "tt.compute_init"

#: Storage scope of tile buffers that ``tt.LowerMemorySpace`` placed in an L1 circular buffer.
CB_SCOPE = "tt.cb"


class TTLoweringError(LoweringError):
    """A tile program cannot be lowered for a Tenstorrent target; the message says why and where."""


class UnsupportedTTOperationError(TTLoweringError):
    """A tile operation the Tenstorrent target does not support (yet), named with its location."""


class TTVerificationError(TTLoweringError):
    """``tt.VerifyTTIR`` found an invariant the annotated IR violates (schedule, CBs, DST, ...)."""


class TTResourceError(ResourceError):
    """A Tenstorrent kernel needs more L1, circular buffers or DST than the arch allows."""


def to_python(value: Any) -> Any:
    """A TVM attr value (Map, Array, IntImm, String, ...) as plain Python; PrimExprs stay PrimExprs."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, tvm.tirx.IntImm):
        return bool(value.value) if value.dtype == "bool" else int(value.value)
    if isinstance(value, tvm.tirx.FloatImm):
        return float(value.value)
    if isinstance(value, tvm.tirx.StringImm):
        return str(value.value)
    if isinstance(value, tvm.ir.PrimExpr):
        return value
    if hasattr(value, "items"):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or hasattr(value, "__len__"):
        return [to_python(v) for v in value]
    return str(value)


def attr(func, key: str, default: Any = None) -> Any:
    """Function attr ``key`` as plain Python (``default`` when absent)."""
    if func.attrs is None or key not in func.attrs:
        return default
    return to_python(func.attrs[key])


def prim_funcs(mod) -> Iterator[tuple[Any, Any]]:
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            yield gv, func


def persistent_loop(func):
    """The ``tt.persistent`` loop ``tt.GridToPersistent`` created, or None."""
    found: list = []

    def visit(node):
        if isinstance(node, tvm.tirx.For) and node.annotations and PERSISTENT in node.annotations:
            found.append(node)

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return found[0] if found else None
