"""Running a validated ``tt.plan.json`` in the tt emulator: :func:`run_plan` and its result.

:func:`run_plan` loads and validates the plan (:mod:`.emulate_plan`), builds the runner and the
kernels (:mod:`.emulate_build`), allocates the buffers in interleaved emulated DRAM, writes the inputs
in tile layout and a run specification, runs the emulator runner on it and decodes the outputs into
an :class:`EmulatorResult` with the emulator's counters. A failed run (API misuse, deadlock, stall,
crash, timeout, or with ``strict=True`` CB pushes != pops or an output tile not written exactly once)
raises :class:`EmulatorError`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tessera_tvm.errors import TesseraError

from . import (
    bf16_bits_to_float,
    f16_bits_to_float,
    float_to_bf16_bits,
    float_to_f16_bits,
    format_ranges,
    tilize,
    untilize,
)
from .arch import TTArch
from .emulate_build import _build_kernel, build_runner, emulator_cache_dir
from .emulate_plan import PlanError, _plan_label, load_plan, validate_plan

__all__ = ["EmulatorError", "EmulatorResult", "run_plan", "ROLES", "TENSOR_ACCESSOR_INTERLEAVED_DRAM_ARGS"]

ROLES = ("reader", "compute", "writer")
_ROLE_INDEX = {r: i for i, r in enumerate(ROLES)}
_FORMAT_CODES = {"Float32": 0, "Float16": 1, "Float16_b": 5}  # tt::DataFormat values
_DRAM_BASE = 0x1000  # first DRAM byte the emulator's allocator hands out in every bank


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
    if buf["dtype"] == "float16":  # rounded once from the given values (no detour through float32)
        return float_to_f16_bits(tilize(arr)).tobytes()
    flat = tilize(arr.astype(np.float32))
    if buf["dtype"] == "bfloat16":
        return float_to_bf16_bits(flat).tobytes()
    return flat.astype(np.float32).tobytes()


def _decode_output(buf: dict, data: bytes) -> np.ndarray:
    if buf["dtype"] == "bfloat16":
        flat = bf16_bits_to_float(np.frombuffer(data, dtype=np.uint16))
    elif buf["dtype"] == "float16":
        flat = f16_bits_to_float(np.frombuffer(data, dtype=np.uint16))
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
            problems.append(f"output {buf['name']!r}: tiles {format_ranges(never)} were never written")
        if multi:
            problems.append(f"output {buf['name']!r}: tiles {format_ranges(multi)} were written more than once")
    if problems:
        raise EmulatorError(label, "; ".join(problems), result.counters)
