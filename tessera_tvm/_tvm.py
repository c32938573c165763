"""The one place that imports TileLang and its TVM.

TileLang 0.1.15 bundles its own TVM fork; ``import tilelang`` puts it on ``sys.path`` as ``tvm``.
A different TVM imported first (e.g. apache-tvm) cannot coexist with it in one process, so we
check before importing and say how to fix it instead of failing later with an undefined symbol.
Every other module of tessera_tvm gets ``tvm`` and ``tilelang`` from here.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile


def _check_foreign_tvm() -> None:
    loaded = sys.modules.get("tvm")
    if loaded is None:
        return
    path = os.path.abspath(getattr(loaded, "__file__", "") or "")
    if f"{os.sep}tilelang{os.sep}" in path:
        return
    raise ImportError(
        f"tessera_tvm needs the TVM that ships inside tilelang, but another TVM was imported first "
        f"({path or 'a tvm module without a file'}). One process can hold one TVM. "
        "Fix: `import tessera_tvm` (or `import tilelang`) before anything imports `tvm`, "
        "or uninstall the other TVM (`pip uninstall apache-tvm`)."
    )


_check_foreign_tvm()

import tilelang  # noqa: E402  (must come after the check and before tvm)
import tilelang.language as T  # noqa: E402  (TileLang's tile language, for the tile-program builders)
from tilelang import tvm  # noqa: E402
from tilelang.language.eager.builder import Builder  # noqa: E402

__all__ = [
    "Builder",
    "T",
    "copy_module",
    "create_backend_context",
    "enrich_error",
    "has_leaking_intermediate_variables",
    "have_pdl",
    "is_jit_kernel",
    "host_codegen",
    "jit_program",
    "load_json",
    "pass_context_with",
    "prim_func",
    "register_op",
    "tilelang",
    "tvm",
]


def _answer_target_features() -> None:
    """TVM's default TIR pipeline asks ``target.target_has_feature`` (tirx.VectorizeLoop, about a
    loop whose body is an ``if``: SVE predication) and only its LLVM backend registers it. TileLang's
    TVM has none, so building a Relax model's leftover ops with a dynamic dim for a GPU config failed
    with "Function target.target_has_feature not found". Without LLVM no target answers yes."""
    if tvm.ffi.get_global_func("target.target_has_feature", allow_missing=True) is None:
        tvm.ffi.register_global_func("target.target_has_feature", lambda feature, target: False)


_answer_target_features()

_save_json = tvm.ffi.get_global_func("node.SaveJSON")
_load_json = tvm.ffi.get_global_func("node.LoadJSON")


def load_json(text: str):
    """The TVM object saved as ``text`` by this same TVM (``tvm.ir.save_json``). ``tvm.ir.load_json``
    would first re-encode the JSON in Python to upgrade older versions, ~12 ms a module."""
    return _load_json(text)


def copy_module(mod):
    """A deep copy of ``mod`` (or any TVM object) through TVM's JSON, TileLang's layouts kept.

    A layout (``T.annotate_layout``, ``T.Parallel(loop_layout=...)``, a tile op's annotations)
    is written over TileLang's process-wide placeholder variables ``_i, _j, ..., _rep``, which its
    C++ compares by identity; a JSON copy would give it fresh ones, and layout inference would then
    misread it (an annotated layout found "not injective", placeholders left as free variables).
    Layouts are immutable and hold no variable of the program, so the copy shares the caller's.
    """
    copied = _load_json(_save_json(mod))
    layouts = _annotated_layouts(mod)
    return _share_layouts(copied, layouts) if layouts else copied


# IR nodes whose annotations TileLang's frontend fills with layouts.
_ANNOTATED = ("tirx.SBlock", "tirx.For", "tirx.Call")


def _is_layout(value) -> bool:
    from tilelang.layout import Layout

    return isinstance(value, Layout)


def _layouts_in(value, found: list) -> None:
    if _is_layout(value):
        found.append(value)
    elif isinstance(value, tvm.ffi.Map | dict):
        for item in value.values():
            _layouts_in(item, found)
    elif isinstance(value, tvm.ffi.Array | list | tuple):
        for item in value:
            _layouts_in(item, found)


def _functions(mod):
    if isinstance(mod, tvm.tirx.PrimFunc):
        return [mod]
    if isinstance(mod, tvm.IRModule):
        return [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return []


def _annotated_layouts(mod) -> dict[int, list]:
    """The layouts in ``mod``'s annotations, by structural hash (placeholders matched by position)."""
    found: list = []

    def visit(node):
        if isinstance(node, tvm.tirx.SBlock | tvm.tirx.For | tvm.tirx.Call) and node.annotations:
            _layouts_in(node.annotations, found)

    for func in _functions(mod):
        tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    by_hash: dict[int, list] = {}
    for layout in found:
        by_hash.setdefault(tvm.ir.structural_hash(layout, map_free_vars=True), []).append(layout)
    return by_hash


def _share_layouts(mod, layouts: dict[int, list]):
    """``mod`` with each annotated layout replaced by the structurally equal one of ``layouts``."""

    def original(layout):
        for candidate in layouts.get(tvm.ir.structural_hash(layout, map_free_vars=True), ()):
            if tvm.ir.structural_equal(candidate, layout, map_free_vars=True):
                return candidate
        raise AssertionError(f"copy_module: no original for layout {layout}")  # the copy is exact

    def swap(value):
        if _is_layout(value):
            return original(value)
        if isinstance(value, tvm.ffi.Map):
            return {key: swap(item) for key, item in value.items()}
        if isinstance(value, tvm.ffi.Array):
            return [swap(item) for item in value]
        return value

    def rewrite(node):
        if not node.annotations:
            return None
        found: list = []
        _layouts_in(node.annotations, found)
        if not found:
            return None
        annotations = {key: swap(value) for key, value in node.annotations.items()}
        if isinstance(node, tvm.tirx.SBlock):
            return tvm.tirx.SBlock(
                node.iter_vars,
                node.reads,
                node.writes,
                node.name_hint,
                node.body,
                node.init,
                node.alloc_buffers,
                node.match_buffers,
                annotations,
            )
        if isinstance(node, tvm.tirx.For):
            return tvm.tirx.For(
                node.loop_var,
                node.min,
                node.extent,
                node.kind,
                node.body,
                node.thread_binding,
                annotations,
                node.step,
            )
        return tvm.tirx.Call(node.dtype, node.op, node.args, annotations)

    def relink(func):
        return func.with_body(tvm.tirx.stmt_functor.ir_transform(func.body, None, rewrite, list(_ANNOTATED)))

    if isinstance(mod, tvm.tirx.PrimFunc):
        return relink(mod)
    for gv, func in list(mod.functions.items()):  # ``mod`` is this copy's own: update it in place
        if isinstance(func, tvm.tirx.PrimFunc):
            mod.update_func(gv, relink(func))
    return mod


# the rewritten body of each tile-program function, by its code object (see prim_func)
_rewritten: dict = {}


def prim_func(func):
    """TileLang's eager ``@T.prim_func`` for a function without parameters, rewritten once per code.

    ``T.prim_func`` reads, rewrites and recompiles the function's source on every call, ~80% of the
    time a tile program takes to build. The rewrite depends only on the code: TileLang binds the
    closure's values when it builds. So the generators, which define the same nested ``main`` for
    every schedule, keep the first rewrite and rebind its closure to this call's values.
    """
    import types

    from tilelang.language.eager import ast as eager_ast
    from tilelang.language.eager import builder as eager_builder

    if func.__code__.co_argcount or func.__code__.co_kwonlyargcount:
        raise TypeError(f"tessera_tvm._tvm.prim_func builds functions without parameters, not {func.__name__}")
    body = _rewritten.get(func.__code__)
    if body is None:
        body = _rewritten[func.__code__] = eager_ast.mutate(func).gen
    cells = dict(zip(func.__code__.co_freevars, func.__closure__ or (), strict=True))
    closure = tuple(cells[name] for name in body.__code__.co_freevars)  # this call's own cells
    gen = types.FunctionType(body.__code__, body.__globals__, body.__name__, body.__defaults__, closure)
    builder = eager_builder.Builder()
    with builder.prim_func(func.__name__):
        gen(builder)()
    program = eager_builder._patch_prim_func_attrs(builder.get(), builder)
    program.orig_func = func
    return program


def named(buffer, name: str):
    """``buffer`` renamed to ``name`` (TileLang names a buffer after the variable it is assigned to;
    buffers made in a loop or a list need a name of their own)."""
    from tvm.script.ir_builder import IRBuilder

    IRBuilder.name(name, buffer)
    return buffer


def pointer_buffer(address, shape, dtype: str):
    """A 1-D or n-D buffer over the memory ``address`` points to (a handle expression: an extern call
    that returns a pointer), inside a tile program: the address bound to a typed pointer and the
    buffer declared (``DeclBuffer``). ``T.make_tensor_from_addr`` leaves the declaration out, which
    ``tirx.StorageRewrite`` and the well-formedness check reject."""
    from tvm.tirx.script.builder import bind, decl_buffer

    pointer = bind(address, type_annotation=tvm.ir.PointerType(tvm.ir.PrimType(dtype), "global"))
    return decl_buffer(shape, dtype, data=pointer)


def is_jit_kernel(obj) -> bool:
    """Whether ``obj`` is what ``@tilelang.jit`` returned, or a kernel it compiled."""
    from tilelang.jit import JITImpl
    from tilelang.jit.kernel import JITKernel

    return isinstance(obj, JITImpl | JITKernel)


def jit_program(kernel, args: tuple = (), kwargs: dict | None = None):
    """``(PrimFunc, pass_configs)`` of a ``@tilelang.jit`` kernel, or None for anything else.

    ``kernel`` is what ``@tilelang.jit(...)`` returned (its program is built with ``args`` and
    ``kwargs``, as calling it would) or a kernel it compiled (``matmul(1024, ...)``). The pass
    configs are TileLang's, with the same keys (``tl.disable_tma_lower``...) as ``PassContext``'s.
    """
    from tilelang.jit import JITImpl
    from tilelang.jit.kernel import JITKernel
    from tilelang.transform.pass_config import normalize_pass_configs

    if isinstance(kernel, JITKernel):
        return kernel.prim_func, dict(kernel.pass_configs or {})
    if isinstance(kernel, JITImpl):
        func = kernel.get_tir(*args, **(kwargs or {}))
        # As tilelang.compile: the program's own pass configs, overridden by the decorator's.
        own = dict(func.attrs["tilelang_pass_configs"]) if func.attrs and "tilelang_pass_configs" in func.attrs else {}
        return func, normalize_pass_configs({**own, **(kernel.pass_configs or {})})
    return None


def pass_context_with(config: dict):
    """The current ``PassContext`` with ``config`` added to its config (``config`` wins), its
    opt_level, disabled and required passes and instruments kept."""
    current = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(
        opt_level=current.opt_level,
        required_pass=list(current.required_pass),
        disabled_pass=list(current.disabled_pass),
        instruments=list(current.instruments),
        config={**{str(k): v for k, v in current.config.items()}, **config},
    )


def register_op(name: str, doc: str, **attrs) -> None:
    """Register a TIR op ``name`` with TVM and set its attrs (``TGlobalSymbol=...``)."""
    tvm.ir._ffi_api.RegisterOp(name, doc)  # no public name in this TVM
    for key, value in attrs.items():
        tvm.ir.register_op_attr(name, key, value)


# TileLang and TVM helpers the rest of tessera_tvm calls, imported when first used.


def have_pdl(target) -> bool:
    """Whether ``target`` supports programmatic dependent launch (TileLang's answer)."""
    from tilelang.contrib.nvcc import have_pdl as tilelang_have_pdl

    return bool(tilelang_have_pdl(target))


def enrich_error(exc: BaseException) -> None:
    """Add TileLang's source location to a TVM error raised while lowering a tile program."""
    from tilelang.errors import enrich_error as tilelang_enrich_error

    tilelang_enrich_error(exc)


def create_backend_context(*args, **kwargs):
    """TileLang's backend context for a target (what its host codegen and device build read)."""
    from tilelang.backend.module import create_backend_context as tilelang_create_backend_context

    return tilelang_create_backend_context(*args, **kwargs)


def host_codegen(host_mod, context):
    """TileLang's host code generation: the packed host functions of a lowered module."""
    from tilelang.engine.lower import host_codegen as tilelang_host_codegen

    return tilelang_host_codegen(host_mod, context)


def has_leaking_intermediate_variables(context) -> bool:
    """Relax's check that a fused pattern's intermediate values are not used outside it."""
    from tvm.relax.backend.utils import has_leaking_intermediate_variables as relax_check

    return relax_check(context)


def tilelang_target(target: dict, host: str | None = None):
    """The TVM ``Target`` for the dict ``target`` (with the host target ``host``, e.g. ``"c"``) as
    ``tilelang.lower`` normalises it. For ROCm that adds the wavefront size (``thread_warp_size`` 64
    on gfx9, 32 on RDNA) and the mtriple: without it ``tl.LowerThreadAllreduce`` assumes a warp of
    one thread and never reduces within a wavefront. Other kinds are built as given.

    Targets are immutable: one is built per (target, host) and process. Building a ROCm target
    without a ROCm runtime makes TVM print "Unable to detect ROCm version, assuming >= 3.5" on
    stderr, which said nothing to a user (the demo printed it 215 times): it is held back."""
    import json

    return _target(json.dumps(target, sort_keys=True), host)


@functools.lru_cache(maxsize=64)
def _target(target_json: str, host: str | None):
    import json

    target = json.loads(target_json)
    with _without_rocm_version_warning(target.get("kind") == "hip"):
        if target.get("kind") == "hip":
            from tilelang.backend.target import determine_target

            target = dict(determine_target(target, return_object=True).export())
        return (
            tvm.target.Target(target, host=tvm.target.Target(host)) if host is not None else tvm.target.Target(target)
        )


_ROCM_VERSION_WARNING = b"Unable to detect ROCm version, assuming >= 3.5"


@contextlib.contextmanager
def _without_rocm_version_warning(active: bool):
    """While active, what TVM's C++ code writes to stderr (file descriptor 2) is caught and written
    back without the lines of the ROCm version warning."""
    if not active:
        yield
        return
    sys.stderr.flush()
    with tempfile.TemporaryFile() as caught:
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().splitlines(keepends=True) if _ROCM_VERSION_WARNING not in line]
            if kept:
                os.write(2, b"".join(kept))


def tvm_ffi_paths() -> tuple[str, str, str]:
    """(include dir, DLPack include dir, library dir) of the tvm-ffi that TileLang's TVM runs on: what a
    library exporting ``__tvm_ffi_<name>`` entries compiles and links against."""

    root = os.path.dirname(os.path.abspath(tvm_ffi.__file__))
    return (
        os.path.join(root, "include"),
        os.path.join(root, "3rdparty", "dlpack", "include"),
        os.path.join(root, "lib"),
    )


import tvm_ffi  # noqa: E402,F401  (the FFI TileLang's TVM runs on: loading tvm-ffi libraries)
