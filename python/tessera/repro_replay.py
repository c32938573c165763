"""Replaying a Tessera repro pack or crash capture (``tessera replay``, ``ts.replay``, the ``replay.py``
of every pack): the pack opened and checked by :mod:`tessera.repro`, its kernel recompiled from the
saved Graph IR or tile program, and the recorded failure reproduced (the same error class, the same
message up to paths) or the saved outputs checked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tessera_tvm import capture as _capture
from tessera_tvm.capture import Capture, strip_capture_line

from ._environ import environment_set
from .errors import TesseraError

__all__ = ["ReplayResult", "main", "replay"]

#: Limits on what a pack may hold (a pack over them is refused before anything is written).
from .repro import PackError, _as_numpy, _load_arrays, _random_inputs, open_pack, restore_kernel

# ---------------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ReplayResult:
    """What a replay found. ``reproduced``: the pack's outcome happened again (the same error, or
    outputs that match the saved ones)."""

    reproduced: bool
    summary: str
    kind: str
    details: list[str] = dataclasses.field(default_factory=list)
    error: BaseException | None = None

    def text(self) -> str:
        """The result to print: text from the pack (its recorded error, names) with control characters escaped."""
        head = f"{'REPRODUCED' if self.reproduced else 'NOT REPRODUCED'} ({self.kind}): {self.summary}"
        return printable("\n".join([head, *("  " + d for d in self.details)]))


# Control characters (ANSI escapes, carriage returns, C1 controls, bidirectional overrides), kept
# out of a terminal: a pack's recorded error message is text from elsewhere.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab written as its Python escape."""
    return _UNPRINTABLE.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


_PATH = re.compile(r"(?<![\w.])/(?:[\w.+@%=,-]+/)*[\w.+@%=,-]*")


def normalized_message(message: str) -> str:
    """An error message compared across machines: without the capture line, paths as ``<path>``."""
    return _PATH.sub("<path>", strip_capture_line(message)).strip()


def _compare_error(recorded: dict, exc: BaseException | None, kind: str, details: list[str]) -> ReplayResult:
    want = f"{recorded.get('type')}: {recorded.get('message')}"
    if exc is None:
        return ReplayResult(False, f"ran without error; the pack recorded {recorded.get('type')}", kind, details)
    cls = type(exc)
    found_type = f"{cls.__module__}.{cls.__qualname__}"
    same = found_type == recorded.get("type") and normalized_message(str(exc)) == normalized_message(
        str(recorded.get("message", ""))
    )
    if same:
        return ReplayResult(True, f"the same error: {found_type}", kind, details, exc)
    details = [*details, f"recorded: {want}", f"replayed: {found_type}: {strip_capture_line(str(exc))}"]
    return ReplayResult(False, "a different error", kind, details, exc)


def _failing_pass_alone(capture: Capture) -> list[str]:
    """A line on the failing pass run alone on the IR it received (before_pass.json), if captured."""
    failed = capture.record.get("failed_pass")
    if not failed:
        return []
    try:
        _capture.replay_failing_pass(capture)
    except Exception as exc:
        same = _compare_error(capture.record.get("error") or {}, exc, "", []).reproduced
        verdict = (
            "the same error" if same else f"another error: {type(exc).__name__}: {strip_capture_line(str(exc))[:200]}"
        )
        return [f"{failed.get('name')} alone on before_pass.json: {verdict}"]
    return [f"{failed.get('name')} alone on before_pass.json: no error"]


def _tolerance(name: str) -> tuple[float, float]:
    return {"f32": (1e-4, 1e-5), "f16": (1e-2, 1e-3), "bf16": (2e-2, 1e-2)}.get(
        name, (0.1, 0.1) if "fp8" in name else (0, 0)
    )


def _check_outputs(outputs: Sequence[Any], saved: Sequence[np.ndarray], records: list[dict]) -> list[str]:
    """Mismatches of ``outputs`` against the saved ones (empty: they agree)."""
    problems = []
    if len(outputs) != len(saved):
        return [f"{len(outputs)} outputs, the pack saved {len(saved)}"]
    for i, (got, want, record) in enumerate(zip(outputs, saved, records, strict=True)):
        got = np.asarray(_as_numpy(got) if not isinstance(got, np.ndarray) else got)
        if got.shape != want.shape:
            problems.append(f"output {i}: shape {got.shape}, saved {want.shape}")
            continue
        rtol, atol = _tolerance(record["dtype"])
        a, b = got.astype(np.float64), want.astype(np.float64)
        if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            problems.append(f"output {i}: max |difference| {np.nanmax(np.abs(a - b)):.3g} (rtol {rtol}, atol {atol})")
    return problems


def _environment_notes(capture: Capture) -> list[str]:
    recorded = capture.record.get("environment") or {}
    here = _capture.environment()
    notes = []
    if capture.record.get("environment_hash") != _capture.environment_hash(here):
        for key in ("python", "cpu", "code"):
            if recorded.get(key) != here.get(key):
                notes.append(f"environment differs: {key} {recorded.get(key)!r} in the pack, {here.get(key)!r} here")
        for group in ("packages", "compilers"):
            for name, value in (recorded.get(group) or {}).items():
                mine = (here.get(group) or {}).get(name)
                if value != mine:
                    notes.append(f"environment differs: {name} {value!r} in the pack, {mine!r} here")
    return notes


def replay(
    path: str | os.PathLike[str], *, run: bool = False, workdir: str | os.PathLike[str] | None = None
) -> ReplayResult:
    """Replay a pack (``.tar.gz``) or capture directory here: recompile from its saved Graph IR or
    tile program, then compare with what it recorded. ``run``: also run its prebuilt library."""
    if workdir is None and Path(path).expanduser().is_file():  # unpack into a directory that goes away after
        with tempfile.TemporaryDirectory(prefix="tessera_replay_") as scratch:
            return replay(path, run=run, workdir=scratch)
    capture = open_pack(path, workdir)
    with _recorded_build_settings(capture):
        return _replay(capture, run)


#: The ``TESSERA_*`` settings that change the command a kernel is built with (whether CPU kernels link
#: the runtime objects, the optimisation of TVM's host C), with the values a replay takes from a pack
#: (text from elsewhere: anything else is left unset): a replay builds as the capture did.
BUILD_SETTINGS = {
    "TESSERA_CPU_RUNTIME": re.compile(r"inline|linked"),
    "TESSERA_HOST_C_OPT": re.compile(r"-O[0-3s]|-Og"),
}


def _recorded_build_settings(capture: Capture):
    """The process environment with the capture's :data:`BUILD_SETTINGS` (set or unset as recorded)."""
    recorded = (capture.record.get("environment") or {}).get("settings") or {}
    values = {}
    for name, allowed in BUILD_SETTINGS.items():
        value = recorded.get(name) if isinstance(recorded, dict) else None
        values[name] = value if isinstance(value, str) and allowed.fullmatch(value) else None
    return environment_set(values)


def _replay(capture: Capture, run: bool) -> ReplayResult:
    import tessera as ts

    kind = capture.record.get("kind")
    # A bad config or TVM JSON refuses the pack (exit 2) before anything runs, whatever step reads it.
    config = _capture.captured_config(capture)
    _capture.captured_pass_context(capture)
    for stem in ("graph", "program", "before_pass"):
        if capture.file(f"{stem}.json") is not None:
            _capture.checked_ir_json(
                (capture.path / f"{stem}.json").read_text(errors="replace"), str(capture.path / f"{stem}.json")
            )
    details = _environment_notes(capture) + _failing_pass_alone(capture)
    recorded = capture.record.get("error")
    if kind == "lower":
        details += _capture.program_notes(capture)
        try:
            _capture.replay_lowering(capture)
        except Exception as exc:
            return _compare_error(recorded or {}, exc, kind, details)
        return _compare_error(recorded or {}, None, kind, details)
    if kind not in ("compile", "call", "kernel"):
        raise PackError(f"{capture.path}: unknown capture kind {kind!r}; expected lower, compile, call or kernel")
    kernel, shapes, schedule, build = restore_kernel(capture)
    with _capture.disabled():
        try:
            compiled = ts.compile(kernel, config, shapes=shapes, schedule=schedule, build=build)
        except Exception as exc:
            return _compare_error(recorded or {"type": None}, exc, kind, details)
        if kind == "compile":
            return _compare_error(recorded or {}, None, kind, details)
        if kind == "call":
            arrays = (
                _load_arrays(capture, "inputs")
                if capture.record.get("inputs")
                else _random_inputs(kernel, shapes, seed=0)
            )
            try:
                compiled(*arrays)
            except Exception as exc:
                return _compare_error(recorded or {}, exc, kind, details)
            return _compare_error(recorded or {}, None, kind, details)
        inputs = _load_arrays(capture, "inputs")
        saved = _load_arrays(capture, "outputs")
        outputs = compiled(*inputs)
        outputs = list(outputs) if isinstance(outputs, tuple | list) else [outputs]
        problems = _check_outputs(outputs, saved, capture.record["outputs"])
        summary = "recompiled from the Graph IR; outputs match the saved ones"
        if run:
            problems += _run_binary(capture, inputs, saved)
            summary += " (and the prebuilt library's)" if not problems else ""
        if problems:
            return ReplayResult(False, "outputs differ from the saved ones", kind, details + problems)
        return ReplayResult(True, summary, kind, details)


def _run_binary(capture: Capture, inputs: list[np.ndarray], saved: list[np.ndarray]) -> list[str]:
    """Run the pack's tvm-ffi library (``--run`` only: it is code from the pack) on the inputs."""
    binaries = capture.record.get("binaries")
    if not binaries:
        return [f"--run: the pack has no prebuilt library ({capture.record.get('binaries_note', 'none saved')})"]
    if binaries.get("library") not in capture.record["files"]:
        raise PackError(f"{capture.path}: binaries.library {binaries.get('library')!r} is not a file of the pack")
    from tessera_tvm.target.module import call_library

    outputs = [np.empty_like(s) for s in saved]
    call_library(capture.path / binaries["library"], str(binaries.get("entry")), [*inputs, *outputs])
    return [f"prebuilt library: {p}" for p in _check_outputs(outputs, saved, capture.record["outputs"])]


# ---------------------------------------------------------------------------------------------
# Command line (tessera replay, and replay.py in every pack)
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``replay.py`` / ``tessera replay PACK [--run] [--json]``: 0 reproduced, 1 not, 2 a bad pack."""
    import argparse

    parser = argparse.ArgumentParser(prog="tessera replay", description="replay a Tessera repro pack or crash capture")
    parser.add_argument("pack", help="a .tar.gz made by tessera pack-repro, or a capture directory")
    parser.add_argument("--run", action="store_true", help="also run the pack's prebuilt library (code from the pack)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        result = replay(args.pack, run=args.run)
    except TesseraError as exc:
        print(printable(f"tessera replay: {exc}"), file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {
                    "reproduced": result.reproduced,
                    "kind": result.kind,
                    "summary": result.summary,
                    "details": result.details,
                }
            )
        )
    else:
        print(result.text())
    return 0 if result.reproduced else 1
