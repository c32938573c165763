"""The search space and its candidates: a ``space=`` (or a config's ``autotune:`` section) checked
and normalized, every point of it for one fused kernel put through the resource model
(:func:`~tessera.schedule.choose_schedule`) before anything is compiled, candidates that build the
same tile program folded into one, ``max_candidates`` applied, and the report of a kernel whose
every candidate was pruned.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera_tvm.config import AUTOTUNE_KEYS, schedule_value_expected
from tessera_tvm.tile import program_fields

from ..errors import AutotuneError, ScheduleError
from ..schedule import BOOL_FIELDS, OVERRIDABLE, Schedule, choose_schedule
from .results import Candidate, KernelTuning


def normalize_space(space: Mapping[str, Any], where: str) -> dict[str, tuple[int, ...]]:
    """``space`` checked like a config's ``autotune:`` section: field -> distinct ints (``overlap``:
    bools), ``rasterize`` as ``swizzle``."""
    if not isinstance(space, Mapping):
        raise AutotuneError(f"{where}: space is {space!r}; expected a mapping of field -> list of ints")
    out: dict[str, tuple[int, ...]] = {}
    for key, values in space.items():
        name = "swizzle" if key == "rasterize" else key
        if name not in OVERRIDABLE:
            import difflib

            close = difflib.get_close_matches(str(key), list(AUTOTUNE_KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise AutotuneError(
                f"{where}: space key {key!r} is not a schedule field{hint}; fields: {', '.join(OVERRIDABLE)}"
            )
        if name in out:
            raise AutotuneError(f"{where}: space names {name} twice (swizzle and rasterize are the same field)")
        values = list(values) if isinstance(values, list | tuple) else [values]
        if not values:
            what = "True and/or False" if name in BOOL_FIELDS else "ints"
            raise AutotuneError(f"{where}: space[{key!r}] is empty; expected a list of {what}")
        for v in values:
            expected = schedule_value_expected(name, v)
            if expected is not None:
                raise AutotuneError(f"{where}: space[{key!r}] holds {v!r}; expected {expected}")
        if len(set(values)) != len(values):
            raise AutotuneError(f"{where}: space[{key!r}] lists a value twice: {values}")
        out[name] = tuple(values)
    return out


@dataclass
class _Plan:
    """The candidates of one fused kernel, after pruning; what is left to compile and measure."""

    name: str
    describe: str
    spec: Any
    space: tuple[str, ...]
    candidates: list[Candidate]
    key: str = ""
    tuning: KernelTuning | None = None  # from the cache, or once measured
    compiled: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> worker's answer

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.candidates)

    def job(self, candidate: Candidate, config) -> dict[str, Any]:
        """What a worker needs to compile ``candidate`` or load its build: the fused kernel, its spec and
        the candidate's schedule, on ``config``."""
        return {
            "name": self.name,
            "describe": self.describe,
            "spec": self.spec,
            "schedule": candidate.schedule,
            "config": config,
        }

    @property
    def all_pruned(self) -> bool:
        """Every point of the space is rejected by the resource model (the default aside)."""
        return all(c.status == "pruned" for c in self.candidates[1:])

    @property
    def live(self) -> list[Candidate]:
        """Candidates to compile and measure (the default first)."""
        return [c for c in self.candidates if c.status in ("planned", "measured")]


def _plan(group, binding, config, space: dict[str, tuple[int, ...]], fixed: dict[str, int], max_candidates) -> _Plan:
    """Every candidate of one fused kernel through the resource model; nothing is compiled."""
    space = {k: v for k, v in space.items() if k not in fixed}  # fixed fields are not searched
    name, describe, spec = group.name, group.describe(), binding.spec
    try:  # what ts.compile would use
        default = choose_schedule(name, describe, spec, config, fixed)
        candidates = [Candidate(0, (), "planned", schedule=default)]
        seen = {_program_identity(default, config): 0}
    except ScheduleError as exc:  # the config's defaults may not fit its own resources either
        candidates, seen = [Candidate(0, (), "pruned", exc.reason)], {}
    for values in itertools.product(*space.values()):
        fields = tuple(zip(space, values, strict=True))
        index = len(candidates)
        try:
            schedule = choose_schedule(name, describe, spec, config, {**fixed, **dict(fields)})
        except ScheduleError as exc:
            candidates.append(Candidate(index, fields, "pruned", exc.reason))
            continue
        tile = _program_identity(schedule, config)
        if tile in seen:
            first = seen[tile]
            candidates.append(Candidate(index, fields, "same", f"as #{first}", schedule=schedule))
            continue
        seen[tile] = index
        candidates.append(Candidate(index, fields, "planned", schedule=schedule))
    live = [c for c in candidates if c.status == "planned"]
    if max_candidates is not None and len(live) > max_candidates:
        # Evenly spread over the space (the default always kept, as the reference).
        rest = live[1:]
        picks = {rest[round(i * (len(rest) - 1) / max(1, max_candidates - 2))].index for i in range(max_candidates - 1)}
        for c in rest:
            if c.index not in picks:
                candidates[c.index] = dataclasses.replace(
                    c, status="skipped", reason=f"max_candidates={max_candidates}"
                )
    return _Plan(name, describe, spec, tuple(space), candidates)


def _program_identity(schedule: Schedule, config) -> tuple:
    """The values of the schedule fields its tile program reads (the tile library's
    :func:`~tessera_tvm.tile.program_fields`); candidates equal here are one program."""
    tile = schedule.tile_schedule()
    return tuple(getattr(tile, name) for name in program_fields(schedule.family, config))


def _pruned_report(plans: list[_Plan], config) -> str:
    lines = []
    for plan in plans:
        pruned = [c for c in plan.candidates if c.status == "pruned"]
        default = "" if plan.candidates[0].status == "pruned" else " (the config's default schedule fits)"
        lines.append(f"  {plan.name} ({plan.spec.family}): all {len(plan.candidates) - 1} candidates pruned{default}")
        reasons: dict[str, list[str]] = {}
        for c in pruned:
            reasons.setdefault(c.reason, []).append(" ".join(f"{k}={v}" for k, v in c.fields) or "default")
        for reason, which in reasons.items():
            shown = "; ".join(which[:3]) + (f"; ... ({len(which) - 3} more)" if len(which) > 3 else "")
            lines.append(f"    {reason}: {shown}")
    return "\n".join(lines)
