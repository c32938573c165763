"""The ``pipeline:`` section of a target config: its phases, their pass entries, the shared lists.

A config's pipeline has four phases, run in this order:

    graph                Relax passes on the traced kernel, ending in one function per fused kernel
    lower_and_legalize   TIR: legalise the tile program, lower tile ops (shared by every target)
    optimize_for_target  TIR: the target's own list, up to the host/device split
    codegen_prep         TIR: the device module, just before source generation

``graph`` and ``lower_and_legalize`` default to the shared lists in ``configs/shared/``; a config may
take a prefix of one with ``{shared: true, until: <pass>}``. Each entry names a registered pass
(``tessera_tvm.registry``) of the phase's IR, with arguments and an optional condition; feature
conditions are resolved here, so ``tessera passes`` prints what will run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .config_reader import _Checker, _Lines, _read_yaml
from .errors import ConfigError, PassNotFoundError

#: The graph phase: Relax passes, run when a kernel is traced (``tessera_tvm.graph``).
GRAPH_PHASE = "graph"

#: The TIR phases, in the order ``tessera_tvm.lower`` runs them on each tile program.
PHASES = ("lower_and_legalize", "optimize_for_target", "codegen_prep")

#: Every phase of a config, in order.
ALL_PHASES = (GRAPH_PHASE, *PHASES)

#: The IR each phase's passes take (``register_pass(ir=...)``).
PHASE_IR = {GRAPH_PHASE: "relax", **{phase: "tir" for phase in PHASES}}

#: The phases with a shared list, and its file under configs/.
SHARED_LISTS = {GRAPH_PHASE: "shared/graph.yaml", "lower_and_legalize": "shared/lower_and_legalize.yaml"}

#: What ``tessera passes`` and error messages call each phase.
PHASE_TITLES = {
    GRAPH_PHASE: "Graph",
    "lower_and_legalize": "LowerAndLegalize",
    "optimize_for_target": "OptimizeForTarget",
    "codegen_prep": "CodegenPrep",
}

CONFIG_PACKAGE = "tessera_tvm.configs"


def packaged(name: str) -> tuple[str, str] | None:
    """``(text, path)`` of a file shipped under configs/, or None."""
    try:
        ref = resources.files(CONFIG_PACKAGE).joinpath(name)
    except ModuleNotFoundError:  # pragma: no cover - broken install
        return None
    if ref.is_file():
        return ref.read_text(), str(ref)
    return None


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class PipelineEntry:
    """One pass in a pipeline: its registered name, arguments and condition."""

    name: str
    args: tuple[tuple[str, Any], ...] = ()
    when: str | None = None  # "feature", "not feature" or "ir.predicate"

    @property
    def is_ir_condition(self) -> bool:
        return self.when is not None and self.when.startswith("ir.")

    def describe(self) -> str:
        text = self.name
        if self.args:
            text += "(" + ", ".join(f"{k}={_show(v)}" for k, v in self.args) + ")"
        if self.is_ir_condition:
            text += f"  [when {self.when}]"
        return text


class _Context:
    """What parsing an entry needs besides the entry: the config's pass arguments and features."""

    def __init__(self, pass_args: Mapping[str, Any], features: Mapping[str, bool], known_features: Mapping[str, Any]):
        self.pass_args = pass_args
        self.features = features
        self.known_features = known_features


def _parse_entry(item: Any, key: str, phase: str, check: _Checker, ctx: _Context) -> PipelineEntry | None:
    from .registry import get_pass, get_predicate, load_passes

    load_passes()  # the built-in passes (the driver's loader imports the modules that register them)
    if isinstance(item, str):
        name, args, when = item, {}, None
    elif isinstance(item, dict):
        check.mapping(item, key, {"pass": "registered pass name", "args": "arguments", "when": "condition"})
        if "pass" not in item:
            raise check.fail(key, "a pipeline entry given as a mapping needs `pass: <name>`")
        name = check.typed(item["pass"], f"{key}.pass", str, "a pass name (str)")
        args = check.mapping(item.get("args", {}), f"{key}.args")
        when = item.get("when")
        if when is not None:
            check.typed(when, f"{key}.when", str, "a condition (`feature`, `not feature` or `ir.predicate`)")
    else:
        raise check.fail(key, f"expected a pass name or {{pass, args, when}}, found {item!r}")
    try:
        spec = get_pass(name)
    except PassNotFoundError as exc:
        raise check.fail(key, str(exc)) from None
    if spec.ir != PHASE_IR[phase]:
        where = [p for p, ir in PHASE_IR.items() if ir == spec.ir]
        raise check.fail(
            key,
            f"pass {name} transforms {spec.ir.upper()} and cannot run in the {PHASE_TITLES[phase]} phase "
            f"({PHASE_IR[phase].upper()}); it belongs in {' or '.join(where)}",
        )
    merged = {**ctx.pass_args.get(name, {}), **args}
    for arg, value in merged.items():
        param = spec.params.get(arg)
        if param is None:
            allowed = ", ".join(sorted(spec.params)) or "none"
            raise check.fail(
                f"{key}.args.{arg}" if arg in args else f"pass_args.{name}.{arg}",
                f"pass {name} takes no argument {arg!r}; its arguments: {allowed}",
            )
        if not param.accepts(value):
            raise check.fail(
                f"{key}.args.{arg}" if arg in args else f"pass_args.{name}.{arg}",
                f"pass {name} argument {arg!r} expects {param.type_name()}, found {value!r}",
            )
    if when is not None:
        words = when.split()
        if when.startswith("ir."):
            try:
                get_predicate(when[3:])
            except PassNotFoundError as exc:
                raise check.fail(f"{key}.when", f"unknown IR predicate: {exc}") from None
        elif not (len(words) == 1 or (len(words) == 2 and words[0] == "not")) or words[-1] not in ctx.known_features:
            raise check.fail(
                f"{key}.when",
                f"unknown condition {when!r}; expected `<feature>`, `not <feature>` "
                f"or `ir.<predicate>`, with a feature among {sorted(ctx.known_features)}",
            )
    # Feature conditions are resolved here, so pass lists and golden files show what will run.
    if when is not None and not when.startswith("ir."):
        negate = when.startswith("not ")
        if ctx.features.get(when.split()[-1], False) == negate:
            return None
        when = None
    return PipelineEntry(name, tuple(sorted(merged.items())), when)


def _parse_list(value: Any, key: str, phase: str, check: _Checker, ctx: _Context) -> tuple[PipelineEntry, ...]:
    if not isinstance(value, list):
        raise check.fail(key, f"expected a list of pass names, found {type(value).__name__} {value!r}")
    entries = []
    for i, item in enumerate(value):
        entry = _parse_entry(item, f"{key}[{i}]", phase, check, ctx)
        if entry is not None:
            entries.append(entry)
    return tuple(entries)


def shared_list(phase: str) -> tuple[Any, _Lines, str]:
    """The parsed YAML of ``phase``'s shared list, its line table and its path."""
    found = packaged(SHARED_LISTS[phase])
    if found is None:  # pragma: no cover - broken install
        raise ConfigError(
            SHARED_LISTS[phase], None, f"the shared {PHASE_TITLES[phase]} list is missing from the install"
        )
    text, source = found
    data, lines = _read_yaml(text, source)
    return data, lines, source


def shared_texts() -> str:
    """The text of every shared list (a config's cache key covers them: they expand into it)."""
    return "\n".join((packaged(path) or ("",))[0] for path in SHARED_LISTS.values())


def _expand_shared(item: dict | None, key: str, phase: str, check: _Checker, ctx: _Context):
    """``phase``'s shared list for this config (its pass_args and features applied).

    ``item`` is ``None`` for ``<phase>: shared``, or an entry ``{shared: true, until: <pass>}``
    taking the list up to (not including) the first ``<pass>``.
    """
    until = None
    if item is not None:
        check.mapping(item, key, {"shared": "true: the shared list", "until": "a pass of the shared list (excluded)"})
        if item["shared"] is not True:
            raise check.fail(f"{key}.shared", f"expected true, found {item['shared']!r}")
        until = item.get("until")
        if until is not None:
            check.typed(until, f"{key}.until", str, "a pass name (str)")
    shared, shared_lines, shared_source = shared_list(phase)
    shared_check = _Checker(shared_source, shared_lines)
    # Names/conditions are checked against the shared file, arguments against this config.
    try:
        entries = _parse_list(shared.get("passes"), "passes", phase, shared_check, ctx)
    except ConfigError as exc:
        raise ConfigError(check.source, key, f"while expanding the shared list: {exc}", check.lines.get(key)) from None
    if until is None:
        return entries
    names = [entry.name for entry in entries]
    if until not in names:
        raise check.fail(
            f"{key}.until", f"{until!r} is not in the shared {PHASE_TITLES[phase]} list ({SHARED_LISTS[phase]})"
        )
    return entries[: names.index(until)]


def parse_pipeline(
    raw: Any,
    check: _Checker,
    pass_args: Mapping[str, Any],
    features: Mapping[str, bool],
    known_features: Mapping[str, Any],
) -> tuple[tuple[str, tuple[PipelineEntry, ...]], ...]:
    """The validated ``pipeline:`` section: ``((phase, entries), ...)`` for every phase in order."""
    ctx = _Context(pass_args, features, known_features)
    pipeline_raw = check.mapping(raw, "pipeline", {p: "" for p in ALL_PHASES})
    phases = []
    for phase in ALL_PHASES:
        key = f"pipeline.{phase}"
        value = pipeline_raw.get(phase, "shared" if phase in SHARED_LISTS else [])
        if phase in SHARED_LISTS and value == "shared":
            entries = _expand_shared(None, key, phase, check, ctx)
        elif phase in SHARED_LISTS and isinstance(value, list):
            entries = ()
            for i, item in enumerate(value):
                if isinstance(item, dict) and "shared" in item:
                    entries += _expand_shared(item, f"{key}[{i}]", phase, check, ctx)
                else:
                    entries += _parse_list([item], f"{key}[{i}]", phase, check, ctx)
        else:
            entries = _parse_list(value, key, phase, check, ctx)
        phases.append((phase, entries))
    if not any(entries for phase, entries in phases if phase != GRAPH_PHASE):
        raise check.fail("pipeline", "is empty; expected at least one pass")
    return tuple(phases)


def graph_phase_default() -> tuple[PipelineEntry, ...]:
    """The shared graph list as is (what a kernel traced without a target runs)."""
    check = _Checker(SHARED_LISTS[GRAPH_PHASE], _Lines())
    return _expand_shared(None, f"pipeline.{GRAPH_PHASE}", GRAPH_PHASE, check, _Context({}, {}, {}))
