"""Run a ``tt.plan.json`` on the host: compile its kernels against the tt-metal emulator and execute.

:func:`run_plan` validates the plan (:func:`validate_plan`: JSON schema + cross-field rules such
as the L1 budget), builds the emulator runner once (cached by content hash) and every kernel as its
own shared object (``g++ -O2``, cached by source + args hash), writes the inputs to emulated DRAM
in tile layout (padded to 32x32 with zeros, bfloat16 rounded to nearest even), runs all cores and
returns the outputs (padding dropped) with the emulator's counters::

    from tessera_tvm.target.tt.emulate import run_plan
    result = run_plan("tests/tt/plans/gemm_single_core.json", Path("tests/tt/kernels"), {"A": a, "B": b})
    c = result["C"]                      # float32 array of the buffer's logical shape
    result.counters["cores"][0]["cbs"]   # per-CB pages pushed/popped, per-kernel NoC traffic, ...

Every failure is a :class:`~tessera_tvm.errors.TesseraError` naming the plan, and where it applies
the kernel, the core and the circular buffer: :class:`PlanError` (invalid plan or inputs),
:class:`KernelCompileError` (g++ rejected a kernel), :class:`EmulatorError` (a kernel misused the
API, deadlocked, stalled or crashed; or, with ``strict=True``, CB pushes != pops or an output tile
not written exactly once).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from tessera_tvm.errors import TesseraError, ToolchainError, ToolchainMissingError

from ..toolchain import file_lock
from . import (
    DATA_FORMATS,
    DTYPE_TO_FORMAT,
    EMULATOR_INCLUDE_DIR,
    EMULATOR_SRC_DIR,
    PLAN_SCHEMA_PATH,
    STUB_INCLUDE_DIR,
    TT_METAL_VERSION,
    as_2d_shape,
    bf16_bits_to_float,
    float_to_bf16_bits,
    padded_shape,
    tile_bytes,
    tilize,
    untilize,
)
from .arch import TTArch, UnknownArchError, get_arch

__all__ = [
    "PlanError",
    "KernelCompileError",
    "EmulatorError",
    "EmulatorResult",
    "load_plan",
    "validate_plan",
    "run_plan",
    "build_runner",
    "emulator_cache_dir",
    "ROLES",
    "TENSOR_ACCESSOR_INTERLEAVED_DRAM_ARGS",
]

ROLES = ("reader", "compute", "writer")
_ROLE_INDEX = {r: i for i, r in enumerate(ROLES)}
_FORMAT_CODES = {"Float32": 0, "Float16_b": 5}  # tt::DataFormat values
_DRAM_BASE = 0x1000  # first DRAM byte the emulator's allocator hands out in every bank
_CXX_FLAGS = ["-std=c++17", "-O2"]


class PlanError(TesseraError, ValueError):
    """The plan (or the inputs given for it) is invalid; the message names the plan and the field."""

    def __init__(self, plan: str, errors: list[str]):
        self.plan = plan
        self.errors = errors
        shown = errors[:12]
        more = f"\n  ... and {len(errors) - len(shown)} more" if len(errors) > len(shown) else ""
        super().__init__(f"invalid tt plan {plan}:\n  " + "\n  ".join(shown) + more)


class KernelCompileError(ToolchainError):
    """g++ rejected a kernel (or the emulator runner) when building it for the emulator."""


class EmulatorError(TesseraError, RuntimeError):
    """The emulated program failed: API misuse, deadlock, stall, crash, or a violated invariant."""

    def __init__(self, plan: str, message: str, counters: dict | None = None):
        self.plan = plan
        self.counters = counters
        super().__init__(f"tt emulator, plan {plan}: {message}")


class EmulatorResult(dict):
    """Output buffers by name (float32 arrays of the buffers' logical shapes) plus ``counters``."""

    def __init__(self, outputs: Mapping[str, np.ndarray], counters: dict, plan: str):
        super().__init__(outputs)
        self.counters = counters
        self.plan = plan

    def cb_balance(self) -> list[dict]:
        """One row per (core, CB): pages pushed and popped (equal in a well-formed program)."""
        rows = []
        for core in self.counters.get("cores", []):
            for cb in core["cbs"]:
                rows.append(
                    {
                        "core": tuple(core["core"]),
                        "cb": cb["id"],
                        "pushed": cb["pages_pushed"],
                        "popped": cb["pages_popped"],
                    }
                )
        return rows

    def page_writes(self, buffer: str) -> list[int]:
        return list(self.counters["buffers"][buffer]["page_writes"])

    def l1_bytes(self) -> dict[tuple[int, int], int]:
        return {tuple(c["core"]): c["l1_bytes"] for c in self.counters.get("cores", [])}


# ---------------------------------------------------------------------------------------------
# JSON schema: checked by the jsonschema library, its errors worded with the plan's JSON paths
# ---------------------------------------------------------------------------------------------


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(error) -> str:
    """One jsonschema error as ``$.path: what was expected, what was found``."""
    kind, expected, found = error.validator, error.validator_value, error.instance
    if kind == "required":
        what = ", ".join(repr(k) for k in expected if k not in found)
        text = f"missing required key {what}"
    elif kind == "additionalProperties":
        allowed = error.schema.get("properties", {})
        extra = ", ".join(repr(k) for k in found if k not in allowed)
        text = f"unexpected key {extra} (allowed: {', '.join(sorted(allowed)) or 'none'})"
    elif kind == "enum":
        text = f"expected one of {json.dumps(expected)}, got {_short(found)}"
    elif kind == "const":
        text = f"expected {json.dumps(expected)}, got {_short(found)}"
    elif kind == "type":
        types = expected if isinstance(expected, list) else [expected]
        text = f"expected {' or '.join(types)}, got {type(found).__name__} {_short(found)}"
    elif kind == "maximum":
        text = f"{found} is above the maximum {expected}"
    elif kind == "minimum":
        text = f"{found} is below the minimum {expected}"
    elif kind == "pattern":
        text = f"{found!r} does not match {expected!r}"
    elif kind in ("oneOf", "anyOf"):
        matched = "more than one" if kind == "oneOf" and not error.context else "none"
        text = f"{_short(found)} matches {matched} of the allowed forms ({kind})"
    else:
        text = error.message
    return f"{error.json_path}: {text}"


_validator = None  # the plan schema's jsonschema validator, built on first use


def _schema_errors(plan: Any) -> list[str]:
    import jsonschema

    global _validator
    if _validator is None:
        _validator = jsonschema.Draft202012Validator(plan_schema())
    errors = sorted(_validator.iter_errors(plan), key=lambda e: [str(p) for p in e.absolute_path])
    return [_describe(e) for e in errors]


_schema_cache: dict | None = None


def plan_schema() -> dict:
    global _schema_cache
    if _schema_cache is None:
        _schema_cache = json.loads(PLAN_SCHEMA_PATH.read_text())
    return _schema_cache


# ---------------------------------------------------------------------------------------------
# Plan loading and validation
# ---------------------------------------------------------------------------------------------


def load_plan(path: str | os.PathLike) -> dict:
    """Read a plan file; JSON syntax errors become :class:`PlanError` naming the file and line."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise PlanError(str(p), ["file not found"]) from None
    except json.JSONDecodeError as e:
        raise PlanError(str(p), [f"line {e.lineno} column {e.colno}: {e.msg}"]) from None


def _plan_label(plan: Any, source: str | os.PathLike | None) -> str:
    name = plan.get("name") if isinstance(plan, dict) else None
    if source is not None:
        return f"'{name}' ({source})" if name else str(source)
    return f"'{name}'" if name else "<unnamed>"


def validate_plan(
    plan: dict, *, source: str | os.PathLike | None = None, kernel_dir: str | os.PathLike | None = None
) -> TTArch:
    """Check ``plan`` against ``plan.schema.json`` and the cross-field rules; return its arch row.

    Cross-field rules: unique buffer names and CB ids (CB ids below the arch's CB count), page
    sizes equal to the tile size of the format, padded shapes equal to the shape rounded up to
    32x32 tiles, the circular buffers fit the arch's L1 budget per core, cores unique and inside
    both the plan grid and the arch's worker grid, buffer references resolve, runtime args per
    kernel within the arch limit, every core gives runtime args for every kernel, and (when cores
    carry ``tiles``) the schedule assigns every output tile exactly once. With ``kernel_dir`` the
    kernel sources must exist. Raises :class:`PlanError` listing every violation found.
    """
    label = _plan_label(plan, source)
    errors = _schema_errors(plan)
    if errors:
        raise PlanError(label, errors)
    try:
        arch = get_arch(plan["arch"])
    except UnknownArchError as e:
        raise PlanError(label, [f"$.arch: {e}"]) from None

    buffers = {}
    for i, buf in enumerate(plan["buffers"]):
        where = f"$.buffers[{i}] ({buf['name']})"
        if buf["name"] in buffers:
            errors.append(f"{where}: duplicate buffer name {buf['name']!r}")
        buffers[buf["name"]] = buf
        want_pad = list(padded_shape(buf["shape"]))
        if list(buf["padded_shape"]) != want_pad:
            errors.append(
                f"{where}.padded_shape: expected {want_pad} for shape {buf['shape']}, got {buf['padded_shape']}"
            )
        want_page = tile_bytes(DTYPE_TO_FORMAT[buf["dtype"]])
        if buf["page_size"] != want_page:
            errors.append(f"{where}.page_size: expected {want_page} (one {buf['dtype']} tile), got {buf['page_size']}")

    cb_ids: set[int] = set()
    l1 = 0
    for i, cb in enumerate(plan["circular_buffers"]):
        where = f"$.circular_buffers[{i}] (CB {cb['id']})"
        if cb["id"] in cb_ids:
            errors.append(f"{where}: duplicate CB id {cb['id']}")
        cb_ids.add(cb["id"])
        if cb["id"] >= arch.num_cbs:
            errors.append(f"{where}: CB id {cb['id']} is over the limit: arch {arch.name!r} has {arch.num_cbs} CB ids")
        want_page = tile_bytes(cb["data_format"])
        if cb["page_size"] != want_page:
            errors.append(
                f"{where}.page_size: expected {want_page} (one {cb['data_format']} tile), got {cb['page_size']}"
            )
        l1 += cb["page_size"] * cb["num_pages"]
    if l1 > arch.l1_budget_bytes:
        detail = ", ".join(f"CB {cb['id']}: {cb['num_pages']} x {cb['page_size']} B" for cb in plan["circular_buffers"])
        errors.append(
            f"$.circular_buffers: L1 over budget: the circular buffers need {l1} bytes per core but arch "
            f"{arch.name!r} allows {arch.l1_budget_bytes} ({detail})"
        )

    gx, gy = plan["grid"]
    if gx < 1 or gy < 1 or gx > arch.worker_grid_x or gy > arch.worker_grid_y:
        errors.append(
            f"$.grid: {plan['grid']} does not fit arch {arch.name!r}'s {arch.worker_grid_x}x{arch.worker_grid_y} worker grid"
        )

    def check_refs(args: list, key: str, where: str) -> None:
        for j, a in enumerate(args):
            if isinstance(a, dict) and a[key] not in buffers:
                errors.append(f"{where}[{j}]: unknown buffer {a[key]!r} (buffers: {', '.join(buffers)})")

    kernels = plan["kernels"]
    for role, k in kernels.items():
        check_refs(k.get("compile_time_args", []), "tensor_accessor", f"$.kernels.{role}.compile_time_args")
        if kernel_dir is not None and not (Path(kernel_dir) / k["source"]).is_file():
            errors.append(f"$.kernels.{role}.source: {k['source']!r} not found in {kernel_dir}")

    seen_cores: set[tuple[int, int]] = set()
    assignments: list[tuple[int, int, tuple[int, int]]] = []
    for i, core in enumerate(plan["cores"]):
        xy = tuple(core["core"])
        where = f"$.cores[{i}] (core {xy})"
        if xy in seen_cores:
            errors.append(f"{where}: core listed twice")
        seen_cores.add(xy)
        if not (xy[0] < gx and xy[1] < gy):
            errors.append(f"{where}: outside the plan grid {plan['grid']}")
        if not arch.contains_core(*xy):
            errors.append(
                f"{where}: outside arch {arch.name!r}'s {arch.worker_grid_x}x{arch.worker_grid_y} worker grid"
            )
        rt = core["runtime_args"]
        for role in kernels:
            if role not in rt:
                errors.append(f"{where}.runtime_args: no {role!r} args (give [] for none)")
        for role, args in rt.items():
            if role not in kernels:
                errors.append(f"{where}.runtime_args.{role}: the plan has no {role} kernel")
            if len(args) > arch.max_runtime_args:
                errors.append(
                    f"{where}.runtime_args.{role}: {len(args)} runtime args, arch allows {arch.max_runtime_args}"
                )
            check_refs(args, "buffer_address", f"{where}.runtime_args.{role}")
        if "tiles" in core:
            assignments.append((core["tiles"][0], core["tiles"][1], xy))

    schedule = plan.get("schedule")
    if schedule is not None:
        total = schedule["total_tiles"]
        if "output" in schedule:
            out = buffers.get(schedule["output"])
            if out is None:
                errors.append(f"$.schedule.output: unknown buffer {schedule['output']!r}")
            else:
                pr, pc = out["padded_shape"]
                if total != (pr // 32) * (pc // 32):
                    errors.append(
                        f"$.schedule.total_tiles: {total} but buffer {out['name']!r} has {(pr // 32) * (pc // 32)} tiles"
                    )
        if len(assignments) != len(plan["cores"]):
            errors.append("$.cores: with a schedule every core needs 'tiles': [start_tile, num_tiles]")
        owner: dict[int, tuple[int, int]] = {}
        for start, count, xy in assignments:
            for t in range(start, start + count):
                if t >= total:
                    errors.append(f"core {xy}: tile {t} is beyond the schedule's {total} tiles")
                    break
                if t in owner:
                    errors.append(f"core {xy}: tile {t} is also assigned to core {owner[t]}")
                    break
                owner[t] = xy
        missing = sorted(set(range(total)) - set(owner))
        if missing:
            errors.append(f"$.schedule: tiles {_ranges(missing)} are assigned to no core")

    if errors:
        raise PlanError(label, errors)
    return arch


def _ranges(values: list[int]) -> str:
    out, start, prev = [], None, None
    for v in values:
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = v
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)


# ---------------------------------------------------------------------------------------------
# Building the runner and the kernels (cached by content hash)
# ---------------------------------------------------------------------------------------------

_build_lock = threading.Lock()
_runner_memo: dict[str, Path] = {}


def emulator_cache_dir() -> Path:
    """``$TESSERA_TT_EMU_CACHE``, else ``$XDG_CACHE_HOME/tessera/tt_emu``, else ``~/.cache/...``."""
    env = os.environ.get("TESSERA_TT_EMU_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tessera" / "tt_emu"


def _cxx() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if not cxx:
        raise ToolchainMissingError(["g++"], "", "the tt emulator needs g++ on PATH (or $CXX)")
    return cxx


_cxx_version_memo: dict[str, str] = {}


def _cxx_version(cxx: str) -> str:
    if cxx not in _cxx_version_memo:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
        _cxx_version_memo[cxx] = out.stdout.splitlines()[0] if out.stdout else cxx
    return _cxx_version_memo[cxx]


def _tree_digest(*roots: Path) -> str:
    h = hashlib.sha256()
    for root in roots:
        for f in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in {".h", ".hpp", ".cpp"}):
            h.update(str(f.relative_to(root.parent)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _compile(cmd: list[str], out: Path, what: str) -> None:
    tmp = out.with_name(out.name + f".tmp{os.getpid()}.{threading.get_ident()}")
    proc = subprocess.run([*cmd, "-o", str(tmp)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise KernelCompileError(cmd, proc.stderr, f"{what}: g++ failed:\n{proc.stderr.strip()}")
    os.replace(tmp, out)


def build_runner(cache_dir: Path | None = None) -> Path:
    """Build (once per content hash) and return the emulator runner executable."""
    cache = Path(cache_dir) if cache_dir else emulator_cache_dir()
    cxx = _cxx()
    key = hashlib.sha256(
        "|".join(
            [_tree_digest(EMULATOR_INCLUDE_DIR, EMULATOR_SRC_DIR, STUB_INCLUDE_DIR), _cxx_version(cxx), *_CXX_FLAGS]
        ).encode()
    ).hexdigest()[:20]
    memo_key = f"{cache}:{key}"
    with _build_lock:
        if memo_key in _runner_memo and _runner_memo[memo_key].exists():
            return _runner_memo[memo_key]
        out = cache / f"runner-{key}" / "ttemu_runner"
        if not out.exists():
            with file_lock(cache / "runner.lock"):
                if not out.exists():
                    out.parent.mkdir(parents=True, exist_ok=True)
                    sources = [str(EMULATOR_SRC_DIR / "runtime.cpp"), str(EMULATOR_SRC_DIR / "runner.cpp")]
                    cmd = [
                        cxx,
                        *_CXX_FLAGS,
                        "-Wall",
                        "-I",
                        str(EMULATOR_INCLUDE_DIR),
                        "-I",
                        str(EMULATOR_SRC_DIR),
                        *sources,
                        "-rdynamic",
                        "-pthread",
                        "-ldl",
                    ]
                    _compile(cmd, out, "building the tt emulator runner")
        _runner_memo[memo_key] = out
        return out


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def _kernel_digest(source: Path) -> str:
    """Hash of a kernel source and the headers it includes from its own directory (recursively)."""
    h = hashlib.sha256()
    seen: set[Path] = set()
    stack = [source]
    while stack:
        f = stack.pop()
        if f in seen or not f.is_file():
            continue
        seen.add(f)
        text = f.read_bytes()
        h.update(str(f.name).encode())
        h.update(text)
        for inc in _LOCAL_INCLUDE.findall(text.decode(errors="replace")):
            stack.append((f.parent / inc).resolve())
    return h.hexdigest()


def _build_kernel(
    source: Path, role: str, ct_args: list[int], defines: dict[str, str], cache: Path, plan_label: str
) -> Path:
    cxx = _cxx()
    include_digest = _emulator_include_digest()
    key = hashlib.sha256(
        json.dumps(
            [
                _kernel_digest(source),
                include_digest,
                role == "compute",
                ct_args,
                sorted(defines.items()),
                _cxx_version(cxx),
                _CXX_FLAGS,
            ]
        ).encode()
    ).hexdigest()[:24]
    out = cache / "kernels" / f"{source.stem}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    wrapper = out.with_suffix(".cpp")
    tmp = wrapper.with_name(wrapper.name + f".tmp{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(f"// emulator wrapper for {source}\n#include {json.dumps(str(source))}\nTT_EMU_DEFINE_ENTRY\n")
    os.replace(tmp, wrapper)  # concurrent builders write identical text; never a torn file
    cmd = [
        cxx,
        *_CXX_FLAGS,
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-I",
        str(EMULATOR_INCLUDE_DIR),
        "-I",
        str(source.parent),
    ]
    if ct_args:
        cmd.append("-DKERNEL_COMPILE_TIME_ARGS=" + ",".join(str(a) for a in ct_args))
    cmd += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    cmd.append(str(wrapper))
    _compile(cmd, out, f"plan {plan_label}: {role} kernel '{source.name}'")
    return out


_include_digest_memo: list[str] = []


def _emulator_include_digest() -> str:
    if not _include_digest_memo:
        _include_digest_memo.append(_tree_digest(EMULATOR_INCLUDE_DIR, STUB_INCLUDE_DIR))
    return _include_digest_memo[0]


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


def _allocate_dram(plan: dict, arch: TTArch) -> dict[str, dict]:
    """Interleaved DRAM allocation: each buffer gets the same address in every bank."""
    out = {}
    addr = _DRAM_BASE
    for buf in plan["buffers"]:
        pr, pc = buf["padded_shape"]
        num_pages = (pr // 32) * (pc // 32)
        aligned = -(-buf["page_size"] // arch.dram_alignment) * arch.dram_alignment
        pages_per_bank = -(-num_pages // arch.dram_banks)
        out[buf["name"]] = {"address": addr, "num_pages": num_pages, "page_size": buf["page_size"], "buffer": buf}
        addr += pages_per_bank * aligned
        addr = -(-addr // arch.dram_alignment) * arch.dram_alignment
    if addr > arch.dram_bank_bytes:
        raise PlanError(
            plan.get("name", "?"), [f"$.buffers: need {addr} bytes per DRAM bank, arch has {arch.dram_bank_bytes}"]
        )
    return out


#: What ``TensorAccessorArgs(buffer).append_to(args)`` appends for an interleaved DRAM buffer in the
#: pinned release: one word, the ``ArgsConfig`` bits (``IsDram`` = 2). Kernels never hard-code this
#: count (they chain ``next_compile_time_args_offset()``); plans name it symbolically.
TENSOR_ACCESSOR_INTERLEAVED_DRAM_ARGS: tuple[int, ...] = (2,)


def _resolve_ct_args(args: list, dram: dict[str, dict]) -> list[int]:
    out: list[int] = []
    for a in args:
        if isinstance(a, dict):
            out.extend(TENSOR_ACCESSOR_INTERLEAVED_DRAM_ARGS)
        else:
            out.append(int(a))
    return out


def _resolve_rt_args(args: list, dram: dict[str, dict]) -> list[int]:
    return [dram[a["buffer_address"]]["address"] if isinstance(a, dict) else int(a) for a in args]


def _encode_input(buf: dict, value: np.ndarray, label: str) -> bytes:
    arr = np.asarray(value)
    if tuple(arr.shape) != tuple(buf["shape"]):
        raise PlanError(label, [f"input {buf['name']!r}: expected shape {tuple(buf['shape'])}, got {tuple(arr.shape)}"])
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise PlanError(label, [f"input {buf['name']!r}: expected a numeric array, got dtype {arr.dtype}"])
    flat = tilize(arr.astype(np.float32))
    if buf["dtype"] == "bfloat16":
        return float_to_bf16_bits(flat).tobytes()
    return flat.astype(np.float32).tobytes()


def _decode_output(buf: dict, data: bytes) -> np.ndarray:
    if buf["dtype"] == "bfloat16":
        flat = bf16_bits_to_float(np.frombuffer(data, dtype=np.uint16))
    else:
        flat = np.frombuffer(data, dtype=np.float32)
    return untilize(flat, buf["shape"]).astype(np.float32)


def run_plan(
    plan: dict | str | os.PathLike,
    kernel_dir: str | os.PathLike,
    inputs: Mapping[str, np.ndarray],
    *,
    strict: bool = True,
    timeout_s: float = 120.0,
    stall_timeout_s: float = 10.0,
    max_parallel_cores: int | None = None,
    dst_tiles: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    keep_dir: str | os.PathLike | None = None,
) -> EmulatorResult:
    """Validate ``plan``, build its kernels for the emulator, run it on ``inputs`` and return outputs.

    ``plan`` is a plan dict or the path of a ``tt.plan.json``; kernel sources are looked up in
    ``kernel_dir``. ``inputs`` maps every ``role: input`` buffer to an array of its logical shape
    (values are rounded to the buffer dtype). Returns an :class:`EmulatorResult`: the ``output``
    buffers as float32 arrays (padding removed) and ``.counters``.

    ``strict`` (default) also fails when a core ends with CB pages pushed != popped or an output
    tile was not written exactly once. ``stall_timeout_s`` bounds how long the kernels may make
    no API call (a spinning kernel); deadlocks on CBs are detected as soon as they happen.
    ``dst_tiles`` overrides the DST capacity (default: the arch's, 16 tiles or 8 with
    ``fp32_dest_acc_en``). ``keep_dir`` keeps the run spec, DRAM images and counters there.
    """
    source = None
    if not isinstance(plan, dict):
        source = str(plan)
        plan = load_plan(plan)
    label = _plan_label(plan, source)
    kdir = Path(kernel_dir).resolve()
    arch = validate_plan(plan, source=source, kernel_dir=kdir)

    buffers = {b["name"]: b for b in plan["buffers"]}
    expected = {n for n, b in buffers.items() if b["role"] == "input"}
    missing = sorted(expected - set(inputs))
    unknown = sorted(set(inputs) - expected)
    if missing or unknown:
        errs = [f"no value given for input buffer {n!r}" for n in missing]
        errs += [f"{n!r} is not an input buffer of the plan (inputs: {', '.join(sorted(expected))})" for n in unknown]
        raise PlanError(label, errs)

    cache = Path(cache_dir) if cache_dir else emulator_cache_dir()
    runner = build_runner(cache)
    dram = _allocate_dram(plan, arch)

    # Build the kernels (in parallel; each is its own translation unit / shared object).
    jobs = {}
    with ThreadPoolExecutor(max_workers=max(1, min(len(plan["kernels"]), os.cpu_count() or 1))) as pool:
        for role, k in plan["kernels"].items():
            jobs[role] = pool.submit(
                _build_kernel,
                (kdir / k["source"]).resolve(),
                role,
                _resolve_ct_args(k.get("compile_time_args", []), dram),
                dict(k.get("defines", {})),
                cache,
                label,
            )
        sos = {role: f.result() for role, f in jobs.items()}

    compute = plan["kernels"].get("compute", {})
    fp32_acc = bool(compute.get("fp32_dest_acc_en", False))
    n_cores = len(plan["cores"])
    parallel = max_parallel_cores or max(1, min(n_cores, 2 * (os.cpu_count() or 1)))

    work = Path(keep_dir) if keep_dir else Path(tempfile.mkdtemp(prefix="ttemu-run-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        lines = [
            "TTEMU 1",
            f"name {plan['name']}",
            f"arch {arch.name}",
            f"dram_banks {arch.dram_banks}",
            f"dram_alignment {arch.dram_alignment}",
            f"l1_alignment {arch.l1_alignment}",
            f"l1_budget {arch.l1_budget_bytes}",
            f"dst_tiles {dst_tiles or arch.dst_tiles(fp32_acc)}",
            f"fp32_dest_acc {int(fp32_acc)}",
            f"stall_timeout_ms {int(stall_timeout_s * 1000)}",
            f"max_parallel_cores {parallel}",
            f"counters {work / 'counters.json'}",
        ]
        for cb in sorted(plan["circular_buffers"], key=lambda c: c["id"]):
            lines.append(f"cb {cb['id']} {cb['page_size']} {cb['num_pages']} {_FORMAT_CODES[cb['data_format']]}")
        for name, d in dram.items():
            lines.append(f"buffer {name} {d['address']} {d['page_size']} {d['num_pages']}")
            buf = d["buffer"]
            if buf["role"] == "input":
                path = work / f"in_{name}.bin"
                path.write_bytes(_encode_input(buf, inputs[name], label))
                lines.append(f"buffer_input {name} {path}")
            if buf["role"] == "output":
                lines.append(f"buffer_output {name} {work / f'out_{name}.bin'}")
        for role, k in plan["kernels"].items():
            lines.append(f"kernel {_ROLE_INDEX[role]} {k['source']}")
            lines.append(f"kernel_so {_ROLE_INDEX[role]} {sos[role]}")
        for core in plan["cores"]:
            lines.append(f"core {core['core'][0]} {core['core'][1]}")
            for role, args in core["runtime_args"].items():
                vals = _resolve_rt_args(args, dram)
                lines.append(f"args {_ROLE_INDEX[role]} {len(vals)} " + " ".join(str(v) for v in vals))
        lines.append("end")
        spec = work / "run.spec"
        spec.write_text("\n".join(lines) + "\n")

        try:
            proc = subprocess.run(
                [str(runner), str(spec)], capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            raise EmulatorError(label, f"the emulator did not finish within {timeout_s} s") from None
        counters_path = work / "counters.json"
        counters = json.loads(counters_path.read_text()) if counters_path.exists() else None
        if proc.returncode != 0 or counters is None or counters.get("status") != "ok":
            if counters is not None and counters.get("error"):
                kind = "stalled: " if counters.get("status") == "stalled" else ""
                raise EmulatorError(label, kind + counters["error"], counters)
            detail = (proc.stderr or proc.stdout).strip()
            sig = f" (signal {-proc.returncode})" if proc.returncode < 0 else f" (exit status {proc.returncode})"
            raise EmulatorError(label, f"the emulator crashed{sig}: {detail}", counters)

        outputs = {}
        for name, d in dram.items():
            if d["buffer"]["role"] == "output":
                outputs[name] = _decode_output(d["buffer"], (work / f"out_{name}.bin").read_bytes())
        result = EmulatorResult(outputs, counters, label)
        if strict:
            _check_invariants(result, plan, label)
        return result
    finally:
        if not keep_dir:
            shutil.rmtree(work, ignore_errors=True)


def _check_invariants(result: EmulatorResult, plan: dict, label: str) -> None:
    problems = []
    for row in result.cb_balance():
        if row["pushed"] != row["popped"]:
            problems.append(
                f"core {row['core']} CB {row['cb']}: {row['pushed']} page(s) pushed but {row['popped']} popped at program end"
            )
    for buf in plan["buffers"]:
        if buf["role"] != "output":
            continue
        writes = result.page_writes(buf["name"])
        never = [i for i, w in enumerate(writes) if w == 0]
        multi = [i for i, w in enumerate(writes) if w > 1]
        if never:
            problems.append(f"output {buf['name']!r}: tiles {_ranges(never)} were never written")
        if multi:
            problems.append(f"output {buf['name']!r}: tiles {_ranges(multi)} were written more than once")
    if problems:
        raise EmulatorError(label, "; ".join(problems), result.counters)


# Re-exported for callers that only import this module.
__all__ += ["TT_METAL_VERSION", "DATA_FORMATS", "as_2d_shape"]
