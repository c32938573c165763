"""tessera.UniqueSharedBufferNames: give every shared-memory allocation of a kernel its own name.

``tl.MergeSharedMemoryAllocations`` packs shared buffers ordered by (first use, last use, name)
and binds them to offsets of the merged buffer ordered by (offset, name); codegen spells same-named
pointers ``workspace``, ``workspace_1`` in binding order. TileLang's ``tl.LowerThreadAllreduce`` calls every AllReduce workspace
``workspace``, so two workspaces of one kernel (flash attention on ROCm: the row max and the row
sum) tie, and the tie falls to the iteration order of a hash map keyed by node pointers. Which
workspace gets the lower offset and the name ``workspace`` then changes between compiles of the
same program.

This pass runs before the merge and gives same-named shared allocations distinct names, so every
tie is broken by name. The last of them keeps the name and the earlier ones, counting back, get
``<name>_1``, ``<name>_2``, ... (skipping names the kernel already uses): that is the order
TileLang's map usually iterates in (newest first), so the source stays identical to
``tilelang.lower``'s wherever TileLang's own output is stable. Only names change.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, prim_func_pass, register_pass

#: The scopes tl.MergeSharedMemoryAllocations places (static and dynamic shared memory).
SHARED_SCOPES = ("shared", "shared.dyn")


def _shared_allocations(body) -> list:
    """The buffers of the shared-memory ``AllocBuffer``s in ``body``, in order of appearance."""
    found = []

    def visit(node):
        if isinstance(node, tvm.tirx.AllocBuffer) and node.buffer.scope() in SHARED_SCOPES:
            found.append(node.buffer)

    tvm.tirx.stmt_functor.post_order_visit(body, visit)
    return found


def _names_in_use(func) -> set[str]:
    """The names of the variables and buffers of ``func`` (parameters, definitions and uses)."""
    names = {str(p.name) for p in func.params}

    def visit(node):
        if isinstance(node, tvm.tirx.Var):
            names.add(str(node.name))
        buffer = getattr(node, "buffer", None)  # AllocBuffer, DeclBuffer, BufferLoad, BufferStore
        if isinstance(buffer, tvm.tirx.Buffer):
            names.update((str(buffer.name), str(buffer.data.name)))
        for defined in (getattr(node, "loop_var", None), getattr(node, "var", None)):  # For, Bind
            if isinstance(defined, tvm.tirx.Var):
                names.add(str(defined.name))
        if isinstance(node, tvm.tirx.AttrStmt) and isinstance(node.node, tvm.tirx.IterVar):
            names.add(str(node.node.var.name))

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return names


def _renamed(buffer, name: str):
    """``buffer`` with ``name`` for itself and for a new data var of the same type."""
    data = tvm.tirx.Var(name, buffer.data.type_annotation)
    return tvm.tirx.decl_buffer(
        buffer.shape,
        buffer.dtype,
        name,
        data=data,
        strides=buffer.strides,
        elem_offset=buffer.elem_offset,
        scope=buffer.scope(),
        data_alignment=buffer.data_alignment,
        offset_factor=buffer.offset_factor,
        buffer_type="auto_broadcast" if buffer.buffer_type == 2 else "",
        axis_separators=buffer.axis_separators,
    )


def unique_shared_buffer_names(func):
    """``func`` with a distinct data-var name for every shared allocation (``func`` if already so)."""
    buffers = _shared_allocations(func.body)
    taken = _names_in_use(func)
    seen: set[str] = set()
    remap = {}
    for buffer in reversed(buffers):  # the last keeps the name (see the module docstring)
        name = str(buffer.data.name)
        if name in seen:
            k = 1
            while f"{name}_{k}" in taken:
                k += 1
            taken.add(f"{name}_{k}")
            remap[buffer] = _renamed(buffer, f"{name}_{k}")
        seen.add(name)
    if not remap:
        return func

    def post(node):
        if isinstance(node, tvm.tirx.AllocBuffer) and node.buffer in remap:
            return tvm.tirx.AllocBuffer(remap[node.buffer], node.annotations)
        if isinstance(node, tvm.tirx.BufferLoad) and node.buffer in remap:
            return tvm.tirx.BufferLoad(remap[node.buffer], node.indices, node.predicate)
        if isinstance(node, tvm.tirx.BufferStore) and node.buffer in remap:
            return tvm.tirx.BufferStore(remap[node.buffer], node.value, node.indices, node.predicate)
        return None

    body = tvm.tirx.stmt_functor.ir_transform(
        func.body, None, post, ["tirx.AllocBuffer", "tirx.BufferLoad", "tirx.BufferStore"]
    )
    # Every other use of the old data var (access pointers, aliasing decl_buffers) follows it.
    body = tvm.tirx.stmt_functor.substitute(body, {old.data: new.data for old, new in remap.items()})
    return func.with_body(body)


@register_pass(
    "tessera.UniqueSharedBufferNames",
    doc="rename shared allocations that share a name, so tl.MergeSharedMemoryAllocations places them the same way every compile",
)
def _unique_shared_buffer_names(ctx: BuildContext):
    return prim_func_pass(lambda _gv, func: unique_shared_buffer_names(func), name="tessera.UniqueSharedBufferNames")
