"""tessera.UniqueSharedBufferNames: shared allocations that share a name get distinct names.

``tvm.ir.assert_structural_equal`` ignores names, so each test also compares the names of the
shared allocations (data var and buffer) in order of appearance.
"""

from __future__ import annotations

from tvm.script import tirx as T

from tessera_tvm._tvm import tvm
from tessera_tvm.config import load_config
from tessera_tvm.registry import BuildContext, get_pass
from tessera_tvm.transform.unique_shared_buffer_names import unique_shared_buffer_names


def run_pass(func):
    cfg = load_config("rocm")
    run = get_pass("tessera.UniqueSharedBufferNames").factory(BuildContext(cfg, cfg.tvm_target()))
    return run(tvm.IRModule({"main": func}))["main"]


def shared_names(func) -> list[tuple[str, str]]:
    """(data var, buffer) names of every shared allocation, in order of appearance."""
    names = []

    def visit(node):
        if isinstance(node, tvm.tirx.AllocBuffer) and node.buffer.scope().startswith("shared"):
            names.append((str(node.buffer.data.name), str(node.buffer.name)))

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return names


# Two AllReduce workspaces named alike, as tl.LowerThreadAllreduce emits them (one per reduction),
# used directly and through an access pointer. The last keeps the name, as TileLang usually orders them.
@T.prim_func(private=True)
def two_workspaces(A: T.Buffer((128,), "float32")):
    tx = T.launch_thread("threadIdx.x", 128)
    for _ in range(1):
        workspace = T.alloc_buffer((128,), scope="shared.dyn")
        workspace[tx] = A[tx]
        A[tx] = workspace[127 - tx]
    for _ in range(1):
        workspace = T.alloc_buffer((128,), scope="shared.dyn")
        workspace[tx] = A[tx]
        A[tx] = T.call_extern("float32", "f", T.tvm_access_ptr(T.type_annotation("float32"), workspace.data, 0, 128, 3))


@T.prim_func(private=True)
def two_workspaces_expected(A: T.Buffer((128,), "float32")):
    tx = T.launch_thread("threadIdx.x", 128)
    for _ in range(1):
        workspace_1 = T.alloc_buffer((128,), scope="shared.dyn")
        workspace_1[tx] = A[tx]
        A[tx] = workspace_1[127 - tx]
    for _ in range(1):
        workspace = T.alloc_buffer((128,), scope="shared.dyn")
        workspace[tx] = A[tx]
        A[tx] = T.call_extern("float32", "f", T.tvm_access_ptr(T.type_annotation("float32"), workspace.data, 0, 128, 3))


def test_the_last_workspace_keeps_the_name():
    after = run_pass(two_workspaces)
    tvm.ir.assert_structural_equal(after, two_workspaces_expected)
    assert shared_names(two_workspaces) == [("workspace", "workspace"), ("workspace", "workspace")]
    assert shared_names(after) == [("workspace_1", "workspace_1"), ("workspace", "workspace")]


# A local buffer already takes `workspace_1`, and static and dynamic shared memory share one namespace.
@T.prim_func(private=True)
def name_taken(A: T.Buffer((128,), "float32")):
    tx = T.launch_thread("threadIdx.x", 128)
    workspace_1 = T.alloc_buffer((1,), scope="local")
    for _ in range(1):
        workspace = T.alloc_buffer((128,), scope="shared")
        workspace[tx] = A[tx]
    for _ in range(1):
        workspace = T.alloc_buffer((128,), scope="shared.dyn")
        workspace[tx] = A[tx] + workspace_1[0]


@T.prim_func(private=True)
def name_taken_expected(A: T.Buffer((128,), "float32")):
    tx = T.launch_thread("threadIdx.x", 128)
    workspace_1 = T.alloc_buffer((1,), scope="local")
    for _ in range(1):
        workspace_2 = T.alloc_buffer((128,), scope="shared")
        workspace_2[tx] = A[tx]
    for _ in range(1):
        workspace = T.alloc_buffer((128,), scope="shared.dyn")
        workspace[tx] = A[tx] + workspace_1[0]


def test_new_name_avoids_names_in_use():
    after = run_pass(name_taken)
    tvm.ir.assert_structural_equal(after, name_taken_expected)
    assert shared_names(after) == [("workspace_2", "workspace_2"), ("workspace", "workspace")]


# Local buffers are not placed by tl.MergeSharedMemoryAllocations: same names stay.
@T.prim_func(private=True)
def distinct_shared_and_local_twins(A: T.Buffer((128,), "float32")):
    tx = T.launch_thread("threadIdx.x", 128)
    A_shared = T.alloc_buffer((128,), scope="shared.dyn")
    B_shared = T.alloc_buffer((128,), scope="shared.dyn")
    A_shared[tx] = A[tx]
    B_shared[tx] = A_shared[127 - tx]
    for _ in range(1):
        acc = T.alloc_buffer((1,), scope="local")
        acc[0] = B_shared[tx]
    for _ in range(1):
        acc = T.alloc_buffer((1,), scope="local")
        acc[0] = B_shared[tx]
        A[tx] = acc[0]


def test_distinct_shared_names_leave_the_function_unchanged():
    assert unique_shared_buffer_names(distinct_shared_and_local_twins).same_as(distinct_shared_and_local_twins)
    tvm.ir.assert_structural_equal(run_pass(distinct_shared_and_local_twins), distinct_shared_and_local_twins)


def test_leaves_its_input_unchanged():
    mod = tvm.IRModule({"main": two_workspaces})
    cfg = load_config("rocm")
    get_pass("tessera.UniqueSharedBufferNames").factory(BuildContext(cfg, cfg.tvm_target()))(mod)
    assert shared_names(mod["main"]) == [("workspace", "workspace"), ("workspace", "workspace")]
