"""The pass registry: every pass a pipeline can name, resolved by a stable name.

A pipeline is data: a list of names (with arguments and conditions) in a target config. This module
maps each name to a factory that builds the TVM pass, and declares the arguments the factory takes so
that configs are validated before anything runs. TileLang's and TVM's passes are registered in
``tessera_tvm.passes``; Tessera's own passes register themselves in ``tessera_tvm.transform``.

    @register_pass("tessera.VerifyResources", params={"strict": Param(bool, True)}, doc="...")
    def _verify_resources(ctx: BuildContext, strict: bool) -> tvm.transform.Pass: ...
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import PassNotFoundError, TesseraError

if TYPE_CHECKING:  # pragma: no cover
    from .config import TargetConfig


@dataclass(frozen=True)
class Param:
    """One argument of a registered pass: its Python type(s) and default."""

    types: type | tuple[type, ...]
    default: Any = None
    doc: str = ""

    def type_name(self) -> str:
        types = self.types if isinstance(self.types, tuple) else (self.types,)
        return " or ".join(t.__name__ for t in types)

    def accepts(self, value: Any) -> bool:
        types = self.types if isinstance(self.types, tuple) else (self.types,)
        if isinstance(value, bool) and bool not in types:
            return False  # YAML `true` must not pass for an int
        return isinstance(value, types)


@dataclass(frozen=True)
class BuildContext:
    """What a pass factory may read: the resolved config and its TVM target (both None for a
    graph phase run without a target: ``kernel.graph()``)."""

    config: TargetConfig | None
    target: Any  # tvm.target.Target


PassFactory = Callable[..., Any]


@dataclass(frozen=True)
class PassSpec:
    name: str
    factory: PassFactory
    params: Mapping[str, Param] = field(default_factory=dict)
    doc: str = ""
    ir: str = "tir"  # what it transforms: "tir" (tile programs) or "relax" (the graph phase)

    @property
    def origin(self) -> str:
        return self.name.split(".", 1)[0]


Predicate = Callable[[Any], bool]


@dataclass(frozen=True)
class PredicateSpec:
    name: str
    check: Predicate
    doc: str = ""


_PASSES: dict[str, PassSpec] = {}
_PREDICATES: dict[str, PredicateSpec] = {}


def register_pass(name: str, *, params: Mapping[str, Param] | None = None, doc: str = "", ir: str = "tir"):
    """Decorator: register ``factory(ctx: BuildContext, **args) -> tvm.transform.Pass`` under ``name``.

    ``ir`` says what the pass transforms: ``"tir"`` passes run in the LowerAndLegalize,
    OptimizeForTarget and CodegenPrep phases, ``"relax"`` passes in the graph phase.
    """

    if "." not in name:
        raise ValueError(f"pass names are namespaced (e.g. 'tessera.{name}'), got {name!r}")
    if ir not in ("tir", "relax"):
        raise ValueError(f"pass {name!r}: ir is 'tir' or 'relax', got {ir!r}")

    def wrap(factory: PassFactory) -> PassFactory:
        if name in _PASSES and _PASSES[name].factory is not factory:
            raise ValueError(f"pass {name!r} is already registered")
        _PASSES[name] = PassSpec(name, factory, dict(params or {}), doc, ir)
        return factory

    return wrap


def register_predicate(name: str, *, doc: str = ""):
    """Decorator: register an IR predicate ``check(mod) -> bool`` usable as ``when: ir.<name>``."""

    def wrap(check: Predicate) -> Predicate:
        _PREDICATES[name] = PredicateSpec(name, check, doc)
        return check

    return wrap


_PASS_LOADERS: list[Callable[[], None]] = []


def add_pass_loader(load: Callable[[], None]) -> None:
    """Register ``load``, which imports the modules that register passes; :func:`load_passes` runs it.
    The driver adds its own (``tessera_tvm.pipeline.ensure_registered``): the registry sits below
    the passes and never imports them itself."""
    if load not in _PASS_LOADERS:
        _PASS_LOADERS.append(load)


def load_passes() -> None:
    """Register every pass the loaders know of (config parsing calls it before it looks names up)."""
    for load in list(_PASS_LOADERS):
        load()


def _suggest(name: str, names: list[str]) -> list[str]:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if not close:  # 'LayoutInference' should find 'tl.LayoutInference'
        short = name.split(".")[-1].lower()
        close = [n for n in names if n.split(".")[-1].lower() == short][:3]
    return close


def get_pass(name: str) -> PassSpec:
    try:
        return _PASSES[name]
    except KeyError:
        raise PassNotFoundError(name, _suggest(name, sorted(_PASSES))) from None


def get_predicate(name: str) -> PredicateSpec:
    try:
        return _PREDICATES[name]
    except KeyError:
        raise PassNotFoundError(f"ir.{name}", [f"ir.{n}" for n in _suggest(name, sorted(_PREDICATES))]) from None


def list_passes() -> list[PassSpec]:
    return [_PASSES[n] for n in sorted(_PASSES)]


def list_predicates() -> list[PredicateSpec]:
    return [_PREDICATES[n] for n in sorted(_PREDICATES)]


# ---------------------------------------------------------------------------------------------
# Python module passes that keep Tessera's error classes across TVM's FFI
# ---------------------------------------------------------------------------------------------

_pending = threading.local()


def tessera_module_pass(fn: Callable[[Any, Any], Any], *, name: str):
    """``tvm.transform.module_pass`` for Tessera's passes.

    TVM's FFI turns an exception raised inside a Python pass into a plain ``RuntimeError``; the
    original ``TesseraError`` is kept here so the pipeline (``take_pending_error``) re-raises it.
    """
    from ._tvm import tvm

    def run(mod, pass_ctx):
        try:
            return fn(mod, pass_ctx)
        except TesseraError as exc:
            _pending.error = exc
            raise

    return tvm.transform.module_pass(run, opt_level=0, name=name)


def prim_func_pass(rewrite: Callable[[Any, Any], Any], *, name: str):
    """A :func:`tessera_module_pass` applying ``rewrite(global_var, func) -> func`` to every PrimFunc.

    The caller's module is never changed: the result is a copy holding the rewritten functions."""
    from ._tvm import tvm

    def run(mod, _pass_ctx):
        out = mod.clone()
        for gv, func in mod.functions.items():
            if isinstance(func, tvm.tirx.PrimFunc):
                out[gv] = rewrite(gv, func)
        return out

    return tessera_module_pass(run, name=name)


def take_pending_error() -> BaseException | None:
    """The TesseraError a pass raised most recently in this thread (and forget it)."""
    error = getattr(_pending, "error", None)
    _pending.error = None
    return error
