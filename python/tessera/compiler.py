"""``ts.compile``: a kernel through Graph IR -> Schedule IR -> Tile IR -> Target IR for one target.

    k = ts.compile(linear, target="hopper", shapes={"M": 4096, "N": 4096, "K": 4096},
                   dump=["graph", "sched", "tile", "target"], dump_dir="build/linear")
    k.inspect_ir("graph" | "sched" | "tile" | "target")
    k.source; k.artifacts; k.metadata; k.pass_log; k.schedules

    cpu = ts.compile(linear, target="cpu")      # shapes bound from the arrays at each call
    out = cpu(a, w, b)                          # numpy in, numpy out

Per fused kernel of the Graph IR: a tile spec (``tessera_tvm.graph.kernel_spec``), a
:class:`~tessera.schedule.Schedule` (validated before anything is lowered), a TileLang PrimFunc
(``tessera_tvm.tile.build_tile_program``) and its lowering (``tessera_tvm.lower``). A kernel that
fuses into several device kernels runs them in order on the CPU, intermediates allocated here.
Compiled kernels are cached in memory per (kernel, shapes, schedule overrides, config fingerprint).

Dumps (``dump=[...]`` or the environment variable ``TESSERA_DUMP_DIR``) write one file per stage,
``graph.txt``, ``sched.txt`` (+ ``sched.json``), ``tile.py``, ``target.<ext>``, the IR after every
TVM pass under ``passes/<fused kernel>/`` and the build outputs under ``artifacts/<fused kernel>/``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import tessera_tvm
from tessera_tvm.graph import GraphIR, KernelBinding, kernel_spec
from tessera_tvm.tile import (
    CPU_WIDENED,
    ElementwiseSpec,
    GemmSpec,
    SpecError,
    UnsupportedTTOperationError,
    build_tile_program,
)

from .errors import ArgumentError, KernelError, NotRunnableError, ScheduleError, ShapeError, user_location
from .kernel import STAGES, Kernel
from .schedule import Schedule, TuningSummary, choose_schedule, split_overrides

__all__ = ["CompiledKernel", "DeviceKernel", "PassLogEntry", "compile", "tile_program"]

_SOURCE_EXT = {"cuda": "cu", "hip": "hip.cpp", "c": "cpp", "tt": "tt.cpp"}
#: Tenstorrent computes one 32x32 tile per block with a 32-wide K step (tessera_tvm/tile/tt.py).
_TT_TILE = {"block_m": 32, "block_n": 32, "block_k": 32, "stages": 1, "threads": 1}


@dataclass(frozen=True)
class PassLogEntry:
    """One step of a compile: ``stage`` graph/sched/tile/target, the fused ``kernel`` it ran on."""

    stage: str
    kernel: str
    phase: str
    name: str
    seconds: float
    status: str = "ran"

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "kernel": self.kernel,
            "phase": self.phase,
            "name": self.name,
            "seconds": round(self.seconds, 6),
            "status": self.status,
        }


@dataclass
class DeviceKernel:
    """One fused kernel compiled for the target."""

    name: str
    binding: KernelBinding
    schedule: Schedule
    tile: Any  # TileLang PrimFunc
    lowered: Any  # tessera_tvm.LoweredModule
    tile_spec: Any = None  # the spec the tile program was built from (CPU: fp8 held as f32)

    @property
    def spec(self):
        return self.binding.spec

    def tile_text(self) -> str:
        return f"# kernel {self.name}: {self.spec!r}\n{self.tile.script()}"

    def run(self, arrays: dict[str, np.ndarray]) -> None:
        """Run on the CPU with arrays by spec parameter name (outputs written in place)."""
        # The tile program's buffers are named after the spec's parameters, in the same order.
        self.lowered(*[arrays[p.name] for p in self.spec.params()])


@dataclass(frozen=True)
class Launch:
    """One fused kernel's run, prepared once per instance: the graph values it reads (as its tile
    program's parameters), the buffer it writes, and the graph value that buffer becomes."""

    device: DeviceKernel
    inputs: tuple[tuple[Any, str, str, tuple[int, ...]], ...]  # (graph value, parameter, dtype, shape)
    output: tuple[str, str, tuple[int, ...]]  # (parameter, dtype, shape)
    result: tuple[Any, str, tuple[int, ...]]  # (graph value, graph dtype, graph shape)


@dataclass
class Instance:
    """A kernel compiled for one target with every dim bound."""

    kernel: Kernel
    config: Any
    env: dict[str, int]
    graph: GraphIR
    devices: list[DeviceKernel]
    log: list[PassLogEntry] = field(default_factory=list)

    @functools.cached_property
    def launches(self) -> tuple[Launch, ...]:
        from tessera_tvm.graph.nodes import static_shape

        launches = []
        for dk in self.devices:
            spec = dk.tile_spec or dk.spec  # what the tile program takes (CPU: fp8 held as f32)
            inputs = tuple(
                (var, p.name, p.dtype, tuple(p.shape)) for p, var in zip(spec.inputs(), dk.binding.inputs, strict=True)
            )
            (out,) = spec.outputs()
            result = (
                dk.binding.output,
                dk.spec.outputs()[0].dtype,
                static_shape(dk.binding.output, self.env, "output"),
            )
            launches.append(Launch(dk, inputs, (out.name, out.dtype, tuple(out.shape)), result))
        return tuple(launches)

    def run(self, arrays: Sequence[Any], memory: Memory | None = None) -> Any:
        """Run the fused kernels in order on ``arrays`` (the graph's parameters) and return the graph's
        output(s). ``memory`` holds the values: numpy on the CPU, torch on a GPU (``tessera.gpu``)."""
        memory = memory or HOST
        values: dict[Any, Any] = dict(zip(self.graph.params, arrays, strict=True))
        for launch in self.launches:
            named = {name: memory.hold(values[var], dtype, shape) for var, name, dtype, shape in launch.inputs}
            name, dtype, shape = launch.output
            named[name] = out = memory.empty(shape, dtype)
            launch.device.run(named)
            var, dtype, shape = launch.result
            values[var] = memory.result(out, dtype, shape)
        params = set(self.graph.params)
        results = [memory.copy(values[o]) if o in params else values[o] for o in self.graph.outputs]
        return tuple(results) if self.graph.simplified.tuple_output else results[0]


class Memory:
    """Where :meth:`Instance.run` keeps arrays. The host's, numpy: fp8 travels as float32 (what the
    CPU tile programs take) and each result is rounded to its graph dtype, as the kernel's store would."""

    def hold(self, value: Any, dtype: str, shape: tuple[int, ...]) -> Any:
        """``value`` as a contiguous ``dtype`` array of ``shape``, ready to pass to a kernel."""
        return np.ascontiguousarray(value, dtype=_numpy_dtype(dtype)).reshape(shape)

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        return np.empty(shape, dtype=_numpy_dtype(dtype))

    def result(self, out: Any, dtype: str, shape: tuple[int, ...]) -> Any:
        """A kernel's output buffer as the graph value it computes."""
        return out.astype(_numpy_dtype(dtype), copy=False).reshape(shape)

    def copy(self, value: Any) -> Any:
        return value.copy()


HOST = Memory()


@functools.cache
def _numpy_dtype(tvm_dtype: str):
    from .types import dtype as as_dtype

    return as_dtype(tvm_dtype).numpy


# ---------------------------------------------------------------------------------------------
# The compiled kernel
# ---------------------------------------------------------------------------------------------


class CompiledKernel:
    """What ``ts.compile`` returns: the stages of one kernel for one target, runnable on the CPU."""

    def __init__(
        self,
        kernel: Kernel,
        config,
        shapes: dict[str, int],
        overrides: dict[str, Any],
        dump_stages: tuple[str, ...],
        dump_dir: Path | None,
        build: bool,
        tuning: Mapping[str, TuningSummary] | None = None,
    ) -> None:
        self.kernel = kernel
        self.config = config
        self.shapes = shapes
        self.overrides = overrides
        self.dump_stages = dump_stages
        self.dump_dir = dump_dir
        self.build = build
        self.tuning = dict(tuning or {})  # fused kernel -> how the autotuner chose its schedule
        self._graph = kernel.graph(shapes)
        self._instance: Instance | None = None
        self._instances: dict[tuple, Instance] = {}
        # Unknown override keys fail now, before any lowering.
        split_overrides(overrides, [g.name for g in self._graph.groups], f"kernel {kernel.name}")
        if all(s in shapes for s in kernel.symbols):
            self._instance = self._instantiate(shapes)

    def __repr__(self) -> str:
        bound = ", ".join(f"{k}={v}" for k, v in self.shapes.items()) or "shapes bound at call"
        return f"<CompiledKernel {self.kernel.name} for {self.config.name} ({bound})>"

    @property
    def target(self) -> str:
        return self.config.name

    @property
    def lowered(self) -> bool:
        """Whether every dim is bound, so the kernel has been scheduled and lowered (else the first
        call binds the dims from its arrays and lowers then)."""
        return self._instance is not None

    @property
    def runnable(self) -> bool:
        """Whether calling it runs here: CPU configs, and CUDA configs with a runtime library and a GPU."""
        kind = self.config.codegen_kind
        if kind == "cuda" and self._instance is not None:
            from .gpu import gpu_available

            return all("runtime" in dk.lowered.artifacts for dk in self._instance.devices) and gpu_available()
        return kind == "c"

    # Building ----------------------------------------------------------------------------------
    def _instantiate(self, env: dict[str, int]) -> Instance:
        key = (
            self.kernel.fn,
            tuple(sorted(env.items())),
            json.dumps(self.overrides, sort_keys=True),
            self.config.fingerprint(),
            self.build,
            tuple(sorted(self.tuning.items())),
        )
        if not self.dump_stages and key in _CACHE:
            instance = _CACHE[key]
        else:
            instance = _compile_instance(
                self.kernel, self.config, env, self.overrides, self.dump_stages, self.dump_dir, self.build, self.tuning
            )
            _CACHE[key] = instance
        self._instances[tuple(sorted(env.items()))] = instance
        self._instance = instance
        return instance

    def _require_instance(self, what: str) -> Instance:
        if self._instance is None:
            missing = [s for s in self.kernel.symbols if s not in self.shapes]
            raise ShapeError(
                f"{what} of {self.kernel.name} needs every dim bound; {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not: pass shapes={{...}} to ts.compile or "
                "call the kernel on arrays first",
                location=user_location(),
            )
        return self._instance

    # Stages ------------------------------------------------------------------------------------
    def inspect_ir(self, stage: str = "graph") -> str:
        """The IR of ``stage``: graph, sched, tile or target (the last instantiated shapes)."""
        if stage not in STAGES:
            raise KernelError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}", location=user_location())
        if stage == "graph":
            return (self._instance.graph if self._instance else self._graph).text()
        inst = self._require_instance(f"inspect_ir({stage!r})")
        if stage == "sched":
            return "\n".join(dk.schedule.text() for dk in inst.devices)
        if stage == "tile":
            return "\n\n".join(dk.tile_text() for dk in inst.devices)
        return self.source

    @property
    def graph(self) -> GraphIR:
        return self._instance.graph if self._instance else self._graph

    @property
    def schedules(self) -> list[Schedule]:
        return [dk.schedule for dk in self._require_instance("schedules").devices]

    @property
    def device_kernels(self) -> list[DeviceKernel]:
        return list(self._require_instance("device_kernels").devices)

    @property
    def source(self) -> str:
        devices = self._require_instance("source").devices
        if self.config.codegen_kind == "tt":  # the five artifacts of every device kernel
            return "\n".join(_tt_text(dk) for dk in devices)
        if len(devices) == 1:
            return devices[0].lowered.source
        comment = "//"
        return "\n".join(f"{comment} ---- kernel {dk.name} ----\n{dk.lowered.source}" for dk in devices)

    @property
    def artifacts(self) -> dict[str, dict[str, Path]]:
        """Build outputs per fused kernel: source, host_ir, metadata, passes, cubin/ptx or library."""
        return {dk.name: dict(dk.lowered.artifacts) for dk in self._require_instance("artifacts").devices}

    @property
    def metadata(self) -> list[dict[str, Any]]:
        """One dict per device kernel (tile, fragments, resources, launch, epilogue) + ``fused_kernel``."""
        out = []
        for dk in self._require_instance("metadata").devices:
            for meta in dk.lowered.metadata:
                out.append({**meta, "fused_kernel": dk.name, "schedule": dk.schedule.as_dict()})
        return out

    @property
    def pass_log(self) -> list[PassLogEntry]:
        """Graph passes, then per fused kernel its schedule, tile and every tessera_tvm pass."""
        if self._instance is None:
            return _graph_log(self.kernel.name, self._graph)
        return list(self._instance.log)

    @property
    def notes(self) -> list[str]:
        return [n for dk in self._require_instance("notes").devices for n in dk.lowered.notes]

    # Running -----------------------------------------------------------------------------------
    def __call__(self, *arrays: Any) -> Any:
        """Run on numpy arrays (CPU configs), or on torch CUDA tensors or numpy arrays (CUDA configs on a
        GPU: numpy in gives numpy out, torch in gives torch out); returns the result array(s)."""
        if self.config.codegen_kind == "cuda":
            return self._call_gpu(arrays)
        if not self.runnable and self.config.codegen_kind == "tt":
            raise NotRunnableError(
                f"{self.kernel.name} was compiled for {self.config.name} (Tenstorrent); its kernels do not run "
                "in this process: the reader/compute/writer/host/plan files are the result (.artifacts; "
                "tessera_tvm.target.tt.emulate.run_plan runs a plan). Compile with target='cpu' to run it here."
            )
        if not self.runnable:
            raise NotRunnableError(
                f"{self.kernel.name} was compiled for {self.config.name} ({self.config.target_kind}); its kernels "
                "do not run in this process (no runtime for this target here): their source and metadata are "
                "the result (.source, .artifacts, .metadata). Compile with target='cpu' to run it here."
            )
        arrays = _check_args(self.kernel, arrays, self.shapes)
        env = _bind(self.kernel, arrays, self.shapes)
        instance = self._instances.get(tuple(sorted(env.items()))) or self._instantiate(env)
        return instance.run(arrays)

    def _call_gpu(self, arrays: Sequence[Any]) -> Any:
        from .gpu import run_on_gpu

        instance = self._require_instance("running")
        unbuilt = [dk.name for dk in instance.devices if "runtime" not in dk.lowered.artifacts]
        if unbuilt:
            why = "it was compiled with build=False" if not self.build else "nvcc was not on PATH at compile time"
            raise NotRunnableError(
                f"{self.kernel.name} for {self.config.name} has no CUDA runtime library for {', '.join(unbuilt)}: "
                f"{why}; its source is in .artifacts (install the CUDA toolkit or set TESSERA_NVCC, then recompile)"
            )
        return run_on_gpu(instance, _check_args(self.kernel, arrays, self.shapes, allow_torch=True))


_CACHE: dict[tuple, Instance] = {}


def clear_cache() -> None:
    """Forget every compiled kernel (the in-memory cache)."""
    _CACHE.clear()


#: The five Tenstorrent artifacts of a device kernel, as ``.artifacts`` names them.
TT_ARTIFACTS = ("reader", "compute", "writer", "host", "plan")


def _tt_text(dk: DeviceKernel) -> str:
    """A Tenstorrent device kernel's five artifacts in one text, each under a banner."""
    files = dk.lowered.artifacts
    return "\n".join(
        f"// ===== kernel {dk.name}: {files[key].name} ({key}) =====\n{Path(files[key]).read_text()}"
        for key in TT_ARTIFACTS
    )


def _graph_log(name: str, graph: GraphIR) -> list[PassLogEntry]:
    return [PassLogEntry("graph", name, r.phase, r.name, r.seconds, r.status) for r in graph.records]


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


def _check_args(
    kernel: Kernel, arrays: Sequence[Any], shapes: dict[str, int], *, allow_torch: bool = False
) -> list[Any]:
    """The arrays, checked against the kernel's parameters and made contiguous.

    With ``allow_torch`` (CUDA configs) torch CUDA tensors are accepted next to numpy arrays."""
    from . import gpu

    names = ", ".join(n for n, _ in kernel.params)
    if len(arrays) != len(kernel.params):
        raise ArgumentError(f"{kernel.name} takes {len(kernel.params)} arrays ({names}), got {len(arrays)}")
    out = []
    for (name, ttype), arr in zip(kernel.params, arrays, strict=True):
        torch_arg = allow_torch and gpu.is_torch_tensor(arr)
        if torch_arg:
            if not gpu.on_gpu(arr):
                raise ArgumentError(
                    f"{kernel.name}: argument {name} is a torch tensor on {arr.device}; expected a CUDA tensor "
                    f"or a numpy array {ttype.describe()}: move it with {name}.cuda()"
                )
            if arr.dtype != gpu.torch_dtype(ttype.dtype.tvm):
                wanted = gpu.torch_dtype(ttype.dtype.tvm)
                raise ArgumentError(
                    f"{kernel.name}: argument {name} has dtype {arr.dtype}, expected {ttype.dtype} "
                    f"({wanted}); convert it: {name}.to({wanted})"
                )
        elif not isinstance(arr, np.ndarray):
            expected = "a torch CUDA tensor or a numpy array" if allow_torch else "a numpy array"
            raise ArgumentError(
                f"{kernel.name}: argument {name} is a {type(arr).__name__}; expected {expected} {ttype.describe()}"
            )
        elif arr.dtype != ttype.dtype.numpy:
            raise ArgumentError(
                f"{kernel.name}: argument {name} has dtype {arr.dtype}, expected {ttype.dtype} "
                f"({ttype.dtype.numpy}); convert it: {name}.astype({_astype_hint(ttype.dtype)})"
            )
        if arr.ndim != ttype.rank:
            raise ArgumentError(
                f"{kernel.name}: argument {name} has shape {arr.shape} (rank {arr.ndim}), expected "
                f"{ttype.describe()} (rank {ttype.rank})"
            )
        for axis, (dim, size) in enumerate(zip(ttype.dims, arr.shape, strict=True)):
            if isinstance(dim, int) and size != dim:
                raise ArgumentError(
                    f"{kernel.name}: argument {name} has shape {arr.shape}, expected "
                    f"{ttype.describe()}: dim {axis} is {size}, expected {dim}"
                )
            if isinstance(dim, str) and dim in shapes and size != shapes[dim]:
                raise ArgumentError(
                    f"{kernel.name}: argument {name} has shape {arr.shape}, expected "
                    f"{ttype.describe()}: dim {axis} ({dim}) is {size} but it was compiled with "
                    f"{dim}={shapes[dim]}"
                )
            if size == 0:
                raise ArgumentError(
                    f"{kernel.name}: argument {name} has shape {arr.shape}; empty dims are not supported"
                )
        out.append(arr.contiguous() if torch_arg else np.ascontiguousarray(arr))
    return out


def _astype_hint(dtype) -> str:
    return f"ml_dtypes.{dtype.tvm}" if dtype.tvm in ("bfloat16", "float8_e4m3fn", "float8_e5m2") else f"np.{dtype.tvm}"


def _bind(kernel: Kernel, arrays: list[np.ndarray], shapes: dict[str, int]) -> dict[str, int]:
    """Dim values from the arrays; conflicting values are reported by the op that needs them equal."""
    env = dict(shapes)
    seen: dict[str, tuple[int, str]] = {}
    conflict = None
    for (name, ttype), arr in zip(kernel.params, arrays, strict=True):
        for axis, (dim, size) in enumerate(zip(ttype.dims, arr.shape, strict=True)):
            if isinstance(dim, str):
                if dim in seen and seen[dim][0] != size and conflict is None:
                    conflict = (dim, name, axis, size, seen[dim])
                seen.setdefault(dim, (size, f"{name}.shape[{axis}]"))
                env.setdefault(dim, size)
    if conflict is not None:
        # Trace with each argument's own dims so the op that needs them equal reports it at its line.
        kernel.graph(shapes, arg_shapes={n: a.shape for (n, _), a in zip(kernel.params, arrays, strict=True)})
        dim, name, axis, size, (first, where) = conflict
        raise ArgumentError(
            f"{kernel.name}: dim {dim} is {size} in {name}.shape[{axis}] but {first} in {where}; "
            f"arrays must agree on {dim}"
        )
    return env


# ---------------------------------------------------------------------------------------------
# Compiling one instance
# ---------------------------------------------------------------------------------------------


def _compile_instance(
    kernel: Kernel,
    config,
    env: dict[str, int],
    overrides: dict[str, Any],
    dump_stages: tuple[str, ...],
    dump_dir: Path | None,
    build: bool,
    tuning: Mapping[str, TuningSummary] | None = None,
) -> Instance:
    graph = kernel.graph(env)
    tuning = tuning or {}
    log = _graph_log(kernel.name, graph)
    per_kernel = split_overrides(overrides, [g.name for g in graph.groups], f"kernel {kernel.name}")
    # Schedule IR for every fused kernel first: an override the target cannot hold fails before lowering.
    planned = []
    tt = config.codegen_kind == "tt"  # Tenstorrent: TVM kind c, tile programs of kind tt
    for group in graph.groups:
        start = time.perf_counter()
        try:
            binding = kernel_spec(group, env)
        except SpecError as exc:
            raise KernelError(
                f"fused kernel {group.name} ({group.describe()}) has no tile kernel: {exc}",
                location=(kernel.fn.__code__.co_filename, kernel.fn.__code__.co_firstlineno),
            ) from None
        wanted = {**_TT_TILE, **per_kernel[group.name]} if tt else per_kernel[group.name]
        schedule = choose_schedule(group.name, group.describe(), binding.spec, config, wanted)
        if group.name in tuning:
            schedule = dataclasses.replace(schedule, autotune=tuning[group.name])
        log.append(
            PassLogEntry(
                "sched",
                group.name,
                "schedule",
                "tessera.ChooseSchedule",
                time.perf_counter() - start,
                "ran (autotuned)" if group.name in tuning else "ran (overridden)" if per_kernel[group.name] else "ran",
            )
        )
        planned.append((group, binding, schedule))
    out_root = dump_dir if dump_dir is not None and "target" in dump_stages else None  # else: the kernel cache
    devices = []
    for group, binding, schedule in planned:
        start = time.perf_counter()
        tile, spec = tile_program(group.name, group.describe(), binding.spec, schedule, config)
        log.append(PassLogEntry("tile", group.name, "tile", "tessera.BuildTileProgram", time.perf_counter() - start))
        passes_dir = dump_dir / "passes" / group.name if dump_dir is not None and "target" in dump_stages else None
        out_dir = out_root / "artifacts" / group.name if out_root is not None else None
        lowered = tessera_tvm.lower(tile, config, dump_dir=passes_dir, out_dir=out_dir, build=build)
        log.extend(PassLogEntry("target", group.name, r.phase, r.name, r.seconds, r.status) for r in lowered.pass_log)
        devices.append(DeviceKernel(group.name, binding, schedule, tile, lowered, spec))
    instance = Instance(kernel, config, dict(env), graph, devices, log)
    if dump_dir is not None and dump_stages:
        write_dumps(instance, dump_dir, dump_stages)
    return instance


def tile_program(name: str, describe: str, spec, schedule: Schedule, config) -> tuple[Any, Any]:
    """The TileLang PrimFunc of fused kernel ``name`` under ``schedule``, and the spec it was built from
    (on the CPU fp8 is held as f32). The autotuner's workers build programs here too, so the
    kernel cache entries they leave are the ones ``ts.compile`` finds."""
    tt = config.codegen_kind == "tt"  # Tenstorrent: TVM kind c, tile programs of kind tt
    try:
        tile_spec = cpu_storage(spec) if config.codegen_kind == "c" else spec
        tile = build_tile_program(tile_spec, schedule.tile_schedule(), "tt" if tt else config.target_kind)
    except UnsupportedTTOperationError as exc:
        raise UnsupportedTTOperationError(f"kernel {name} ({describe}): {exc}") from None
    except SpecError as exc:
        raise ScheduleError(f"kernel {name} on {config.name}: {exc}") from None
    return tile.with_attr("global_symbol", name), tile_spec


def cpu_storage(spec):
    """``spec`` with fp8 parameters held as float32 (``tessera_tvm.tile.CPU_WIDENED``). Exact: every
    fp8 value is a float32, and the kernel computes in float32 anyway; results are rounded to the
    graph's dtype here, as the kernel's own store would. (bf16 goes as its 16 bits: the C codegen
    passes it as uint16_t, and the CPU GEMM packs it for the CPU's bf16 dot products, tessera/cpu_gemm.h.)"""

    def widen(dtype):
        return "float32" if dtype in CPU_WIDENED else dtype

    changes = {
        f.name: widen(getattr(spec, f.name))
        for f in dataclasses.fields(spec)
        if f.name.startswith("dtype_")
        and f.name not in ("dtype_acc", "dtype_compute")
        and isinstance(getattr(spec, f.name), str)
    }
    if isinstance(spec, GemmSpec):
        changes["epilogue"] = tuple(
            dataclasses.replace(op, dtype=widen(op.dtype)) if op.operand is not None else op for op in spec.epilogue
        )
    if isinstance(spec, ElementwiseSpec):
        changes["operands"] = tuple((p.name, p.shape, widen(p.dtype)) for p in spec.operands)
    return dataclasses.replace(spec, **changes)


def write_dumps(instance: Instance, dump_dir: Path, stages: tuple[str, ...]) -> dict[str, Path]:
    """One file per stage (+ sched.json, pass log); per-pass IR is written by tessera_tvm.lower."""
    dump_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    header = (
        f"# {instance.kernel.name} for {instance.config.name} "
        f"(config {instance.config.fingerprint()}), shapes {instance.env}\n"
    )
    if "graph" in stages:
        text = (
            header
            + "# ---- traced ----\n"
            + instance.graph.text(traced=True)
            + "\n# ---- after the graph passes ----\n"
            + instance.graph.text()
        )
        written["graph"] = dump_dir / "graph.txt"
        written["graph"].write_text(text)
    if "sched" in stages:
        written["sched"] = dump_dir / "sched.txt"
        written["sched"].write_text(header + "\n".join(dk.schedule.text() for dk in instance.devices))
        (dump_dir / "sched.json").write_text(
            json.dumps([dk.schedule.as_dict() for dk in instance.devices], indent=2, sort_keys=True) + "\n"
        )
    if "tile" in stages:
        written["tile"] = dump_dir / "tile.py"
        written["tile"].write_text(header + "\n\n".join(dk.tile_text() for dk in instance.devices))
    if "target" in stages:
        ext = _SOURCE_EXT.get(instance.config.codegen_kind, "txt")
        written["target"] = dump_dir / f"target.{ext}"
        if instance.config.codegen_kind == "tt":  # + the five files per kernel under target/<kernel>/
            written["target"].write_text("\n".join(_tt_text(dk) for dk in instance.devices))
            for dk in instance.devices:
                (dump_dir / "target" / dk.name).mkdir(parents=True, exist_ok=True)
                for key in TT_ARTIFACTS:
                    src = Path(dk.lowered.artifacts[key])
                    (dump_dir / "target" / dk.name / src.name).write_text(src.read_text())
        else:
            written["target"].write_text(
                "\n".join(f"// ---- kernel {dk.name} ----\n{dk.lowered.source}" for dk in instance.devices)
            )
    log = "\n".join(json.dumps(e.as_dict()) for e in instance.log) + "\n"
    (dump_dir / "pass_log.jsonl").write_text(log)
    return written


# ---------------------------------------------------------------------------------------------
# ts.compile
# ---------------------------------------------------------------------------------------------


def _dump_settings(kernel: Kernel, dump, dump_dir) -> tuple[tuple[str, ...], Path | None]:
    env_dir = os.environ.get("TESSERA_DUMP_DIR")
    if dump is None or dump is False:
        if env_dir and dump is None:
            return STAGES, Path(env_dir) / kernel.name
        return (), None
    if dump is True or dump == "all":
        stages = STAGES
    else:
        items = [dump] if isinstance(dump, str) else list(dump)
        items = [s.strip() for item in items for s in str(item).split(",") if s.strip()]
        unknown = [s for s in items if s not in STAGES]
        if unknown:
            raise KernelError(
                f"dump= names unknown stage(s) {unknown}; stages are {', '.join(STAGES)}", location=user_location()
            )
        stages = tuple(s for s in STAGES if s in items)
    base = (
        Path(dump_dir)
        if dump_dir is not None
        else Path(env_dir) / kernel.name
        if env_dir
        else Path("tessera_dump") / kernel.name
    )
    return stages, base


def _autotuned(kernel: Kernel, config, env: dict[str, int], overrides: dict[str, Any], autotune) -> tuple[dict, dict]:
    """``overrides`` with the tuned fields of every fused kernel, and their ``sched.autotune`` summaries."""
    from .errors import AutotuneError
    from .tuning import AutotuneResult
    from .tuning import autotune as run_autotune

    if isinstance(autotune, AutotuneResult):
        result = autotune
        if (result.kernel, result.target, result.shapes) != (kernel.name, config.name, env):
            raise AutotuneError(
                f"autotune= holds the result for {result.kernel} on {result.target} with shapes {result.shapes}; "
                f"this compile is {kernel.name} on {config.name} with shapes {env}"
            )
    elif autotune is True or isinstance(autotune, Mapping):
        options = dict(autotune) if isinstance(autotune, Mapping) else {}
        result = run_autotune(kernel, config, shapes=env, schedule=overrides, **options)
    else:
        raise TypeError(f"autotune= takes True, a dict of ts.autotune options or an AutotuneResult, found {autotune!r}")
    merged = dict(overrides)
    for name, fields in result.schedule.items():
        merged[name] = {**dict(overrides.get(name, {})), **fields}
    return merged, {t.kernel: t.summary for t in result.kernels if t.summary is not None}


def compile(
    kernel: Kernel,
    target: str | Any = "cpu",
    *,
    shapes: Mapping[str, int] | None = None,  # noqa: A001
    schedule: Mapping[str, Any] | None = None,
    dump: Sequence[str] | str | bool | None = None,
    dump_dir: str | os.PathLike | None = None,
    build: bool = True,
    autotune: bool | Mapping[str, Any] | Any = False,
) -> CompiledKernel:
    """Compile ``kernel`` for ``target`` (a config name such as ``"cpu"``/``"hopper"`` or a YAML path).

    ``shapes`` binds symbolic dims (required for GPU targets; on the CPU unbound dims are taken from
    the arrays of each call). ``schedule`` overrides schedule fields (see :mod:`tessera.schedule`).
    ``dump`` lists stages to write (``graph``, ``sched``, ``tile``, ``target``; ``True`` for all) into
    ``dump_dir`` (default ``$TESSERA_DUMP_DIR/<kernel>`` or ``tessera_dump/<kernel>``); on the CPU without
    ``shapes`` the later stages are written when a call binds the dims. ``build=False`` skips nvcc/g++
    (sources only). ``autotune=True`` (or a dict of :func:`tessera.autotune` options, or the
    :class:`~tessera.tuning.AutotuneResult` of an earlier run) compiles with the tuned schedules, which
    come from the tuning cache when this kernel, shapes and config were tuned before.
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(f"ts.compile takes a @tessera.kernel, found {kernel!r}")
    config = tessera_tvm.load_config(target)
    env = kernel.check_shapes(shapes)
    overrides = {**kernel.schedule_overrides, **dict(schedule or {})}
    stages, base = _dump_settings(kernel, dump, dump_dir)
    if config.codegen_kind != "c":
        missing = [s for s in kernel.symbols if s not in env]
        if missing:
            raise ShapeError(
                f"target {config.name} compiles for fixed shapes; bind {', '.join(missing)} with "
                f"shapes={{{', '.join(repr(m) + ': ...' for m in missing)}}}",
                op="ts.compile",
                location=user_location(),
            )
    tuning = None
    if autotune is not False and autotune is not None:
        overrides, tuning = _autotuned(kernel, config, env, overrides, autotune)
    compiled = CompiledKernel(kernel, config, env, overrides, stages, base, build, tuning)
    if "graph" in stages and compiled._instance is None:
        # Dims are bound at the first call, which writes the other stages (and rewrites this one).
        base.mkdir(parents=True, exist_ok=True)
        graph = compiled._graph
        (base / "graph.txt").write_text(
            "# ---- traced ----\n" + graph.text(traced=True) + "\n# ---- after the graph passes ----\n" + graph.text()
        )
    return compiled
