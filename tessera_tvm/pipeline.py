"""Pipelines: a config's pass lists turned into TVM ``Sequential`` passes of named passes.

``Graph`` (Relax passes run when a kernel is traced, shared list in configs/shared/graph.yaml),
``LowerAndLegalize`` (one list shared by every target, in configs/shared/lower_and_legalize.yaml),
``OptimizeForTarget`` (the target's list, in its config) and ``CodegenPrep`` (run on the device
module after the host/device split) are plain lists of registered names, so they can be printed,
diffed and snapshot-tested (``tessera passes``). Each entry becomes a module pass whose TVM name is
the registered name, so ``PassContext(disabled_pass=[...], required_pass=[...], instruments=[...])``
act on exactly the names the config shows.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ._tvm import copy_module, tvm
from .config import ALL_PHASES, GRAPH_PHASE, PHASES, PipelineEntry, TargetConfig, load_config
from .config_pipeline import PHASE_TITLES as _PHASE_TITLES
from .config_pipeline import graph_phase_default
from .errors import LoweringError, TesseraError
from .pass_log import (  # noqa: F401  (PassRecord, PassRecorder, recording and report_status: their names here too)
    _RECORDER,
    _STATUS,
    PassRecord,
    PassRecorder,
    recording,
    report_status,
)
from .registry import BuildContext, add_pass_loader, get_pass, get_predicate, take_pending_error
from .trace import span

if TYPE_CHECKING:
    from .graph.passes import GraphIR

_registered = False


def ensure_registered() -> None:
    """Import the modules that register passes (built-ins, Tessera's own, then each backend's)."""
    global _registered
    if not _registered:
        _registered = True
        import importlib

        from . import (
            graph,  # noqa: F401
            passes,  # noqa: F401
            transform,  # noqa: F401
        )
        from .target.backend import backend_for, known_kinds

        for kind in known_kinds():  # a backend's own passes live in its package (src/target/<kind>/)
            if (module := backend_for(kind).passes) is not None:
                importlib.import_module(module)


add_pass_loader(ensure_registered)  # config parsing (below the passes) looks pass names up through it


def _kernel_names(mod) -> str:
    return ", ".join(sorted(str(gv.name_hint) for gv in mod.get_global_vars()))


def short_tvm_message(exc: BaseException) -> str:
    """The message of a TVM error without its C++ frame lines."""
    try:
        from ._tvm import enrich_error

        enrich_error(exc)
    except Exception:  # enrichment is best effort
        pass
    lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.lstrip().startswith(("File ", "[bt]"))]
    lines = [ln for ln in lines if not ln.startswith(("Traceback", "  [Previous line"))]
    return "\n".join(lines[-12:]) or type(exc).__name__


def in_config_terms(message: str, config: TargetConfig | None) -> str:
    """``message`` with TileLang's "target `c`" naming the config the user chose ("target
    'tenstorrent' (TVM target `c`)"): several configs share one TVM target kind."""
    if config is None:
        return message
    return re.sub(r"target `([^`]+)`", lambda m: f"target {config.name!r} (TVM target `{m.group(1)}`)", message)


def _wrap(entry: PipelineEntry, phase: str, ctx: BuildContext):
    spec = get_pass(entry.name)
    inner = spec.factory(ctx, **dict(entry.args))
    predicate = get_predicate(entry.when[3:]).check if entry.is_ir_condition else None

    def run(mod, _pass_ctx):
        recorder = _RECORDER.get()
        if predicate is not None and not predicate(mod):
            if recorder is not None:
                recorder.records.append(
                    PassRecord(len(recorder.records) + 1, phase, entry.name, 0.0, f"skipped ({entry.when} is false)")
                )
            return mod
        start = time.perf_counter()
        status = _STATUS.set(None)
        try:
            with span(entry.name, "host", pass_list=phase):
                out = inner(mod)
            detail = _STATUS.get()
        except BaseException as exc:
            exc = take_pending_error() or exc  # the class the inner pass raised, before the FFI
            if recorder is not None and recorder.failed is None:
                recorder.failed = (entry.name, phase, mod)  # for the crash capture (tessera_tvm.capture)
            if recorder is not None and recorder.error is None:
                if isinstance(exc, TesseraError):
                    recorder.error = exc
                else:
                    where = f"config {ctx.config.name!r}" if ctx.config is not None else "no target"
                    recorder.error = LoweringError(
                        f"pass {entry.name} ({_PHASE_TITLES[phase]}, {where}) failed on "
                        f"kernel(s) {_kernel_names(mod)}:\n{in_config_terms(short_tvm_message(exc), ctx.config)}"
                    )
                    recorder.error.__cause__ = exc
            raise
        finally:
            _STATUS.reset(status)
        if recorder is not None:
            recorder.records.append(
                PassRecord(
                    len(recorder.records) + 1,
                    phase,
                    entry.name,
                    time.perf_counter() - start,
                    f"ran ({detail})" if detail else "ran",
                )
            )
            recorder.dump(entry.name, out)
        return out

    return tvm.transform.module_pass(run, opt_level=0, name=entry.name)


def _sequential(entries: tuple[PipelineEntry, ...], phase: str, ctx: BuildContext):
    passes = [_wrap(entry, phase, ctx) for entry in entries]
    return tvm.transform.Sequential(passes, opt_level=0, name=f"tessera.{_PHASE_TITLES[phase]}")


def build_phase(config: TargetConfig | str | None, phase: str):
    """The TVM ``Sequential`` for one phase of a config (``None``: the shared graph list, no target)."""
    ensure_registered()
    if phase not in ALL_PHASES:
        raise ValueError(f"unknown phase {phase!r}; expected one of {ALL_PHASES}")
    if config is None:
        if phase != GRAPH_PHASE:
            raise ValueError(f"the {_PHASE_TITLES[phase]} phase needs a target config")
        return _sequential(graph_phase_default(), phase, BuildContext(None, None))
    config = load_config(config)
    return _sequential(config.phase(phase), phase, BuildContext(config, config.tvm_target()))


def _run(seq, mod):
    """``seq(mod)``, re-raising the error a pass recorded (Tessera's class, not the FFI's)."""
    with recording(_RECORDER.get()) as rec:
        try:
            return seq(mod)
        except BaseException as exc:
            error, rec.error = rec.error, None
            if error is not None and error is not exc:
                raise error from error.__cause__
            raise


def run_phase(mod, config: TargetConfig | str | None, phase: str):
    """Run one phase on ``mod`` under the config's target; re-raise Tessera's error, not the FFI's.

    The graph phase takes a Relax module and may run without a config (the shared list).
    """
    if phase == GRAPH_PHASE:
        return _run(build_phase(config, phase), mod)
    config = load_config(config)
    if isinstance(mod, tvm.tirx.PrimFunc):
        name = mod.attrs["global_symbol"] if mod.attrs and "global_symbol" in mod.attrs else "main"
        mod = tvm.IRModule({name: mod})
    # Some TileLang passes rename Vars in place; work on a copy so the caller's module never changes.
    mod = copy_module(mod)
    seq = build_phase(config, phase)
    with config.tvm_target():
        return _run(seq, mod)


def run_pass(mod, config: TargetConfig | str, name: str, phase: str | None = None):
    """Run the one pass ``name`` of ``config``'s pipeline (with the config's arguments for it) on
    ``mod``, under the config's target: how a crash capture's ``before_pass`` IR is checked alone."""
    config = load_config(config)
    for current in (phase,) if phase is not None else ALL_PHASES:
        for entry in config.phase(current):
            if entry.name == name:
                ensure_registered()
                seq = _sequential((entry,), current, BuildContext(config, config.tvm_target()))
                with config.tvm_target():
                    return _run(seq, mod)
    raise TesseraError(f"config {config.name!r} has no pass {name!r}" + (f" in its {phase} list" if phase else ""))


def LowerAndLegalize(mod, config: TargetConfig | str):  # noqa: N802  (TVM-style pass-list name)
    """Run the shared list: legalise TileLang tile programs and lower tile ops to loops."""
    return run_phase(mod, config, "lower_and_legalize")


def OptimizeForTarget(mod, config: TargetConfig | str):  # noqa: N802
    """Run the target's list: memory, pipelining, intrinsics, host/device split."""
    return run_phase(mod, config, "optimize_for_target")


def CodegenPrep(mod, config: TargetConfig | str):  # noqa: N802
    """Run the passes that prepare the device module for source generation."""
    return run_phase(mod, config, "codegen_prep")


def pass_names(config: TargetConfig | str, phase: str | None = None) -> list[str]:
    """The ordered pass names of a config (the TIR phases, or one phase)."""
    ensure_registered()
    config = load_config(config)
    phases = PHASES if phase is None else (phase,)
    return [entry.name for p in phases for entry in config.phase(p)]


def format_pass_list(config: TargetConfig | str) -> str:
    """The expanded pass list as text: what ``tessera passes`` prints and the golden files hold."""
    config = load_config(config)
    out = [f"# {config.name}: {config.description}".rstrip(": "), f"# target: {config.target_dict}"]
    for phase in ALL_PHASES:
        entries = config.phase(phase)
        out.append(f"\n[{_PHASE_TITLES[phase]}]  # {len(entries)} passes")
        out.extend(entry.describe() for entry in entries)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# The graph phase of a traced kernel (the passes live in tessera_tvm/graph)
# ---------------------------------------------------------------------------------------------


def run_graph_passes(traced, name: str, config=None, dump_dir: Path | None = None) -> GraphIR:
    """Run the graph phase of ``config`` (the shared list when None) on ``traced``, an IRModule
    whose function ``name`` is the kernel; ``dump_dir`` receives the module after each pass."""
    from .graph.outline_kernels import read_kernels
    from .graph.passes import GraphIR

    graph = GraphIR(name, traced)
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        (dump_dir / "000_input.py").write_text(traced.script())
    with recording(PassRecorder(dump_dir)) as recorder:
        graph.module = run_phase(traced, config, "graph")
    graph.records = recorder.records
    if dump_dir is not None:
        (dump_dir / "timing.txt").write_text(recorder.timing_table())
    graph.simplified, graph.groups = read_kernels(graph.module, name)
    return graph


def graph_phase_key(config=None) -> tuple | None:
    """What decides the graph phase's result besides the traced module: the config's fingerprint
    and the current ``PassContext``'s settings. None when the PassContext has instruments, which
    must see every pass run (the caller does not reuse an earlier result then)."""
    from .cache import pass_context_settings

    if list(tvm.transform.PassContext.current().instruments):
        return None
    settings = pass_context_settings()
    return (
        None if config is None else load_config(config).fingerprint(),
        tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(settings.items())),
    )
