"""The ``tt.plan.json`` checks behind :mod:`tessera_tvm.target.tt.emulate`: reading a plan and validating it.

:func:`load_plan` reads a plan file (JSON syntax errors become :class:`PlanError` naming the file and
line); :func:`validate_plan` checks a plan against ``plan.schema.json`` (:func:`plan_schema`, with the
jsonschema library's errors worded as ``$.path: expected ..., got ...``) and then the cross-field rules
the schema cannot express (unique names and CB ids, page sizes, padded shapes, the L1 budget, cores
inside the grids, buffer references, runtime-arg limits, the tile schedule), raising one
:class:`PlanError` that lists every violation found and returning the plan's arch row.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tessera_tvm.errors import TesseraError

from . import DTYPE_TO_FORMAT, PLAN_SCHEMA_PATH, format_ranges, padded_shape, tile_bytes
from .arch import TTArch, UnknownArchError, get_arch

__all__ = ["PlanError", "load_plan", "validate_plan", "plan_schema"]


class PlanError(TesseraError, ValueError):
    """The plan (or the inputs given for it) is invalid; the message names the plan and the field."""

    def __init__(self, plan: str, errors: list[str]):
        self.plan = plan
        self.errors = errors
        shown = errors[:12]
        more = f"\n  ... and {len(errors) - len(shown)} more" if len(errors) > len(shown) else ""
        super().__init__(f"invalid tt plan {plan}:\n  " + "\n  ".join(shown) + more)


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
                tiles = (pr // 32) * (pc // 32)
                if total <= 0 or tiles % total:  # a work item writes one tile, or a block of them (attention: D/32)
                    errors.append(
                        f"$.schedule.total_tiles: {total} but buffer {out['name']!r} has {tiles} tiles "
                        "(expected the work items to write the same number of tiles each)"
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
            errors.append(f"$.schedule: tiles {format_ranges(missing)} are assigned to no core")

    if errors:
        raise PlanError(label, errors)
    return arch
