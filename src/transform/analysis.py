"""Read-only analyses of lowered modules, shared by Tessera's passes (nothing here changes the IR).

``tessera.AnnotateKernelMetadata`` reports and ``tessera.VerifyResources`` checks the same numbers,
so both get them from here: which functions are device kernels, how they are launched, and how
much shared and local memory they allocate.

What is counted (all sizes in bytes, from constant shapes; a symbolic shape is not counted):

- shared memory of a GPU kernel = dynamic + static. Dynamic is the ``dyn_shared_memory_buf`` attr
  that ``tl.MergeSharedMemoryAllocations`` sets (the byte count passed at launch), or, before that
  pass, the sum of the ``shared.dyn`` allocations. Static is every other ``shared*`` allocation
  (``shared``, and the mbarrier words in ``shared.barrier`` / ``shared.cluster_barrier``), which
  the CUDA/HIP codegen declares as ``__shared__`` arrays. ``shared.tmem`` (Blackwell tensor memory)
  is not shared memory and is not counted.
- local memory of a CPU kernel (target ``c``) = every on-chip allocation, whatever its scope: the C
  codegen declares ``local``, ``shared`` and ``shared.dyn`` buffers alike as arrays on the stack,
  so such a kernel has no shared memory. GPU kernels report 0: their ``local`` arrays are registers
  (ptxas decides what spills; see ``tessera.VerifyResources.check_registers``).
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm

_DEVICE_KERNEL_LAUNCH = 2  # tvm.ir.CallingConv.DEVICE_KERNEL_LAUNCH: a __global__ kernel
_C_PACKED_FUNC = 1  # tvm.ir.CallingConv.C_PACKED_FUNC: the host entry point
_THREAD_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
_BLOCK_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
#: The annotation tessera.MarkParallelGrid puts on the grid loops of a CPU kernel (outermost first).
PARALLEL_GRID = "tessera.parallel_grid"
_NOT_SHARED_MEMORY = ("shared.dyn", "shared.tmem")

Dim3 = tuple[int, int, int]


def target_kind(func) -> str | None:
    """The kind of the target bound to ``func`` (``cuda``, ``hip``, ``c``), or None before BindTarget."""
    target = func.attrs.get("target") if func.attrs else None
    return str(target.kind.name) if target is not None else None


def is_cpu_kernel(func) -> bool:
    return target_kind(func) == "c"


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


def kernel_name(gv, func) -> str:
    """The symbol the kernel is compiled and launched under."""
    symbol = func.attrs.get("global_symbol") if func.attrs else None
    return str(symbol) if symbol is not None else str(gv.name_hint)


def _launch_thread_extents(func) -> dict[str, int]:
    """Extents of the ``launch_thread`` attrs in the body (a kernel without the func attr yet)."""
    extents: dict[str, int] = {}

    def visit(node):
        if (
            isinstance(node, tvm.tirx.AttrStmt)
            and node.attr_key == "thread_extent"
            and isinstance(node.value, tvm.tirx.IntImm)
        ):
            extents[str(node.node.thread_tag)] = int(node.value)

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return extents


def kernel_launch(func) -> tuple[Dim3, Dim3]:
    """``(grid, block)`` from the ``thread_extent`` attr (else the body's ``launch_thread``s).

    A CPU kernel has no thread extents: its grid is the loops tessera.MarkParallelGrid marked (the
    blocks its threads share), its block one thread; a kernel left serial reports ``(1,1,1)``.
    """
    extents = func.attrs.get("thread_extent") if func.attrs else None
    extents = {str(k): int(v) for k, v in extents.items()} if extents else _launch_thread_extents(func)
    grid = tuple(extents.get(tag, 1) for tag in _BLOCK_TAGS)
    block = tuple(extents.get(tag, 1) for tag in _THREAD_TAGS)
    if not extents:
        grid = (*_parallel_grid_extents(func), 1, 1, 1)[:3]
    return grid, block  # type: ignore[return-value]


def _parallel_grid_extents(func) -> list[int]:
    """Extents of the loops marked ``tessera.parallel_grid``, outermost (TileLang's blockIdx.x) first."""
    extents: list[int] = []

    def visit(node):
        if isinstance(node, tvm.tirx.For) and PARALLEL_GRID in node.annotations:
            extents.append(int(node.extent) if isinstance(node.extent, tvm.tirx.IntImm) else 1)

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)  # post order: innermost loop first
    return extents[::-1]


def threads_per_block(func) -> int:
    _, (x, y, z) = kernel_launch(func)
    return x * y * z


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


def buffer_bytes(buffer) -> int:
    """Bytes of a buffer with a constant shape (0 when a dimension is symbolic)."""
    elements = 1
    for dim in buffer.shape:
        if not isinstance(dim, tvm.tirx.IntImm):
            return 0
        elements *= int(dim)
    dtype = tvm.DataType(str(buffer.dtype))
    return elements * ((dtype.bits * dtype.lanes + 7) // 8)


def dynamic_shared_memory_bytes(func) -> int:
    """The dynamic shared memory a launch must request (0 on CPU, where it is a stack array)."""
    if is_cpu_kernel(func):
        return 0
    merged = func.attrs.get("dyn_shared_memory_buf") if func.attrs else None
    if merged is not None:
        return int(merged)
    return sum(buffer_bytes(b) for b in allocations(func) if b.scope() == "shared.dyn")


def shared_memory_bytes(func) -> int:
    """Shared memory one thread block uses: dynamic + static (see the module docstring)."""
    if is_cpu_kernel(func):
        return 0
    static = sum(
        buffer_bytes(b)
        for b in allocations(func)
        if b.scope().startswith("shared") and b.scope() not in _NOT_SHARED_MEMORY
    )
    return dynamic_shared_memory_bytes(func) + static


def local_memory_bytes(func) -> int:
    """Bytes of stack arrays of a CPU kernel (0 for GPU kernels; see the module docstring)."""
    if not is_cpu_kernel(func):
        return 0
    return sum(buffer_bytes(b) for b in allocations(func) if b.scope() != "global")


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
