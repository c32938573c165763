"""Target configs: one YAML file per target, loaded into a frozen, validated ``TargetConfig``.

A config names the TVM target, the codegen, the resource limits that ``tessera.VerifyResources``
enforces, the feature switches that conditional passes read, per-pass arguments, the pipeline
(lists of registered pass names), and the schedule defaults and autotune space the frontend uses.
Every mistake is reported as a ``ConfigError`` naming the file, the key, the value found, what was
expected and, where YAML knows it, the line.

    cfg = load_config("hopper")               # a name in configs/
    cfg = load_config("my/hopper_no_ws.yaml") # or a path
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .config_pipeline import (  # noqa: F401  (re-exported: the config's public names)
    ALL_PHASES,
    CONFIG_PACKAGE,
    GRAPH_PHASE,
    PHASES,
    PipelineEntry,
    packaged,
    parse_pipeline,
    shared_texts,
)
from .config_reader import _Checker, _Lines, _read_yaml
from .errors import ConfigError, PassNotFoundError

#: Resource limits a config may declare (all byte or count integers).
RESOURCE_KEYS = {
    "shared_memory_per_block": "bytes of shared memory one thread block may use (static + dynamic)",
    "threads_per_block": "threads in one thread block",
    "registers_per_thread": "registers one thread may use (checked from ptxas's report when nvcc runs)",
    "registers_per_block": "registers one thread block may use",
    "local_memory_per_kernel": "bytes of local (stack) arrays one CPU kernel may allocate",
    "l1_bytes_per_core": "bytes of L1 the circular buffers of one Tenstorrent core may use (default: arch table)",
    "circular_buffers_per_core": "circular-buffer ids per Tenstorrent core (default: arch table)",
    "dst_tiles": "32x32 tiles the Tenstorrent DST register holds (default: arch table)",
}

#: Feature switches read by ``when:`` conditions. Absent means false.
FEATURES = {
    "warp_specialization": "Hopper producer/consumer warp specialisation (TMA producer, setmaxnreg)",
    "software_pipeline": "plan and inject software pipelines for T.Pipelined loops",
    "unroll_before_pipeline": "expand explicitly unrolled loops before pipeline planning",
    "tma_copy_annotation": "mark kernel-bound global bases for TMA copy analysis",
    "blackwell_2sm": "lower 2-SM tcgen05 MMA (a no-op before Blackwell)",
    "l2_persistent": "lower L2 persistence annotations",
    "cpu_atomics": "rewrite scalar atomics into serial read-modify-write (CPU)",
    "parallel_grid": "run the kernel grid on all cores (CPU: an OpenMP region, tessera.MarkParallelGrid)",
    "force_let_inline": "inline every let binding before lowering (TileLang's default: off)",
    "race_check": "verify T.Parallel loops for data races (TileLang's default: off)",
}

#: Facts about a target's hardware that decide schedules (``hardware:``): name -> (meaning, default).
#: A new target like one we have is a new YAML file with its own facts, not a branch in the code.
HARDWARE_KEYS: dict[str, tuple[str, bool | int]] = {
    "tma": ("bulk tensor copies (TMA) move tiles between global and shared memory", False),
    "wgmma": ("warpgroup MMA: GEMM blocks keep 64-row multiples", False),
    "cp_async": ("asynchronous global-to-shared copies (cp.async) feed the software pipeline", False),
    "producer_threads": ("threads warp specialisation adds for its producer warp group", 0),
    "mbarrier": ("hardware barriers in shared memory (mbarrier, sm_90+) that T.alloc_barrier allocates", False),
    "pipelined_dynamic_loops": (
        "the software pipeline (without warp specialisation) takes a loop whose trip count differs per "
        "block, such as causal attention's key loop",
        True,
    ),
}

#: The fields of a ``schedule:`` section: ``tessera_tvm.tile.TileSchedule``'s, each an int of at least
#: the given value, the MMA instruction shape and attention's ``overlap`` switch.
SCHEDULE_KEYS: dict[str, tuple[str, int | None]] = {
    "block_m": ("rows of the output tile", 1),
    "block_n": ("columns of the output tile", 1),
    "block_k": ("the K step of a GEMM's main loop", 1),
    "stages": ("software-pipeline buffers", 1),
    "threads": ("threads per block", 1),
    "rasterize": ("L2 rasterization panel width, 0 = off", 0),
    "mma": ("the target's MMA instruction shape [m, n, k]", None),
    "overlap": ("GPU attention: overlap one key block's softmax with the previous block's P V (bool)", None),
    "kv_packs_per_head": ("CPU attention: packings of each kv head's K and V, 0 = per query block", 0),
    "conv_algorithm": (
        "conv2d: 'implicit_gemm', 'direct' or 'winograd' (CPU); the planner chooses where not given",
        None,
    ),
}
#: The schedule fields that are switches (a bool), not ints.
SCHEDULE_SWITCHES = ("overlap",)
#: The schedule fields that take one of a few names (a kernel's overrides; the planner chooses them).
SCHEDULE_CHOICES = {"conv_algorithm": ("implicit_gemm", "direct", "winograd")}
#: Kernel families that may hold their own ``schedule:`` mapping (``schedule: {attention: {block_m: 64}}``).
SCHEDULE_FAMILIES = ("gemm", "elementwise", "reduce", "softmax", "norm", "attention", "conv2d", "pool2d")

#: Schedule fields an ``autotune:`` space may list (the frontend's override names; ``rasterize`` is
#: the tile library's name for ``swizzle``). Each maps to a non-empty list of distinct integers
#: (``overlap``: of booleans).
AUTOTUNE_KEYS = {
    "block_m": "rows of the output tile (positive ints)",
    "block_n": "columns of the output tile (positive ints)",
    "block_k": "the K step of a GEMM's main loop (positive ints)",
    "stages": "software-pipeline buffers (positive ints)",
    "threads": "threads per block (positive ints)",
    "swizzle": "L2 rasterization panel width, 0 = off (ints >= 0)",
    "rasterize": "the same as swizzle, under the tile library's name (ints >= 0)",
    "overlap": "attention on Hopper: softmax beside the previous key block's P V (true and/or false)",
}

_TOP_KEYS = {
    "name": "the config's name (str)",
    "description": "one line saying what the target is (str)",
    "target": "the TVM target: {kind, arch | mcpu, ...}",
    "codegen": "{kind: cuda | hip | c | tt, compiler: nvcc | g++ | none, flags: [...]}",
    "tt": "Tenstorrent options: {arch, math_fidelity, fp32_dest_acc_en, math_approx_mode}",
    "resources": "resource limits (mapping of int)",
    "features": "feature switches (mapping of bool)",
    "pass_args": "arguments per pass name (mapping of mapping)",
    "pipeline": "{graph: shared | [...], lower_and_legalize: shared | [...], optimize_for_target: [...], codegen_prep: [...]}",
    "hardware": "facts about the target's hardware the schedule builder reads (mapping)",
    "schedule": "schedule defaults for the frontend (mapping)",
    "autotune": "autotune search space (mapping of lists)",
}


@dataclass(frozen=True)
class TargetConfig:
    """A validated target config. Frozen and hashable: the cache key and dump header come from it."""

    name: str
    source: str
    description: str
    target: tuple[tuple[str, Any], ...]
    codegen: tuple[tuple[str, Any], ...]
    resources: tuple[tuple[str, int], ...]
    features: tuple[tuple[str, bool], ...]
    pipeline: tuple[tuple[str, tuple[PipelineEntry, ...]], ...]
    schedule: tuple[tuple[str, Any], ...] = ()
    autotune: tuple[tuple[str, Any], ...] = ()
    hardware: tuple[tuple[str, Any], ...] = ()
    tt: tuple[tuple[str, Any], ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    # Mapping views of the frozen tuples -------------------------------------------------------
    @property
    def target_dict(self) -> dict[str, Any]:
        return _thaw(self.target)

    @property
    def codegen_dict(self) -> dict[str, Any]:
        return _thaw(self.codegen)

    @property
    def resource_limits(self) -> dict[str, int]:
        return dict(self.resources)

    @property
    def tt_dict(self) -> dict[str, Any]:
        """The ``tt:`` section (Tenstorrent configs; empty otherwise)."""
        return _thaw(self.tt)

    def feature(self, name: str) -> bool:
        return dict(self.features).get(name, False)

    def fact(self, name: str) -> bool | int:
        """A ``hardware:`` fact of the target (its default from ``HARDWARE_KEYS`` when not given)."""
        return dict(self.hardware).get(name, HARDWARE_KEYS[name][1])

    def phase(self, phase: str) -> tuple[PipelineEntry, ...]:
        return dict(self.pipeline)[phase]

    @property
    def tvm_kind(self) -> str:
        """TVM's target kind the config names (``target.kind``): ``cuda``, ``hip`` or ``c``
        (Tenstorrent's is ``c``: its codegen kind, :attr:`codegen_kind`, is ``tt``)."""
        return dict(self.target)["kind"]

    @property
    def target_kind(self) -> str:
        """The old name of :attr:`tvm_kind`."""
        return self.tvm_kind

    @property
    def codegen_kind(self) -> str:
        """What the codegen emits: ``cuda``, ``hip``, ``c`` or ``tt`` (cheap: read on every kernel call)."""
        return dict(self.codegen)["kind"]

    def fingerprint(self) -> str:
        """A stable hash of everything that changes what the config compiles to: the YAML as
        written and the pipeline it expands to (shared lists such as ``lower_and_legalize: shared``
        live in other files), every entry with its arguments and condition."""
        pipeline = {
            phase: [entry.describe() + f" when={entry.when}" for entry in entries] for phase, entries in self.pipeline
        }
        payload = json.dumps({"yaml": _thaw(self.raw), "pipeline": pipeline}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def tvm_target(self):
        """The TVM ``Target`` this config names, with a C host (this TVM has no LLVM backend), as
        TileLang normalises it (a ROCm target gets its wavefront size)."""
        from ._tvm import tilelang_target

        return tilelang_target(self.target_dict, host="c")


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple((k, _freeze(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple) and all(isinstance(i, tuple) and len(i) == 2 and isinstance(i[0], str) for i in value):
        return {k: _thaw(v) for k, v in value}
    if isinstance(value, tuple | list):
        return [_thaw(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Locating configs
# ---------------------------------------------------------------------------------------------


def available_configs() -> list[str]:
    """Names of the configs shipped in configs/ (what ``load_config`` accepts as a name)."""
    root = resources.files(CONFIG_PACKAGE)
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def _locate(name_or_path: str | os.PathLike) -> tuple[str, str]:
    text = os.fspath(name_or_path)
    looks_like_path = text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text
    if looks_like_path:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(
                text,
                None,
                f"no such file; expected a path to a target config YAML or one of the names {available_configs()}",
            )
        try:
            return path.read_bytes().decode("utf-8"), str(path)
        except UnicodeDecodeError as exc:
            raise ConfigError(
                text, None, f"is not UTF-8 text (byte {exc.start}: {exc.reason}); expected a target config YAML"
            ) from None
        except OSError as exc:
            raise ConfigError(text, None, f"cannot be read: {exc.strerror or exc}") from None
    found = packaged(f"{text}.yaml")
    if found is None:
        import difflib

        names = available_configs()
        close = difflib.get_close_matches(text, names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(text, None, f"unknown target config; expected one of {names} or a path to a YAML file{hint}")
    return found


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def parse_config(data: Any, source: str, lines: _Lines | None = None) -> TargetConfig:
    """Validate an already-parsed YAML mapping (``load_config`` reads the file and calls this)."""
    check = _Checker(source, lines or _Lines())
    data = check.mapping(data, "", _TOP_KEYS)
    for required in ("name", "target", "pipeline"):
        if required not in data:
            raise check.fail(required, f"is missing; every config needs `{required}` ({_TOP_KEYS[required]})")
    name = check.typed(data["name"], "name", str, "a string")
    description = check.typed(data.get("description", ""), "description", str, "a string")

    target = check.mapping(data["target"], "target")
    if "kind" not in target:
        raise check.fail("target.kind", "is missing; expected a TVM target kind such as cuda, hip or c")
    kind = check.typed(target["kind"], "target.kind", str, "a TVM target kind (str)")
    codegen = check.mapping(
        data.get("codegen", {"kind": kind}),
        "codegen",
        {"kind": "cuda | hip | c | tt", "compiler": "nvcc | g++ | none", "flags": "list of flags"},
    )
    codegen.setdefault("kind", kind)
    backend = _backend(kind, codegen["kind"], check)
    if backend.check_target is not None:
        backend.hook("check_target")(target, check)
    compiler = codegen.setdefault("compiler", "none")
    if compiler not in ("nvcc", "g++", "none"):
        raise check.fail("codegen.compiler", f"expected nvcc, g++ or none, found {compiler!r}")
    flags = codegen.setdefault("flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise check.fail("codegen.flags", f"expected a list of strings, found {flags!r}")

    resources_ = check.mapping(data.get("resources", {}), "resources", RESOURCE_KEYS)
    for key, value in resources_.items():
        check.typed(value, f"resources.{key}", int, f"a positive integer ({RESOURCE_KEYS[key]})")
        if value <= 0:
            raise check.fail(f"resources.{key}", f"expected a positive integer, found {value}")
    resources_ = dict(resources_)  # a backend's section may add limits (Tenstorrent's arch table)
    tt = _parse_backend_section(data, backend, target, resources_, check)

    features = check.mapping(data.get("features", {}), "features", FEATURES)
    for key, value in features.items():
        check.typed(value, f"features.{key}", bool, "true or false")
    hardware = check.mapping(data.get("hardware", {}), "hardware", {k: v[0] for k, v in HARDWARE_KEYS.items()})
    for key, value in hardware.items():
        default = HARDWARE_KEYS[key][1]
        if isinstance(default, bool):
            check.typed(value, f"hardware.{key}", bool, f"true or false ({HARDWARE_KEYS[key][0]})")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise check.fail(f"hardware.{key}", f"expected an int >= 0 ({HARDWARE_KEYS[key][0]}), found {value!r}")

    pass_args = check.mapping(data.get("pass_args", {}), "pass_args")
    for pname, args in pass_args.items():
        check.mapping(args, f"pass_args.{pname}")

    phases = parse_pipeline(data["pipeline"], check, pass_args, features, FEATURES)
    used = {e.name for _, entries in phases for e in entries}
    for pname in pass_args:
        from .registry import get_pass

        try:
            get_pass(pname)
        except PassNotFoundError as exc:
            raise check.fail(f"pass_args.{pname}", str(exc)) from None
        if pname not in used:
            raise check.fail(f"pass_args.{pname}", "has arguments but the pass is not in this config's pipeline")

    schedule = _parse_schedule(data.get("schedule", {}), "schedule", check)
    autotune = _parse_autotune(data.get("autotune", {}), check)

    return TargetConfig(
        name=name,
        source=source,
        description=description,
        target=_freeze(target),
        codegen=_freeze(codegen),
        resources=tuple(sorted(resources_.items())),
        features=tuple(sorted(features.items())),
        hardware=tuple(sorted(hardware.items())),
        pipeline=tuple(phases),
        schedule=_freeze(schedule),
        autotune=_freeze(autotune),
        tt=_freeze(tt),
        raw=data,
    )


def _parse_schedule(value: Any, key: str, check: _Checker, families: bool = True) -> dict[str, Any]:
    """The ``schedule:`` defaults: known fields with ints in range, per-family mappings of the same."""
    allowed = {k: what for k, (what, _) in SCHEDULE_KEYS.items()}
    if families:
        allowed.update({family: f"schedule defaults for {family} kernels (mapping)" for family in SCHEDULE_FAMILIES})
    schedule = check.mapping(value, key, allowed)
    for field_name, item in schedule.items():
        where = f"{key}.{field_name}"
        if field_name in SCHEDULE_FAMILIES:
            _parse_schedule(item, where, check, families=False)
        elif field_name == "mma":
            if not (isinstance(item, list) and len(item) == 3 and all(_positive_int(x) for x in item)):
                raise check.fail(where, f"expected [m, n, k], three positive ints ({allowed['mma']}), found {item!r}")
        else:
            expected = schedule_value_expected(field_name, item, yaml=True)
            if expected is not None:
                raise check.fail(where, f"expected {expected} ({allowed[field_name]}), found {item!r}")
    return schedule


def schedule_value_expected(field_name: str, value: Any, *, yaml: bool = False) -> str | None:
    """What a value of schedule field ``field_name`` (a ``SCHEDULE_KEYS`` field, or ``swizzle``)
    must be, where ``value`` is not that; None where it is. A switch (SCHEDULE_SWITCHES) takes a bool
    (``yaml``: spelled true or false), every other field an int (not a bool) of at least its low.
    The one rule for a config's ``schedule:`` and ``autotune:``, a kernel's overrides and a space."""
    if field_name in SCHEDULE_SWITCHES:
        return None if isinstance(value, bool) else ("true or false" if yaml else "True or False")
    if field_name in SCHEDULE_CHOICES:
        names = SCHEDULE_CHOICES[field_name]
        return None if value in names else f"one of {', '.join(map(repr, names))}"
    low = SCHEDULE_KEYS["rasterize" if field_name == "swizzle" else field_name][1]
    return None if isinstance(value, int) and not isinstance(value, bool) and value >= low else f"an int >= {low}"


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _parse_autotune(value: Any, check: _Checker) -> dict[str, list[int]]:
    """The ``autotune:`` space: schedule field -> non-empty list of distinct ints (``overlap``: bools)."""
    space = check.mapping(value, "autotune", AUTOTUNE_KEYS)
    if "swizzle" in space and "rasterize" in space:
        raise check.fail("autotune.rasterize", "names the same field as autotune.swizzle; keep one of them")
    for key, values in space.items():
        if not isinstance(values, list) or not values:
            raise check.fail(f"autotune.{key}", f"expected a non-empty list of candidate values, found {values!r}")
        for i, item in enumerate(values):
            expected = schedule_value_expected(key, item, yaml=True)
            if expected is not None:
                raise check.fail(f"autotune.{key}[{i}]", f"expected {expected} ({AUTOTUNE_KEYS[key]}), found {item!r}")
        if len(set(values)) != len(values):
            raise check.fail(f"autotune.{key}", f"lists a value twice: {values}")
    return space


def _backend(kind: str, codegen_kind: Any, check: _Checker):
    """The backend of ``codegen.kind``, checked against the TVM ``target.kind`` it binds."""
    from .target.backend import backend_for, known_kinds

    backends = {k: backend_for(k) for k in known_kinds()}
    tvm_kinds = sorted({b.tvm_kind for b in backends.values()})
    if kind not in tvm_kinds:
        raise check.fail("target.kind", f"unsupported target kind {kind!r}; expected one of {tvm_kinds}")
    if codegen_kind not in backends:
        raise check.fail("codegen.kind", f"unknown codegen {codegen_kind!r}; expected one of {sorted(backends)}")
    backend = backends[codegen_kind]
    if backend.tvm_kind != kind:
        raise check.fail(
            "codegen.kind",
            f"codegen {codegen_kind!r} needs target kind {backend.tvm_kind!r}, but target.kind is {kind!r}",
        )
    return backend


def _parse_backend_section(data, backend, target, resources_: dict[str, int], check: _Checker) -> dict:
    """The section only ``backend``'s configs take (Tenstorrent: ``tt:``), validated by its hook."""
    from .target.backend import backend_for, known_kinds

    for other in (backend_for(k) for k in known_kinds()):
        if other.section is not None and other.section in data and other.section != backend.section:
            raise check.fail(
                other.section,
                f"only {other.title} configs (codegen.kind: {other.kind}) take a `{other.section}:` section; "
                f"codegen.kind is {backend.kind!r}",
            )
    parse = backend.hook("parse_section")
    return parse(data, target, resources_, check) if parse is not None else {}


_CACHE: dict[tuple[str, str], TargetConfig] = {}


def load_config(name_or_path: str | os.PathLike | TargetConfig) -> TargetConfig:
    """Load and validate a target config by name (``configs/<name>.yaml``) or path."""
    if isinstance(name_or_path, TargetConfig):
        return name_or_path
    text, source = _locate(name_or_path)
    # `graph: shared` and `lower_and_legalize: shared` expand to the shared lists' files
    key = (source, hashlib.sha256(text.encode()).hexdigest(), hashlib.sha256(shared_texts().encode()).hexdigest())
    if key not in _CACHE:
        data, lines = _read_yaml(text, source)
        _CACHE[key] = parse_config(data, source, lines)
    return _CACHE[key]
