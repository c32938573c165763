"""Crash capture (issue #18, part 3): what a failed compile or call leaves behind to be replayed.

When ``tessera_tvm.lower`` fails (a pass, a resource check, the codegen, the toolchain), or a
``ts.compile`` or a kernel call fails, a capture directory is written and the error message ends
with its path::

    tessera_tvm.errors.ResourceError: kernel 'gemm_kernel' needs 8208 bytes of shared memory ...
    crash capture: ~/.cache/tessera/repro/gemm-20261125T193012-3f2a9c

Where: ``$TESSERA_REPRO_DIR``, else ``$TESSERA_CACHE_DIR/repro`` when the kernel cache was moved,
else ``~/.cache/tessera/repro``; ``TESSERA_REPRO_DIR=off`` turns capture off. The newest
:data:`KEEP` captures are kept.

A capture holds (each file listed with its SHA-256 in ``capture.json``):

- ``capture.json``: what failed (kind, stage, pass, the error's class and message), the kernel,
  the config, the versions and an environment hash (:func:`environment`), the files;
- ``config.yaml``: the config expanded (shared pass lists inlined, arguments merged) so that it
  loads on its own; ``log.txt``: the error, its traceback, the passes that ran and log records;
- ``program.json`` / ``program.py``: the tile program as given to ``lower`` (TVM JSON, which replay
  loads, and TVMScript to read); ``before_pass.json`` / ``before_pass.py``: the IR the failing pass
  received; ``metadata.json`` when the codegen had produced it;
- from the frontend (``tessera.repro``): the kernel's types, shapes, schedule overrides and its
  traced Graph IR, the schedules and tile programs built so far, the arguments of a failed call.

Nothing here is read back by executing it: replay loads JSON and TVM JSON only (``tessera.repro``).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import hashlib
import json
import logging
import os
import platform
import re
import secrets
import shutil
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import TesseraError
from .ir_json import IRJsonError, _is_int, _take_raised_error, checked_ir_json

__all__ = [
    "KEEP",
    "Capture",
    "capture_of",
    "capture_root",
    "cpu_info",
    "disabled",
    "environment",
    "expanded_config_yaml",
    "pass_context_record",
    "start_capture",
]

#: Captures kept under the capture directory (the oldest are removed when a new one is made).
KEEP = 50
FORMAT = 1
MANIFEST = "capture.json"
_OFF = {"0", "off", "none", "false", "no"}
_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("tessera_capture_enabled", default=True)
# Loggers whose records a capture's log.txt holds (at the level the user configured).
_LOGGERS = ("tessera", "tessera_tvm", "tilelang")


def capture_root() -> Path | None:
    """Where captures go, or None when capture is off (``TESSERA_REPRO_DIR=off``)."""
    explicit = os.environ.get("TESSERA_REPRO_DIR", "").strip()
    if explicit.lower() in _OFF:
        return None
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("TESSERA_CACHE_DIR", "").strip()
    if cache:
        return Path(cache).expanduser() / "repro"
    return Path.home() / ".cache" / "tessera" / "repro"


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """No capture for failures inside the block (the autotuner's candidates fail on purpose)."""
    token = _ENABLED.set(False)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def capture_of(exc: BaseException) -> Capture | None:
    """The capture already written for ``exc`` (an inner layer's), or None."""
    return getattr(exc, "tessera_capture", None)


def start_capture(exc: BaseException, kind: str, name: str) -> Capture | None:
    """The capture of ``exc``: the one an inner layer started, or a new directory (its path appended
    to the error's message). None when capture is off or the directory cannot be written; capture
    never replaces the user's error with one of its own."""
    existing = capture_of(exc)
    if existing is not None:
        return existing
    if not _ENABLED.get():
        return None
    root = capture_root()
    if root is None:
        return None
    try:
        capture = Capture.create(root, kind, _NAME.get() or name, exc)
    except OSError:
        return None
    try:
        exc.tessera_capture = capture  # type: ignore[attr-defined]
    except AttributeError:  # an exception type with __slots__: capture stays, the message does not say
        return capture
    _append_path(exc, capture.path)
    return capture


def _append_path(exc: BaseException, path: Path) -> None:
    line = f"crash capture: {path}"
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]}\n{line}", *exc.args[1:])
    elif not exc.args:
        exc.args = (line,)
    else:
        exc.add_note(line)


def strip_capture_line(message: str) -> str:
    """An error message without the ``crash capture: ...`` line capture added."""
    return "\n".join(ln for ln in message.splitlines() if not ln.startswith("crash capture: ")).rstrip()


class Capture:
    """One capture directory; each ``add_*`` writes a file and :meth:`save` rewrites the manifest."""

    def __init__(self, path: Path, record: dict[str, Any]) -> None:
        self.path = path
        self.record = record

    @classmethod
    def create(cls, root: Path, kind: str, name: str, exc: BaseException | None, *, prune: bool = True) -> Capture:
        """A new directory under ``root`` with its manifest (and ``exc``'s log); ``exc`` is None for a
        pack of a kernel that works (``tessera.repro.pack_kernel``)."""
        root.mkdir(parents=True, exist_ok=True)
        if prune:
            _prune(root, KEEP - 1)
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:60] or "kernel"
        staging = root / f".{safe}-{stamp}-{secrets.token_hex(3)}.tmp"
        staging.mkdir()
        env = environment()
        record = {
            "format": FORMAT,
            "kind": kind,  # "lower" (a tile program), "compile" (a kernel), "call" (a kernel call)
            "name": name,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "error": None if exc is None else {"type": _qualname(exc), "message": strip_capture_line(str(exc))},
            "environment": env,
            "environment_hash": environment_hash(env),
            "argv": list(sys.argv),
            "files": {},
        }
        capture = cls(staging, record)
        if exc is not None:
            capture.add_text("log.txt", _log_text(exc))
        capture.save()
        final = root / staging.name[1:].removesuffix(".tmp")
        os.rename(staging, final)  # readers never see a capture without its manifest
        capture.path = final
        return capture

    # Writing ----------------------------------------------------------------------------------
    def add_bytes(self, name: str, data: bytes) -> Path:
        """Write ``data`` as file ``name`` of the capture and list it with its digest."""
        path = self.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.record["files"][name] = _digest(path)
        return path

    def add_text(self, name: str, text: str) -> Path:
        return self.add_bytes(name, text.encode())

    def add_json(self, name: str, value: Any, *, sort_keys: bool = True) -> Path:
        return self.add_text(name, json.dumps(value, indent=1, sort_keys=sort_keys, default=str) + "\n")

    def add_ir(self, stem: str, mod) -> None:
        """``mod`` as ``<stem>.json`` (TVM JSON: what replay loads) and ``<stem>.py`` (TVMScript to read)."""
        from ._tvm import tvm

        self.add_text(f"{stem}.json", tvm.ir.save_json(mod))
        try:
            self.add_text(f"{stem}.py", mod.script())
        except Exception as exc:  # a module the printer cannot show: the JSON is what counts
            self.add_text(f"{stem}.py", f"# TVMScript printing failed: {exc}\n")

    def add_config(self, config) -> None:
        self.add_text("config.yaml", expanded_config_yaml(config))
        self.record["config"] = {"name": config.name, "source": config.source, "fingerprint": config.fingerprint()}

    def append_log(self, title: str, text: str) -> None:
        path = self.path / "log.txt"
        with open(path, "a") as fh:
            fh.write(f"\n==== {title} ====\n{text.rstrip()}\n")
        self.record["files"]["log.txt"] = _digest(path)

    def update(self, **fields: Any) -> None:
        self.record.update(fields)

    def save(self) -> None:
        from .target.toolchain import write_text_atomic

        write_text_atomic(self.path / MANIFEST, json.dumps(self.record, indent=1, sort_keys=True, default=str) + "\n")

    # Reading ----------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Capture:
        """A capture directory, its manifest read and every listed file checked against its digest."""
        from .errors import TesseraError

        path = Path(path)
        manifest = path / MANIFEST
        try:
            record = json.loads(manifest.read_text())
        except FileNotFoundError:
            raise TesseraError(f"{path}: not a crash capture or repro pack (no {MANIFEST})") from None
        except (OSError, ValueError) as exc:
            raise TesseraError(f"{manifest}: unreadable ({exc}); expected the JSON a crash capture writes") from None
        if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
            raise TesseraError(f"{manifest}: expected a JSON object with a 'files' mapping")
        if record.get("format") != FORMAT:
            raise TesseraError(f"{manifest}: format {record.get('format')!r}; this Tessera reads format {FORMAT}")
        for name, info in record["files"].items():
            if not _relative_name(name):
                raise TesseraError(f"{manifest}: file name {name!r} is not a plain relative path; refused")
            file = path / name
            if file.is_symlink() or any((path / parent).is_symlink() for parent in Path(name).parents if parent.parts):
                raise TesseraError(f"{path}: {name} is a symbolic link; a capture holds plain files only; refused")
            if not file.is_file():
                raise TesseraError(f"{path}: {name} is listed in {MANIFEST} but missing")
            if not isinstance(info, dict) or _digest(file)["sha256"] != info.get("sha256"):
                raise TesseraError(f"{path}: {name} does not match its SHA-256 in {MANIFEST} (corrupt or edited)")
        return cls(path, record)

    def file(self, name: str) -> Path | None:
        return self.path / name if name in self.record["files"] else None


def _relative_name(name: Any) -> bool:
    """A manifest's file name: relative, no ``..``, no empty or odd parts."""
    if not isinstance(name, str) or not name or name.startswith(("/", "\\")) or "\\" in name:
        return False
    parts = name.split("/")
    return all(part not in ("", ".", "..") and re.fullmatch(r"[A-Za-z0-9_.+-]+", part) for part in parts)


def _digest(path: Path) -> dict[str, Any]:
    from .target.toolchain import sha256_file

    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def _qualname(exc: BaseException) -> str:
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"


def _prune(root: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` captures under ``root`` (never anything else)."""
    found = []
    for child in root.iterdir():
        if child.name.startswith(".") or not (child / MANIFEST).is_file():
            continue
        with contextlib.suppress(OSError):
            found.append((child.stat().st_mtime, child))
    found.sort()
    for _, child in found[: max(0, len(found) - keep)]:
        shutil.rmtree(child, ignore_errors=True)


def _log_text(exc: BaseException) -> str:
    lines = [
        f"error: {_qualname(exc)}",
        strip_capture_line(str(exc)),
        "",
        "==== traceback ====",
        "".join(traceback.format_exception(exc)).rstrip(),
    ]
    output = getattr(exc, "output", None)
    if isinstance(output, str) and output.strip():  # a toolchain's whole output (the message has its errors)
        lines += ["", "==== toolchain output ====", f"$ {' '.join(getattr(exc, 'command', []) or [])}", output.rstrip()]
    records = _LOG_BUFFER.get()
    if records:
        lines += ["", "==== log records ====", *records]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Log records during a compile
# ---------------------------------------------------------------------------------------------

_LOG_BUFFER: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("tessera_log_buffer", default=None)


class _BufferHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        buffer = _LOG_BUFFER.get()
        if buffer is not None and len(buffer) < 5000:
            with contextlib.suppress(Exception):
                buffer.append(f"{record.levelname} {record.name}: {record.getMessage()}")


_HANDLER = _BufferHandler()


_NAME: contextvars.ContextVar[str | None] = contextvars.ContextVar("tessera_capture_name", default=None)


@contextlib.contextmanager
def collecting_logs(name: str | None = None) -> Iterator[None]:
    """Keep the records Tessera's and TileLang's loggers emit inside the block (at the levels the
    user set) for a capture's log.txt; a capture started inside is named ``name`` (the kernel, not
    the fused kernel lowering failed on). Nested blocks share the outer one's buffer and name."""
    if _LOG_BUFFER.get() is not None:
        yield
        return
    token = _LOG_BUFFER.set([])
    name_token = _NAME.set(name)
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    for logger in loggers:
        if _HANDLER not in logger.handlers:
            logger.addHandler(_HANDLER)
    try:
        yield
    finally:
        _NAME.reset(name_token)
        _LOG_BUFFER.reset(token)


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------


def _package_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def cpu_info() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (``model name``, ``cpu family``, ``flags``,
    ...), {} where there is none: what the captures, the tuning cache and the bench say a CPU is."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                if fields:
                    break  # the end of the first processor's entry
                continue
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_model() -> str:
    model = cpu_info().get("model name")
    return platform.processor() if model is None else model


def environment() -> dict[str, Any]:
    """What about this machine and install can change a compile: versions of Python, Tessera,
    TileLang, TVM and the libraries, the compilers, a digest of Tessera's lowering code, the CPU
    and the ``TESSERA_*`` settings."""
    from .cache import _code_digest, _compiler_version

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "packages": {
            name: _package_version(name)
            for name in ("tessera", "tilelang", "apache-tvm-ffi", "numpy", "ml_dtypes", "torch", "PyYAML")
        },
        "compilers": {tool: _compiler_version(tool) for tool in ("g++", "nvcc")},
        "code": _code_digest(),
        "settings": {k: v for k, v in sorted(os.environ.items()) if k.startswith("TESSERA_")},
    }


def environment_hash(env: dict[str, Any] | None = None) -> str:
    """A short hash of :func:`environment` without its paths and settings: two machines with the
    same hash have the same software (the CPU model is part of it: g++ builds with -march=native)."""
    env = dict(env if env is not None else environment())
    env.pop("settings", None)
    env["compilers"] = {k: v.split(": ", 1)[-1] for k, v in env.get("compilers", {}).items()}
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]


def pass_context_record(pass_ctx) -> dict[str, Any]:
    """What a ``PassContext`` changes about a compile, as JSON values (replay rebuilds it)."""
    return {
        "opt_level": int(pass_ctx.opt_level),
        "config": {str(k): _plain(v) for k, v in pass_ctx.config.items()},
        "disabled_pass": sorted(str(p) for p in pass_ctx.disabled_pass),
        "required_pass": sorted(str(p) for p in pass_ctx.required_pass),
    }


def _plain(value: Any) -> Any:
    if isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "value") and isinstance(value.value, bool | int | float):
        dtype = str(getattr(value, "dtype", ""))
        return bool(value.value) if dtype == "bool" else value.value
    return str(value)


# ---------------------------------------------------------------------------------------------
# The expanded config
# ---------------------------------------------------------------------------------------------


def expanded_config_yaml(config) -> str:
    """``config`` as a YAML file that loads on its own: its sections as written, the pipeline with
    every shared list inlined, feature conditions resolved and pass arguments merged per entry."""
    import yaml

    data = {k: v for k, v in dict(config.raw).items() if k not in ("pipeline", "pass_args")}
    pipeline = {}
    for phase, entries in config.pipeline:
        items = []
        for entry in entries:
            if not entry.args and entry.when is None:
                items.append(entry.name)
                continue
            item: dict[str, Any] = {"pass": entry.name}
            if entry.args:
                item["args"] = dict(entry.args)
            if entry.when is not None:
                item["when"] = entry.when
            items.append(item)
        pipeline[phase] = items
    data["pipeline"] = pipeline
    header = f"# {config.name}, expanded from {config.source} (fingerprint {config.fingerprint()})\n"
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None)


# ---------------------------------------------------------------------------------------------
# Reading a capture back (replay): JSON and TVM JSON only, never code
# ---------------------------------------------------------------------------------------------


def captured_config(capture: Capture):
    """The capture's expanded config, loaded (and validated) from its ``config.yaml``; its codegen
    flags must be on the allow-list of ``tessera_tvm.target.toolchain.untrusted_flag_problem``."""
    from .config import load_config
    from .errors import TesseraError
    from .target.toolchain import check_untrusted_flags

    path = capture.file("config.yaml")
    if path is None:
        raise TesseraError(f"{capture.path}: holds no config.yaml")
    config = load_config(path)
    # The flags reach g++ or nvcc: from a pack only those of the allow-list (load_config also reads
    # the installed configs and the user's own, whose flags are the user's choice, like a Makefile's).
    check_untrusted_flags(list(config.codegen_dict["flags"]), f"{path}")
    return config


def replay_lowering(capture: Capture):
    """``tessera_tvm.lower`` of the captured tile program under the captured config and
    ``PassContext`` (its ``program.json``, TVM JSON); raises what that lowering raises."""
    from ._tvm import tvm
    from .lower import lower

    program = load_ir(capture, "program")
    config = captured_config(capture)
    settings = captured_pass_context(capture)
    with disabled(), tvm.transform.PassContext(**settings):
        return lower(program, config, build=bool((capture.record.get("program") or {}).get("build", True)))


def captured_pass_context(capture: Capture) -> dict[str, Any]:
    """The ``PassContext`` arguments a capture recorded, checked: an int ``opt_level``, lists of pass
    names, and config switches only (a registered key whose value is a number or a bool). A key that
    takes a string or a list (``tl.device_compile_flags``, ``tl.dump_ir_path``,
    ``cuda.kernels_output_dir``, ``tirx.add_lower_pass``) or dumps files is refused: from a pack it
    could pass flags to nvcc or write where the pack says."""
    from ._tvm import tvm

    where = f"{capture.path / MANIFEST}: pass_context"
    settings = capture.record.get("pass_context") or {}
    if not isinstance(settings, dict):
        raise TesseraError(f"{where} is {str(settings)[:80]!r}; expected a mapping")
    opt_level = settings.get("opt_level", 2)
    if not _is_int(opt_level, 0, 4):
        raise TesseraError(f"{where}.opt_level is {str(opt_level)[:40]!r}; expected an int from 0 to 4")
    names = {}
    for key in ("disabled_pass", "required_pass"):
        value = settings.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and len(v) < 200 for v in value):
            raise TesseraError(f"{where}.{key} is {str(value)[:80]!r}; expected a list of pass names")
        names[key] = value
    config = settings.get("config") or {}
    if not isinstance(config, dict):
        raise TesseraError(f"{where}.config is {str(config)[:80]!r}; expected a mapping")
    known = tvm.transform.PassContext.list_configs()
    for key, value in config.items():
        kind = str((known.get(key) or {}).get("type", "")) if isinstance(key, str) else ""
        switch = kind in ("ir.IntImm", "ir.FloatImm", "bool", "int", "float") and "dump" not in key
        if not switch or not isinstance(value, bool | int | float):
            raise TesseraError(
                f"{where}.config[{str(key)[:80]!r}] = {str(value)[:80]!r} is refused: a pack may set only "
                "registered PassContext switches (a number or a bool), not strings, lists or dumps"
            )
    return {"opt_level": opt_level, "config": dict(config), **names}


def load_ir(capture: Capture, stem: str):
    """The TVM object of the capture's ``<stem>.json`` (TVM JSON: checked by :func:`checked_ir_json`,
    then parsed, never executed)."""
    from ._tvm import load_json
    from .errors import TesseraError

    path = capture.file(f"{stem}.json")
    if path is None:
        raise TesseraError(f"{capture.path}: holds no {stem}.json")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise IRJsonError(f"{path}: unreadable ({exc}); expected TVM JSON written by tvm.ir.save_json") from None
    text = checked_ir_json(text, str(path))
    _take_raised_error()  # a stale error of an earlier call would read as this load's
    try:
        loaded = load_json(text)
    except Exception as exc:
        raise TesseraError(
            f"{path}: not TVM JSON this TVM can load ({str(exc).splitlines()[0] if str(exc) else exc})"
        ) from None
    dropped = _take_raised_error()
    if dropped:  # TVM's loader ignores a field it could not set and leaves it null: refuse instead
        raise IRJsonError(f"{path}: a field does not hold what its type needs ({dropped}); refused")
    return loaded


def replay_failing_pass(capture: Capture):
    """Run only the pass that failed on the IR it received (``before_pass.json``), under the
    captured config; raises what the pass raises. None when the capture names no failing pass."""
    from .pipeline import run_pass

    failed = capture.record.get("failed_pass")
    if not isinstance(failed, dict) or capture.file("before_pass.json") is None:
        return None
    with disabled():
        return run_pass(
            load_ir(capture, "before_pass"), captured_config(capture), str(failed.get("name")), failed.get("phase")
        )


def program_notes(capture: Capture) -> list[str]:
    """What a replay of the captured tile program should be read with: a program that annotates
    layouts (``T.annotate_layout``, ``loop_layout=``) loads from TVM JSON with layouts TileLang's
    passes do not recognise as theirs, so its replay may fail where the original did not."""
    from ._tvm import _annotated_layouts

    if capture.file("program.json") is None or not _annotated_layouts(load_ir(capture, "program")):
        return []
    return [
        "the tile program annotates layouts: loaded from TVM JSON they are not TileLang's own objects, "
        "so this replay may fail differently (a known limit of program-level replay)"
    ]
