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

__all__ = ["copy_module", "load_json", "tilelang", "tvm"]

_save_json = tvm.ffi.get_global_func("node.SaveJSON")
_load_json = tvm.ffi.get_global_func("node.LoadJSON")


def load_json(text: str):
    """The TVM object saved as ``text`` by this same TVM (``tvm.ir.save_json``). ``tvm.ir.load_json``
    would first re-encode the JSON in Python to upgrade older versions, ~12 ms a module."""
    return _load_json(text)


def copy_module(mod):
    """A deep copy of ``mod`` (or any TVM object), through TVM's JSON."""
    return _load_json(_save_json(mod))
