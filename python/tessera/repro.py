"""Crash captures of kernels and repro packs (issue #18, parts 3 to 5); replaying them is
:mod:`tessera.repro_replay`'s.

    k = ts.compile(linear, target="cpu", shapes={"M": 128, "N": 64, "K": 32})
    ts.pack_repro(k, "linear.tar.gz", inputs=[a, w, b])    # the kernel, sample inputs and outputs
    ts.pack_repro("~/.cache/tessera/repro/linear-...", "crash.tar.gz")   # a crash capture

    tessera pack-repro CAPTURE_DIR -o crash.tar.gz
    tessera pack-repro examples/linear.py --target cpu --shapes M=128,N=64,K=32 -o linear.tar.gz
    tessera replay crash.tar.gz [--run]        # or: tar xzf crash.tar.gz && python */replay.py

A failed ``ts.compile`` (after the body traced) or a failed call adds to the capture
``tessera_tvm.capture`` writes (or starts one): the kernel's parameter types, shapes and schedule
overrides (``kernel.json``), its traced Graph IR (``graph.json`` as TVM JSON, ``graph.py`` to
read), the schedules and tile programs built so far (``sched/``, ``tile/``), the source of the body
(``kernel_source.py``, to read: replay never runs it) and, for a call, its arguments' shapes and
dtypes (``arguments.json``, and their values when small).

Replay recompiles from the saved Graph IR (a kernel restored without its Python body), or from the
saved tile program for a capture of ``tessera_tvm.lower``, and then either reproduces the failure
(the same error class, the same message up to paths) or runs the saved inputs and checks the saved
outputs. Loading a pack never runs code from it: JSON, TVM JSON and raw array bytes only; a
pack's binaries are loaded only with ``--run``. A tarball with absolute paths, ``..``, links,
special files, unlisted or oversized members, or files that do not match their SHA-256 is refused.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tessera_tvm import capture as _capture
from tessera_tvm.capture import Capture, start_capture

from .errors import ArgumentError, KernelError, NotRunnableError, TesseraError
from .kernel import Kernel
from .types import TensorType, dtype

__all__ = ["PackError", "open_pack", "pack_repro"]

#: Limits on what a pack may hold (a pack over them is refused before anything is written).
MAX_MEMBER_BYTES = 1 << 30
MAX_TOTAL_BYTES = 4 << 30
MAX_MEMBERS = 10_000
#: A failed call's argument values are kept when they add up to at most this many bytes.
MAX_SAVED_ARGUMENT_BYTES = 16 << 20

REPLAY_SCRIPT = '''\
#!/usr/bin/env python3
"""Replay this Tessera repro pack: python replay.py [--run] [--json]

Recompiles the saved Graph IR or tile program with the Tessera installed here and reproduces the
recorded failure, or checks the saved outputs. Exit status 0: reproduced; 1: not; 2: a bad pack.
--run also loads and runs the pack's prebuilt library (binaries/), which is code from the pack.
"""
import sys
from pathlib import Path

try:
    from tessera.repro import main
except ImportError as exc:
    sys.exit(f"replay.py needs Tessera installed in this Python ({exc})")

sys.exit(main([str(Path(__file__).resolve().parent), *sys.argv[1:]]))
'''


class PackError(TesseraError, ValueError):
    """A repro pack or capture that is malformed, corrupt or unsafe; nothing from it was used."""


# ---------------------------------------------------------------------------------------------
# Capture: what a failed compile or call of a kernel adds
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class CompileProgress:
    """How far a compile got (``tessera.build`` fills it in): the stage and fused kernel it was
    working on, the schedules and tile programs built so far."""

    stage: str = "graph"
    group: str | None = None
    schedules: dict[str, Any] = dataclasses.field(default_factory=dict)
    tiles: dict[str, Any] = dataclasses.field(default_factory=dict)


def _trace_key(env: dict[str, int]) -> tuple:
    return (tuple(sorted(env.items())), ())


def _type_record(t: TensorType) -> dict[str, Any]:
    return {"dims": list(t.dims), "dtype": t.dtype.name}


def _add_kernel(capture: Capture, kernel: Kernel, config, env: dict[str, int], overrides, build: bool, traced) -> None:
    if "kernel.json" in capture.record["files"]:
        return
    result = kernel.result
    capture.add_json(
        "kernel.json",
        {
            "name": kernel.name,
            "params": [{"name": n, **_type_record(t)} for n, t in kernel.params],
            "result": None
            if result is None
            else [_type_record(t) for t in (result if isinstance(result, tuple) else (result,))],
            "result_is_tuple": isinstance(result, tuple),
            "shapes": dict(env),
            "schedule": dict(overrides),
            "build": bool(build),
        },
        sort_keys=False,  # schedule overrides in the user's order: errors quote them
    )
    capture.add_ir("graph", traced)
    try:
        capture.add_text(
            "kernel_source.py", "# the kernel's body, to read: replay never runs it\n" + inspect.getsource(kernel.fn)
        )
    except (OSError, TypeError):
        pass
    if "config.yaml" not in capture.record["files"]:
        capture.add_config(config)
    capture.update(kernel=kernel.name)


def capture_compile_failure(
    exc, kernel: Kernel, config, env, overrides, build: bool, progress: CompileProgress
) -> None:
    """Add the kernel's side to the capture of a failed compile (none when the body did not trace:
    that error is at the user's line already)."""
    traced = kernel._traces.get(_trace_key(env))
    if traced is None or isinstance(exc, ArgumentError):
        return
    capture = start_capture(exc, "compile", kernel.name)
    if capture is None:
        return
    try:
        _add_kernel(capture, kernel, config, env, overrides, build, traced)
        for name, schedule in progress.schedules.items():
            capture.add_text(f"sched/{name}.json", schedule.to_json() + "\n")
        for name, tile in progress.tiles.items():
            capture.add_ir(f"tile/{name}", tile)
        capture.update(kind="compile", fused_kernel=progress.group, stage=capture.record.get("stage") or progress.stage)
    except Exception as failure:  # capture never hides the user's error
        capture.append_log("capture incomplete", f"{type(failure).__name__}: {failure}")
    finally:
        capture.save()


def _array_record(name: str, array: Any) -> dict[str, Any]:
    shape = [int(d) for d in getattr(array, "shape", ())]
    record: dict[str, Any] = {"name": name, "shape": shape, "type": type(array).__name__}
    try:
        record["dtype"] = dtype(getattr(array, "dtype", None)).name
    except Exception:
        record["dtype"] = str(getattr(array, "dtype", type(array).__name__))
    device = getattr(array, "device", None)
    if device is not None and not isinstance(array, np.ndarray):
        record["device"] = str(device)
    return record


def _as_numpy(array: Any) -> np.ndarray | None:
    if isinstance(array, np.ndarray):
        return array
    if type(array).__module__.startswith("torch"):
        try:
            return array.detach().cpu().numpy()
        except Exception:  # bf16 torch tensors have no numpy view
            return None
    return None


def capture_call_failure(exc, compiled, arrays: Sequence[Any]) -> None:
    """The capture of a failed call: the kernel as compiled, the arguments' shapes and dtypes
    (and their values, when small). Mistakes in the arguments themselves are not captured: their
    error says all there is."""
    if isinstance(exc, ArgumentError | NotRunnableError | KernelError):
        return
    instance = compiled._ran or compiled._instance
    env = dict(instance.env) if instance is not None else dict(compiled.shapes)
    traced = compiled.kernel._traces.get(_trace_key(env))
    if traced is None:  # the body did not trace for these dims: its error is at the user's line
        return
    capture = start_capture(exc, "call", compiled.kernel.name)
    if capture is None:
        return
    try:
        _add_kernel(capture, compiled.kernel, compiled.config, env, compiled.overrides, compiled.build, traced)
        names = [n for n, _ in compiled.kernel.params]
        names += [f"arg{i}" for i in range(len(names), len(arrays))]
        capture.add_json("arguments.json", [_array_record(n, a) for n, a in zip(names, arrays, strict=False)])
        values = [_as_numpy(a) for a in arrays]
        if all(v is not None for v in values) and sum(v.nbytes for v in values) <= MAX_SAVED_ARGUMENT_BYTES:
            capture.update(inputs=_save_arrays(capture, "inputs", names, values))
        if capture.record.get("kind") != "compile":  # a compile the call started keeps its kind
            capture.update(kind="call", stage="call")
    except Exception as failure:
        capture.append_log("capture incomplete", f"{type(failure).__name__}: {failure}")
    finally:
        capture.save()


# ---------------------------------------------------------------------------------------------
# Arrays as raw bytes (np.load of an untrusted .npy may unpickle; raw bytes cannot)
# ---------------------------------------------------------------------------------------------


def _save_arrays(capture: Capture, folder: str, names: Sequence[str], arrays: Sequence[np.ndarray]) -> list[dict]:
    out = []
    for i, (name, array) in enumerate(zip(names, arrays, strict=False)):
        array = np.ascontiguousarray(array)
        file = f"{folder}/{i}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}.bin"
        capture.add_bytes(file, array.tobytes())
        out.append({"name": name, "file": file, "dtype": dtype(array.dtype).name, "shape": list(array.shape)})
    return out


def _load_arrays(capture: Capture, key: str) -> list[np.ndarray]:
    records = capture.record.get(key)
    if not isinstance(records, list):
        raise PackError(f"{capture.path}: capture.json has no list {key!r}")
    arrays = []
    for item in records:
        if not isinstance(item, dict) or item.get("file") not in capture.record["files"]:
            raise PackError(f"{capture.path}: {key} entry {item!r} names no file of the pack")
        shape = item.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise PackError(f"{capture.path}: {key} entry {item['file']}: shape {shape!r} is not a list of sizes")
        try:
            np_dtype = dtype(item.get("dtype")).numpy
        except Exception:
            raise PackError(
                f"{capture.path}: {key} entry {item['file']}: unknown dtype {item.get('dtype')!r}"
            ) from None
        data = (capture.path / item["file"]).read_bytes()
        expected = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
        if len(data) != expected:
            raise PackError(
                f"{capture.path}: {item['file']} holds {len(data)} bytes; {shape} {item['dtype']} needs {expected}"
            )
        arrays.append(np.frombuffer(data, dtype=np_dtype).reshape(shape).copy())
    return arrays


# ---------------------------------------------------------------------------------------------
# Restoring a kernel from its saved Graph IR
# ---------------------------------------------------------------------------------------------


def _tensor_type(record: Any, where: str) -> TensorType:
    if not isinstance(record, dict) or not isinstance(record.get("dims"), list):
        raise PackError(f"{where}: expected {{dims: [...], dtype: ...}}, found {record!r}")
    dims = record["dims"]
    if not all((isinstance(d, str) and d.isidentifier()) or (isinstance(d, int) and d > 0) for d in dims):
        raise PackError(f"{where}: dims {dims!r} must be names or positive ints")
    try:
        return TensorType(tuple(dims), dtype(record.get("dtype")))
    except Exception:
        raise PackError(f"{where}: unknown dtype {record.get('dtype')!r}") from None


def restore_kernel(capture: Capture) -> tuple[Kernel, dict[str, int], dict[str, Any], bool]:
    """The captured kernel (its Graph IR as traced; no Python body), its shapes, schedule overrides
    and build flag."""
    path = capture.file("kernel.json")
    if path is None or capture.file("graph.json") is None:
        raise PackError(f"{capture.path}: holds no kernel.json and graph.json (the kernel a replay compiles)")
    try:
        info = json.loads(path.read_text())
    except ValueError as exc:
        raise PackError(f"{path}: not JSON ({exc})") from None
    name = info.get("name") if isinstance(info, dict) else None
    if not isinstance(name, str) or not name.isidentifier():
        raise PackError(f"{path}: 'name' must be an identifier, found {name!r}")
    params = tuple(
        (p.get("name"), _tensor_type(p, f"{path}: params[{i}]")) for i, p in enumerate(info.get("params") or [])
    )
    if not params or not all(isinstance(n, str) and n.isidentifier() for n, _ in params):
        raise PackError(f"{path}: 'params' must list the kernel's named tensors")
    shapes = info.get("shapes")
    if not isinstance(shapes, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shapes.values()
    ):
        raise PackError(f"{path}: 'shapes' must map dims to positive ints, found {shapes!r}")
    results = info.get("result")
    result = None
    if results is not None:
        types = tuple(_tensor_type(r, f"{path}: result[{i}]") for i, r in enumerate(results))
        result = types if info.get("result_is_tuple") else types[0]

    def body(*_):
        raise KernelError(
            f"kernel {name} was restored from a repro pack: it holds the Graph IR traced for shapes "
            f"{shapes}, not the Python body, so it compiles for those shapes only"
        )

    body.__name__ = body.__qualname__ = name
    kernel = Kernel.__new__(Kernel)
    kernel.fn = body
    kernel.name = name
    kernel.__name__ = name
    kernel.__doc__ = f"{name}, restored from {capture.path}"
    kernel.schedule_overrides = {}
    kernel.params = params
    kernel.result = result
    symbols: list[str] = []
    for _, t in params:
        symbols += [d for d in t.symbols if d not in symbols]
    kernel.symbols = tuple(symbols)
    kernel._graphs = {}
    kernel._traces = {_trace_key(shapes): _capture.load_ir(capture, "graph")}
    schedule = info.get("schedule") or {}
    if not isinstance(schedule, dict):
        raise PackError(f"{path}: 'schedule' must be a mapping, found {schedule!r}")
    return kernel, dict(shapes), schedule, bool(info.get("build", True))


# ---------------------------------------------------------------------------------------------
# Packs: a capture directory (plus replay.py) as one .tar.gz
# ---------------------------------------------------------------------------------------------


def _write_tarball(capture: Capture, out: Path) -> Path:
    """The capture's manifest and listed files (already checked or just written) as ``out``."""
    directory = capture.path
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            top = directory.name
            names = [_capture.MANIFEST, *sorted(capture.record["files"])]
            for name in names:
                info = tar.gettarinfo(str(directory / name), arcname=f"{top}/{name}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o755 if name == "replay.py" else 0o644
                with open(directory / name, "rb") as fh:
                    tar.addfile(info, fh)
        os.replace(tmp, out)  # never a half-written pack under the name asked for
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _add_replay_script(capture: Capture) -> None:
    path = capture.add_text("replay.py", REPLAY_SCRIPT)
    path.chmod(0o755)
    capture.save()


def pack_repro(what: Any, out: str | os.PathLike[str], *, inputs: Sequence[Any] | None = None, seed: int = 0) -> Path:
    """Bundle a crash capture (its directory, or an exception that has one) or a compiled kernel
    (with ``inputs``, or random ones for its shapes, and the outputs it gives for them here) into
    ``out`` (a ``.tar.gz`` with ``replay.py``). Returns ``out``."""
    from .compiler import CompiledKernel

    if isinstance(what, BaseException):
        found = _capture.capture_of(what)
        if found is None:
            raise PackError(f"pack_repro: the error {type(what).__name__} has no crash capture (capture was off?)")
        what = found.path
    with tempfile.TemporaryDirectory(prefix="tessera_pack_") as scratch:
        if isinstance(what, CompiledKernel):
            capture = pack_kernel(what, Path(scratch), inputs=inputs, seed=seed)
        elif isinstance(what, str | os.PathLike):
            source = Capture.open(Path(what).expanduser())  # checks every file before copying
            copy = Path(scratch) / source.path.name
            shutil.copytree(source.path, copy, symlinks=True)
            capture = Capture(copy, json.loads(json.dumps(source.record)))  # its own record: replay.py joins it
        else:
            raise TypeError(f"pack_repro takes a compiled kernel, a capture directory or an error, found {what!r}")
        _add_replay_script(capture)
        return _write_tarball(capture, Path(out))


def _random_inputs(kernel: Kernel, env: dict[str, int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for name, t in kernel.params:
        shape = tuple(env[d] if isinstance(d, str) else d for d in t.dims)
        if t.dtype.is_float:
            arrays.append(rng.standard_normal(shape).astype(np.float32).astype(t.dtype.numpy))
        else:
            arrays.append(rng.integers(-8, 8, shape).astype(t.dtype.numpy))
        del name
    return arrays


def pack_kernel(compiled, root: Path, *, inputs: Sequence[Any] | None = None, seed: int = 0) -> Capture:
    """A capture-format directory under ``root`` of a kernel that works: its Graph IR, config and
    shapes, sample inputs and the outputs it gives here, and (CPU) its tvm-ffi library."""
    kernel = compiled.kernel
    if inputs is None:
        missing = [s for s in kernel.symbols if s not in compiled.shapes]
        if missing:
            raise ArgumentError(
                f"pack_repro: {kernel.name} has unbound dims {', '.join(missing)}; compile with shapes= or pass inputs="
            )
        inputs = _random_inputs(kernel, compiled.shapes, seed)
    outputs = compiled(*inputs)
    outputs = list(outputs) if isinstance(outputs, tuple | list) else [outputs]
    instance = compiled._ran or compiled._instance
    env = dict(instance.env)
    capture = Capture.create(root, "kernel", kernel.name, None, prune=False)
    _add_kernel(
        capture, kernel, compiled.config, env, compiled.overrides, compiled.build, kernel._traces[_trace_key(env)]
    )
    names = [n for n, _ in kernel.params]
    capture.update(
        inputs=_save_arrays(capture, "inputs", names, [_as_numpy(a) for a in inputs]),
        outputs=_save_arrays(
            capture, "outputs", [f"out{i}" for i in range(len(outputs))], [_as_numpy(o) for o in outputs]
        ),
    )
    try:
        library = compiled.build_module(Path(root) / "module", shapes=[env])
    except TesseraError as exc:  # targets without tvm-ffi libraries: the pack replays from the graph only
        capture.update(binaries_note=f"no prebuilt library: {exc}")
    else:
        file = f"binaries/{library.name}"
        capture.add_bytes(file, library.read_bytes())
        capture.update(binaries={"library": file, "entry": kernel.name})
    capture.save()
    return capture


def _check_member(member: tarfile.TarInfo, pack: Path, top: str | None) -> str:
    name = member.name
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise PackError(f"{pack}: member {name!r} has an absolute path; refused")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts or "\\" in name:
        raise PackError(f"{pack}: member {name!r} climbs out of the pack ('..'); refused")
    if member.issym() or member.islnk():
        raise PackError(f"{pack}: member {name!r} is a link (to {member.linkname!r}); refused")
    if not (member.isfile() or member.isdir()):
        raise PackError(f"{pack}: member {name!r} is a device, FIFO or other special file; refused")
    if member.size > MAX_MEMBER_BYTES:
        raise PackError(
            f"{pack}: member {name!r} is {member.size} bytes, over the limit of {MAX_MEMBER_BYTES}; refused"
        )
    if not parts or (top is not None and parts[0] != top):
        raise PackError(f"{pack}: member {name!r} is outside the pack's one top-level directory {top!r}; refused")
    return "/".join(parts)


def open_pack(path: str | os.PathLike[str], workdir: str | os.PathLike[str] | None = None) -> Capture:
    """A capture directory or a ``.tar.gz`` pack, checked (for a tarball: every member checked before
    anything is written, then unpacked into ``workdir`` or a new temporary directory); every file
    must be listed in ``capture.json`` with its SHA-256."""
    path = Path(path).expanduser()
    if path.is_dir():
        capture = _open_checked(path)
        return capture
    if not path.is_file():
        raise PackError(f"{path}: no such pack or capture directory")
    try:
        tar = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError) as exc:
        raise PackError(f"{path}: not a tar archive ({exc}); expected a .tar.gz made by `tessera pack-repro`") from None
    with tar:
        try:
            members = []
            top = None
            total = 0
            for member in tar:
                if len(members) >= MAX_MEMBERS:
                    raise PackError(f"{path}: more than {MAX_MEMBERS} members; refused")
                name = _check_member(member, path, top)
                top = top or name.split("/")[0]
                total += member.size
                if total > MAX_TOTAL_BYTES:
                    raise PackError(f"{path}: members add up to more than {MAX_TOTAL_BYTES} bytes; refused")
                members.append((member, name))
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise PackError(f"{path}: damaged archive ({exc})") from None
        if top is None:
            raise PackError(f"{path}: empty archive")
        dest = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="tessera_replay_"))
        root = dest / top
        if root.exists():
            raise PackError(f"{root}: already exists; unpack into an empty directory")
        try:
            _extract(tar, members, dest, path)
            return _open_checked(root)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)  # a refused pack leaves nothing behind
            raise


def _extract(tar: tarfile.TarFile, members, dest: Path, path: Path) -> None:
    """Write the checked members under ``dest`` (plain files, mode 0644, at most their header's size)."""
    for member, name in members:
        target = dest / name
        if member.isdir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        source = tar.extractfile(member)
        if source is None:
            raise PackError(f"{path}: member {name!r} has no data")
        with source, open(target, "wb") as fh:
            shutil.copyfileobj(_Limited(source, member.size), fh)
        target.chmod(0o644)


class _Limited(io.RawIOBase):
    """At most ``limit`` bytes of ``raw`` (a member can never write more than its header says)."""

    def __init__(self, raw, limit: int) -> None:
        self.raw, self.left = raw, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.left <= 0:
            return 0
        data = self.raw.read(min(len(buffer), self.left))
        buffer[: len(data)] = data
        self.left -= len(data)
        return len(data)


def _open_checked(root: Path) -> Capture:
    try:
        capture = Capture.open(root)
    except TesseraError as exc:
        raise PackError(str(exc)) from None
    listed = set(capture.record["files"]) | {_capture.MANIFEST}
    for file in root.rglob("*"):
        if file.is_symlink():
            raise PackError(f"{root}: {file.relative_to(root)} is a symbolic link; refused")
        if file.is_file() and file.relative_to(root).as_posix() not in listed:
            raise PackError(f"{root}: {file.relative_to(root)} is not listed in {_capture.MANIFEST}; refused")
    return capture


def __getattr__(name: str):
    # Replaying is tessera.repro_replay's (it reads packs with this module); `from tessera.repro import main`
    # is what the replay.py of every pack runs, so the names stay here too.
    if name in ("ReplayResult", "main", "normalized_message", "printable", "replay"):
        from . import repro_replay as _replay

        return getattr(_replay, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
