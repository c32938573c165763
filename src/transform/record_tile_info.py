"""tessera.RecordTileInfo: note what a tile program computes before lowering rewrites it.

Runs first in LowerAndLegalize, on the TileLang tile program, while ``T.gemm``, ``T.Pipelined`` and
``T.Kernel(threads=...)`` are still visible. It records on each PrimFunc the attribute

    tessera.tile_info = {"tile": {"M", "N", "K"}, "stages", "dtype_in", "dtype_acc", "threads", "epilogue", "buffers"}

which survives the host/device split on the host function, where ``tessera.AnnotateKernelMetadata``
reads it. A field the program does not have is left out (a kernel without ``T.gemm`` has no tile).

- tile: M and N from the accumulator operand, K from A (the second-to-last axis when A is
  transposed), taken from the first dense gemm (``T.gemm``, ``T.wgmma_gemm``, ...) in the program.
- stages: ``num_stages`` of the ``T.Pipelined`` loop around that gemm (without a gemm, of the first
  pipelined loop); a plain ``T.serial`` K loop records none.
- dtype_in / dtype_acc: dtypes of A (``"a,b"`` when A and B differ) and of the accumulator.
- threads: threads per block the program asks for in ``T.Kernel``.
- epilogue: the func attr ``tessera.epilogue`` when the frontend set one; otherwise what the
  element-wise loops after the gemm's K loop do to the accumulator (and to buffers computed from
  it), in program order, each kind once:
    bias  ``acc + g[..., j]`` with ``g`` a global buffer indexed by the column ``j`` but not the row
    gelu  a call to erf or tanh
    relu  ``max(x, 0)``
    cast  an explicit cast to a narrower float type
  Storing a wider accumulator into a narrower output with ``T.copy`` is not an epilogue.
- buffers: every on-chip buffer the program allocates, as ``"<scope> <name> <shape> <dtype> (<bytes> B)"``
  (what ``tessera.VerifyResources`` names when a kernel needs more memory than the target has).
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, register_pass, tessera_module_pass

from .analysis import op_name

ATTR = "tessera.tile_info"
EPILOGUE_ATTR = "tessera.epilogue"

# Gemm tile ops whose first slots are (A, B, C, transpose_A, transpose_B, M, N, K, ...).
_DENSE_GEMMS = (
    "tl.tileop.gemm",
    "tl.tileop.wgmma_gemm",
    "tl.tileop.tcgen05_gemm",
    "tl.tileop.gemm_blockscaled",
    "tl.tileop.tcgen05_gemm_blockscaled",
)
_GELU_CALLS = ("tirx.erf", "tirx.tanh")


def _walk(node, visit) -> None:
    """Post-order visit of a statement or expression."""
    if isinstance(node, tvm.tirx.PrimExpr):
        tvm.tirx.stmt_functor.post_order_visit(tvm.tirx.Evaluate(node), visit)
    else:
        tvm.tirx.stmt_functor.post_order_visit(node, visit)


def _find(node, predicate) -> list:
    found: list = []
    _walk(node, lambda n: found.append(n) if predicate(n) else None)
    return found


def _is_gemm(node) -> bool:
    return op_name(node) in _DENSE_GEMMS


# ---------------------------------------------------------------------------------------------
# The tile program's compute loops, in program order
# ---------------------------------------------------------------------------------------------


def _compute_units(body) -> list:
    """In program order: the outermost loops that are not thread/block bindings, and the gemm calls
    outside any such loop (a gemm whose K fits one tile needs no loop)."""
    units: list = []

    def visit(node):
        if isinstance(node, tvm.tirx.For) and node.kind != tvm.tirx.ForKind.THREAD_BINDING:
            units.append(node)
            return False  # nested loops belong to this nest
        if isinstance(node, tvm.tirx.Evaluate) and _is_gemm(node.value):
            units.append(node)
            return False
        return True

    tvm.tirx.stmt_functor.pre_order_visit(body, visit)
    return units


def _stages(unit) -> int | None:
    if not isinstance(unit, tvm.tirx.For):
        return None
    for node in [unit, *_find(unit.body, lambda n: isinstance(n, tvm.tirx.For))]:
        if node.annotations and "num_stages" in node.annotations:
            return int(node.annotations["num_stages"])
    return None


def _threads(body) -> int | None:
    """Threads per block from ``T.Kernel(threads=...)`` (or thread_extent attrs once materialised)."""
    for block in _find(body, lambda n: isinstance(n, tvm.tirx.SBlock)):
        if block.annotations and "tl.launch_threads" in block.annotations:
            total = 1
            for extent in block.annotations["tl.launch_threads"]:
                total *= int(extent)
            return total
    extents = {}
    for attr in _find(body, lambda n: isinstance(n, tvm.tirx.AttrStmt) and n.attr_key == "thread_extent"):
        tag = str(attr.node.thread_tag)
        if tag.startswith("threadIdx") and isinstance(attr.value, tvm.tirx.IntImm):
            extents[tag] = int(attr.value)
    if not extents:
        return None
    total = 1
    for extent in extents.values():
        total *= extent
    return total


# ---------------------------------------------------------------------------------------------
# The gemm
# ---------------------------------------------------------------------------------------------


def _region(arg):
    """(buffer, extents) of a ``tl.region(BufferLoad, access, *extents)`` operand, else None."""
    if op_name(arg) == "tl.region" and isinstance(arg.args[0], tvm.tirx.BufferLoad):
        return arg.args[0].buffer, list(arg.args[2:])
    return None


def _int(expr) -> int | None:
    return int(expr) if isinstance(expr, tvm.tirx.IntImm) else None


def _gemm_info(gemm) -> tuple[dict, object | None]:
    """The tile shape and dtypes of one gemm call, and its accumulator buffer."""
    a, b, c = (_region(arg) for arg in gemm.args[:3])
    trans_a = bool(_int(gemm.args[3]))
    slot_m, slot_n, slot_k = (_int(arg) for arg in gemm.args[5:8])
    info: dict = {}
    if a is not None and c is not None and len(a[1]) >= 2 and len(c[1]) >= 2:
        tile = {"M": _int(c[1][-2]), "N": _int(c[1][-1]), "K": _int(a[1][-2] if trans_a else a[1][-1])}
    else:  # operands not given as regions: the op's own M, N, K slots
        tile = {"M": slot_m, "N": slot_n, "K": slot_k}
    info["tile"] = {k: v for k, v in tile.items() if v is not None}
    if a is not None and b is not None:
        dtype_a, dtype_b = str(a[0].dtype), str(b[0].dtype)
        info["dtype_in"] = dtype_a if dtype_a == dtype_b else f"{dtype_a},{dtype_b}"
    if c is not None:
        info["dtype_acc"] = str(c[0].dtype)
    return info, (c[0] if c is not None else None)


# ---------------------------------------------------------------------------------------------
# The epilogue
# ---------------------------------------------------------------------------------------------


def _strip_casts(expr):
    while isinstance(expr, tvm.tirx.Cast):
        expr = expr.value
    return expr


def _uses_var(expr, var) -> bool:
    return bool(_find(expr, lambda n: isinstance(n, tvm.tirx.Var) and n.same_as(var)))


def _is_column_bias(expr, row_vars, column_var) -> bool:
    load = _strip_casts(expr)
    if not isinstance(load, tvm.tirx.BufferLoad) or load.buffer.scope() != "global":
        return False
    index = load.indices[-1]
    return _uses_var(index, column_var) and not any(_uses_var(i, v) for i in load.indices for v in row_vars)


def _is_zero(expr) -> bool:
    expr = _strip_casts(expr)
    return isinstance(expr, tvm.tirx.IntImm | tvm.tirx.FloatImm) and float(expr.value) == 0.0


def _is_narrowing_cast(node) -> bool:
    if not isinstance(node, tvm.tirx.Cast):
        return False
    to, source = str(node.dtype), str(node.value.dtype)
    floats = ("float", "bfloat")
    return to.startswith(floats) and source.startswith(floats) and _bits(to) < _bits(source)


def _bits(dtype: str) -> int:
    return tvm.DataType(dtype).bits


def _loop_epilogue(nest) -> list[str]:
    """The epilogue kinds of one element-wise loop nest, in evaluation order."""
    inner = _find(nest.body, lambda n: isinstance(n, tvm.tirx.For))
    loop_vars = [nest.loop_var, *(loop.loop_var for loop in inner)]
    column, rows = loop_vars[-1], loop_vars[:-1]
    kinds: list[str] = []

    def visit(node):
        if isinstance(node, tvm.tirx.Add) and (
            _is_column_bias(node.a, rows, column) or _is_column_bias(node.b, rows, column)
        ):
            kinds.append("bias")
        elif op_name(node) in _GELU_CALLS:
            kinds.append("gelu")
        elif isinstance(node, tvm.tirx.Max) and (_is_zero(node.a) or _is_zero(node.b)):
            kinds.append("relu")
        elif _is_narrowing_cast(node):
            kinds.append("cast")

    for store in _find(nest, lambda n: isinstance(n, tvm.tirx.BufferStore)):
        _walk(store.value, visit)
    return kinds


def _epilogue(units, gemm_index: int, accumulator) -> list[str]:
    """Kinds of the loops after the K loop that read the accumulator or a buffer computed from it."""
    derived = {accumulator}
    kinds: list[str] = []
    for nest in units[gemm_index + 1 :]:
        if not isinstance(nest, tvm.tirx.For):
            continue
        loads = _find(nest, lambda n: isinstance(n, tvm.tirx.BufferLoad))
        if not any(load.buffer in derived for load in loads):
            continue
        for store in _find(nest, lambda n: isinstance(n, tvm.tirx.BufferStore)):
            if store.buffer.scope() != "global":
                derived.add(store.buffer)
        kinds.extend(kind for kind in _loop_epilogue(nest) if kind not in kinds)
    return kinds


# ---------------------------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------------------------


def _on_chip_buffers(func) -> list[str]:
    """``"<scope> <name> <shape> <dtype> (<bytes> B)"`` for each buffer the program allocates."""
    from .analysis import allocations, buffer_bytes

    found = []
    for buf in allocations(func):
        if buf.scope() != "global":
            shape = "x".join(str(d) for d in buf.shape)
            found.append(f"{buf.scope()} {buf.name} {shape} {buf.dtype} ({buffer_bytes(buf)} B)")
    return found


def tile_info(func) -> dict:
    """What ``tessera.tile_info`` records for one tile program (plain Python values)."""
    info: dict = {}
    units = _compute_units(func.body)
    gemm_unit = next((i for i, unit in enumerate(units) if _find(unit, _is_gemm)), None)
    accumulator = None
    if gemm_unit is not None:
        gemm_info, accumulator = _gemm_info(_find(units[gemm_unit], _is_gemm)[0])
        info.update(gemm_info)
        stages = _stages(units[gemm_unit])
    else:
        stages = next((s for s in map(_stages, units) if s is not None), None)
    if stages is not None:
        info["stages"] = stages
    threads = _threads(func.body)
    if threads is not None:
        info["threads"] = threads
    if func.attrs and EPILOGUE_ATTR in func.attrs:
        info["epilogue"] = [str(kind) for kind in func.attrs[EPILOGUE_ATTR]]
    elif accumulator is not None:
        info["epilogue"] = _epilogue(units, gemm_unit, accumulator)
    else:
        info["epilogue"] = []
    buffers = _on_chip_buffers(func)
    if buffers:
        info["buffers"] = buffers
    order = ("tile", "stages", "dtype_in", "dtype_acc", "threads", "epilogue", "buffers")
    return {key: info[key] for key in order if key in info}


@register_pass(
    "tessera.RecordTileInfo", doc="record tile shape, stages, dtypes, threads and epilogue of each tile program"
)
def record_tile_info(ctx: BuildContext):
    def record(mod, _pass_ctx):
        out = mod.clone()  # the caller's module must not change under it
        for gv, func in mod.functions.items():
            if isinstance(func, tvm.tirx.PrimFunc):
                out[gv] = func.with_attr(ATTR, tile_info(func))
        return out

    return tessera_module_pass(record, name="tessera.RecordTileInfo")
