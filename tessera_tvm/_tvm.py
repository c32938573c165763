"""The one place that imports TileLang and its TVM.

TileLang 0.1.15 bundles its own TVM fork; ``import tilelang`` puts it on ``sys.path`` as ``tvm``.
A different TVM imported first (e.g. apache-tvm) cannot coexist with it in one process, so we
check before importing and say how to fix it instead of failing later with an undefined symbol.
Every other module of tessera_tvm gets ``tvm`` and ``tilelang`` from here.
"""

from __future__ import annotations

import os
import sys


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
from tilelang import tvm  # noqa: E402

__all__ = ["copy_module", "load_json", "prim_func", "tilelang", "tvm"]

_save_json = tvm.ffi.get_global_func("node.SaveJSON")
_load_json = tvm.ffi.get_global_func("node.LoadJSON")


def load_json(text: str):
    """The TVM object saved as ``text`` by this same TVM (``tvm.ir.save_json``). ``tvm.ir.load_json``
    would first re-encode the JSON in Python to upgrade older versions, ~12 ms a module."""
    return _load_json(text)


def copy_module(mod):
    """A deep copy of ``mod`` (or any TVM object), through TVM's JSON."""
    return _load_json(_save_json(mod))


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
