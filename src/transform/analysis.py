"""Read-only analyses of lowered modules, shared by Tessera's passes (nothing here changes the IR).

``tessera.AnnotateKernelMetadata`` reports and ``tessera.VerifyResources`` checks the same numbers,
so both get them from here: which functions are device kernels, how they are launched, and how
much shared and local memory they allocate.

Every count is an ``Extent``: an ``int`` when it is constant, else the simplified expression over
the program's symbolic dims as text in TVMScript's syntax (``(N + 127) // 128``), which
``resolve_extent`` evaluates once the dims are known (at call time, from the arguments' shapes).

What is counted (all sizes in bytes):

- shared memory of a GPU kernel = dynamic + static. Dynamic is the ``dyn_shared_memory_buf`` attr
  that ``tl.MergeSharedMemoryAllocations`` sets (the byte count passed at launch), or, before that
  pass, the sum of the ``shared.dyn`` allocations. Static is every other ``shared*`` allocation
  (``shared``, and on CUDA the mbarrier words in ``shared.barrier`` / ``shared.cluster_barrier``),
  which the CUDA/HIP codegen declares as ``__shared__`` arrays. TileLang's HIP codegen declares the
  barrier words as plain local arrays (``uint64_t bar[1];``), so on HIP they take no LDS and are
  not counted. ``shared.tmem`` (Blackwell tensor memory) is not shared memory and is not counted.
- local memory of a CPU kernel (target ``c``) = every on-chip allocation, whatever its scope: the C
  codegen declares ``local``, ``shared`` and ``shared.dyn`` buffers alike as arrays on the stack,
  so such a kernel has no shared memory. GPU kernels report 0: their ``local`` arrays are registers
  (ptxas decides what spills; see ``tessera.VerifyResources.check_registers``).
"""

from __future__ import annotations

import ast
import operator

from tessera_tvm._tvm import tvm
from tessera_tvm.errors import TesseraError
from tessera_tvm.target.backend import backends_of_tvm_kind, tvm_kinds
from tessera_tvm.target.codegen import kernel_name  # noqa: F401  (the passes' name for it)

_DEVICE_KERNEL_LAUNCH = 2  # tvm.ir.CallingConv.DEVICE_KERNEL_LAUNCH: a __global__ kernel
_C_PACKED_FUNC = 1  # tvm.ir.CallingConv.C_PACKED_FUNC: the host entry point
_THREAD_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
_BLOCK_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
#: The annotation tessera.MarkParallelGrid puts on the grid loops of a CPU kernel (outermost first).
PARALLEL_GRID = "tessera.parallel_grid"
_NOT_SHARED_MEMORY = ("shared.dyn", "shared.tmem")
BARRIER_SCOPES = ("shared.barrier", "shared.cluster_barrier")

Extent = int | str  # a constant, or a symbolic expression as text (see the module docstring)
Dim3 = tuple[Extent, Extent, Extent]


def extent(value) -> Extent:
    """``value`` (an int or a PrimExpr) as an int when constant, else its simplified expression."""
    if isinstance(value, int):
        return value
    value = tvm.arith.Analyzer().simplify(value)
    return int(value) if isinstance(value, tvm.tirx.IntImm) else str(value)


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CALLS = {"max": max, "min": min, "T.max": max, "T.min": min}


def resolve_extent(value: Extent, dims: dict[str, int]) -> int:
    """An ``Extent`` as an int, with ``dims`` giving the value of each symbolic dim it names."""
    if isinstance(value, int):
        return value

    def evaluate(node) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in dims:
                raise TesseraError(f"extent {value!r} needs the symbolic dim {node.id!r}; known: {sorted(dims)}")
            return int(dims[node.id])
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](evaluate(node.left), evaluate(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -evaluate(node.operand)
        if isinstance(node, ast.Call) and ast.unparse(node.func) in _CALLS and node.args:
            return _CALLS[ast.unparse(node.func)](evaluate(a) for a in node.args)
        raise TesseraError(
            f"cannot evaluate the extent {value!r}: {ast.unparse(node)!r} is not +, -, *, //, %, min, max"
        )

    try:
        tree = ast.parse(value, mode="eval")
    except SyntaxError:
        raise TesseraError(f"cannot evaluate the extent {value!r}: not an expression") from None
    return evaluate(tree.body)


def op_name(node) -> str | None:
    """The name of the op ``node`` calls (``tl.tileop.gemm``, ``tirx.call_extern``...), None if not a call of an op."""
    if isinstance(node, tvm.tirx.Call) and isinstance(node.op, tvm.ir.Op):
        return str(node.op.name)
    return None


def rewrite_nodes(func, replace, types):
    """``func`` with each node of ``types`` (``"tirx.For"``...) replaced by ``replace(node)`` where that
    gives a node (post-order: children first); ``func`` itself, the same object, when none is."""
    changed: list = []

    def post(node):
        out = replace(node)
        if out is not None:
            changed.append(node)
        return out

    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, post, list(types))
    return func.with_body(body) if changed else func


def uses(stmt, predicate) -> bool:
    """Whether any node of ``stmt`` satisfies ``predicate``."""
    found = []
    tvm.tirx.stmt_functor.post_order_visit(stmt, lambda n: found.append(n) if not found and predicate(n) else None)
    return bool(found)


def tvm_kind(func) -> str | None:
    """The kind of the target bound to ``func`` (``cuda``, ``hip``, ``c``), or None before BindTarget."""
    target = func.attrs.get("target") if func.attrs else None
    return str(target.kind.name) if target is not None else None


def is_cpu_kernel(func) -> bool:
    """Bound to a TVM kind whose backends run serial C blocks (``c``: the CPU, Tenstorrent)."""
    return tvm_kind(func) in tvm_kinds(thread_blocks=False)


def is_device_kernel(func) -> bool:
    """TileLang's rule (engine/lower.py): a kernel launch, or on target ``c`` anything not packed."""
    if not isinstance(func, tvm.tirx.PrimFunc) or not func.attrs:
        return False
    calling_conv = int(func.attrs.get("calling_conv", 0))
    return calling_conv == _DEVICE_KERNEL_LAUNCH or (is_cpu_kernel(func) and calling_conv != _C_PACKED_FUNC)


def device_kernels(mod) -> list[tuple[object, object]]:
    """The ``(GlobalVar, PrimFunc)`` device kernels of a module split by ``tl.SplitHostDevice``."""
    found = [(gv, func) for gv, func in mod.functions.items() if is_device_kernel(func)]
    return sorted(found, key=lambda item: str(item[0].name_hint))


def _launch_thread_extents(func) -> dict[str, object]:
    """Extents of the ``launch_thread`` attrs in the body (a kernel without the func attr yet)."""
    extents: dict[str, object] = {}

    def visit(node):
        if isinstance(node, tvm.tirx.AttrStmt) and node.attr_key == "thread_extent":
            extents[str(node.node.thread_tag)] = node.value

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return extents


def _launch_exprs(func) -> tuple[tuple, tuple]:
    """``(grid, block)`` as ints and PrimExprs; see :func:`kernel_launch`."""
    extents = func.attrs.get("thread_extent") if func.attrs else None
    extents = {str(k): v for k, v in extents.items()} if extents else _launch_thread_extents(func)
    grid = tuple(extents.get(tag, 1) for tag in _BLOCK_TAGS)
    block = tuple(extents.get(tag, 1) for tag in _THREAD_TAGS)
    if not extents:
        grid = (*_parallel_grid_extents(func), 1, 1, 1)[:3]
    return grid, block


def kernel_launch(func) -> tuple[Dim3, Dim3]:
    """``(grid, block)`` from the ``thread_extent`` attr (else the body's ``launch_thread``s).

    A CPU kernel has no thread extents: its grid is the loops tessera.MarkParallelGrid marked (the
    blocks its threads share), its block one thread; a kernel left serial reports ``(1,1,1)``.
    An extent over the program's symbolic dims is its expression (``Extent``).
    """
    grid, block = _launch_exprs(func)
    return tuple(extent(e) for e in grid), tuple(extent(e) for e in block)  # type: ignore[return-value]


def _parallel_grid_extents(func) -> list:
    """Extents of the loops marked ``tessera.parallel_grid``, outermost (TileLang's blockIdx.x) first."""
    extents: list = []

    def visit(node):
        if isinstance(node, tvm.tirx.For) and PARALLEL_GRID in node.annotations:
            extents.append(node.extent)

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)  # post order: innermost loop first
    return extents[::-1]


def threads_per_block(func) -> Extent:
    _, (x, y, z) = _launch_exprs(func)
    return extent(x * y * z)


def allocations(func) -> list:
    """Every buffer the kernel allocates: ``AllocBuffer`` statements and ``SBlock`` alloc_buffers."""
    found: list = []

    def visit(node):
        if isinstance(node, tvm.tirx.AllocBuffer):
            found.append(node.buffer)
        elif isinstance(node, tvm.tirx.SBlock):
            found.extend(node.alloc_buffers)

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return found


def _bytes(buffer):
    elements = 1
    for dim in buffer.shape:
        elements = elements * (int(dim) if isinstance(dim, tvm.tirx.IntImm) else dim)
    dtype = tvm.DataType(str(buffer.dtype))
    return elements * ((dtype.bits * dtype.lanes + 7) // 8)


def buffer_bytes(buffer) -> Extent:
    """Bytes of a buffer (an expression when a dimension is symbolic)."""
    return extent(_bytes(buffer))


def _dynamic_shared(func):
    merged = func.attrs.get("dyn_shared_memory_buf") if func.attrs else None
    if merged is not None:
        return merged
    return sum((_bytes(b) for b in allocations(func) if b.scope() == "shared.dyn"), 0)


def dynamic_shared_memory_bytes(func) -> Extent:
    """The dynamic shared memory a launch must request (0 on CPU, where it is a stack array)."""
    return 0 if is_cpu_kernel(func) else extent(_dynamic_shared(func))


def shared_memory_bytes(func) -> Extent:
    """Shared memory one thread block uses: dynamic + static (see the module docstring)."""
    if is_cpu_kernel(func):
        return 0
    apart = any(b.barriers_apart for b in backends_of_tvm_kind(tvm_kind(func) or ""))
    not_shared = _NOT_SHARED_MEMORY + (BARRIER_SCOPES if apart else ())
    static = sum(
        (_bytes(b) for b in allocations(func) if b.scope().startswith("shared") and b.scope() not in not_shared),
        0,
    )
    return extent(_dynamic_shared(func) + static)


def local_memory_bytes(func) -> Extent:
    """Bytes of stack arrays of a CPU kernel (0 for GPU kernels; see the module docstring)."""
    if not is_cpu_kernel(func):
        return 0
    return extent(sum((_bytes(b) for b in allocations(func) if b.scope() != "global"), 0))


def _called_kernels(func) -> set[str]:
    """Names a host function launches: packed calls by symbol (GPU), direct calls (CPU)."""
    names: set[str] = set()

    def visit(node):
        if isinstance(node, tvm.tirx.Call):
            if isinstance(node.op, tvm.ir.GlobalVar):
                names.add(str(node.op.name_hint))
            names.update(str(arg.value) for arg in node.args if isinstance(arg, tvm.tirx.StringImm))

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return names


def launching_function(mod, kernel_gv) -> tuple[object, object] | None:
    """The host ``(GlobalVar, PrimFunc)`` that launches a kernel: by its call, else by the name
    ``<host>_kernel`` (``tl.SplitHostDevice`` names kernels after the function they come from)."""
    kernel = mod[kernel_gv]
    names = {str(kernel_gv.name_hint), kernel_name(kernel_gv, kernel)}
    hosts = [
        (gv, func)
        for gv, func in mod.functions.items()
        if isinstance(func, tvm.tirx.PrimFunc) and not is_device_kernel(func)
    ]
    for gv, func in hosts:
        if names & _called_kernels(func):
            return gv, func
    for gv, func in sorted(hosts, key=lambda item: -len(str(item[0].name_hint))):
        if str(kernel_gv.name_hint).startswith(f"{gv.name_hint}_kernel"):
            return gv, func
    return None
