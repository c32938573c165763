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
Compiled kernels are cached in memory per (kernel and its sharding, shapes, schedule overrides, config
fingerprint).

Dumps (``dump=[...]`` or the environment variable ``TESSERA_DUMP_DIR``) write one file per stage,
``graph.txt``, ``sched.txt`` (+ ``sched.json``), ``tile.py``, ``target.<ext>``, the IR after every
TVM pass under ``passes/<fused kernel>/`` and the build outputs under ``artifacts/<fused kernel>/``.

The pieces: this module is the API (``compile``, :class:`CompiledKernel`, the in-memory cache);
:mod:`tessera.instance` holds what a compile produces and runs it (``Instance``, ``DeviceKernel``,
``Memory``, argument checks); :mod:`tessera.build` compiles one instance (``_compile_instance``,
``tile_program``); :mod:`tessera.dumps` writes the dumps. Their names stay importable from here.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import tessera_tvm
from tessera_tvm import metrics as _metrics
from tessera_tvm import trace as _trace
from tessera_tvm.graph import GraphIR
from tessera_tvm.target.backend import backend_for

from .build import _compile_instance, _graph_log, cpu_storage, tile_program  # noqa: F401
from .dumps import _dump_settings, program_text, write_dumps  # noqa: F401
from .errors import KernelError, NotRunnableError, ShapeError, user_location
from .instance import (  # noqa: F401  (re-exported: imported from tessera.compiler elsewhere)
    HOST,
    DeviceKernel,
    Instance,
    Launch,
    Memory,
    PassLogEntry,
    _astype_hint,
    _bind,
    _check_args,
    _numpy_dtype,
)
from .kernel import STAGES, Kernel
from .repro import capture_call_failure
from .schedule import Schedule, TuningSummary, split_overrides

__all__ = ["CompiledKernel", "DeviceKernel", "PassLogEntry", "compile", "tile_program"]


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
        self._graph = kernel.graph(shapes, target=config)
        self._instance: Instance | None = None
        self._ran: Instance | None = None  # the instance the last observed call ran (metrics)
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
        """Whether calling it runs here (its backend's runner says): CPU configs, and CUDA configs with a
        runtime library and a GPU."""
        return backend_for(self.config).runner.runnable(self._instance)

    # Building ----------------------------------------------------------------------------------
    def _instantiate(self, env: dict[str, int]) -> Instance:
        key = (
            self.kernel.fn,
            self.kernel.variant,  # a rank's sharding: the same function at the same shapes, another graph
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

    def build_module(
        self, out_dir: str | Path | None = None, shapes: Sequence[Mapping[str, int]] | None = None
    ) -> Path:
        """Build this kernel into one library exporting the tvm-ffi entry ``__tvm_ffi_<kernel>``:
        ``tvm_ffi.load_module(path)[kernel](*inputs, *outputs)`` with DLPack tensors (numpy through
        ``tvm_ffi.from_dlpack``, torch tensors as they are), or TVM's ``tvm.runtime.load_module``.
        Returns the library's path (in ``out_dir``, or a new scratch directory). CPU and CUDA configs
        (a CUDA library embeds its cubins and runs on torch CUDA tensors or kDLCUDA DLTensors); not
        HIP yet.

        ``shapes``: several sets of dims (each over the compiled ``shapes``), e.g. ``[{"M": 64},
        {"M": 128}]``. The library holds a kernel for each and binds the dims from the arguments'
        shapes at each call. None: the last instantiated shapes."""
        from tessera_tvm.kernel_store import scratch_directory

        from .module import module_plans

        build = self._module_builder()  # first: says which targets build libraries, before any planning
        plans = module_plans(self, shapes, "build_module()")
        out = Path(out_dir) if out_dir is not None else scratch_directory(f"tessera_{self.kernel.name}_")
        return build(plans, out)

    def _module_builder(self):
        """``(plans, out_dir) -> library``: the backend's ``module`` hook with the config's flags."""
        backend = backend_for(self.config)
        build = backend.hook("module")
        if build is None:
            raise NotRunnableError(
                f"{self.kernel.name}: build_module() is not supported for {self.config.name} ({backend.title}) yet; "
                "CPU and CUDA configs build tvm-ffi libraries"
            )
        flags = tuple(self.config.codegen_dict["flags"])
        return lambda plans, out_dir: build(plans, out_dir, flags)

    def _instance_for(self, env: dict[str, int]) -> Instance:
        """The instance of ``env`` (compiled if new), leaving the instance calls and inspect_ir use alone."""
        known = self._instances.get(tuple(sorted(env.items())))
        if known is not None:
            return known
        current = self._instance
        try:
            return self._instantiate(env)
        finally:
            self._instance = current if current is not None else self._instance

    def export(self, out_dir: str | Path, shapes: Sequence[Mapping[str, int]] | None = None) -> dict[str, Path]:
        """Write the AOT bundle to ``out_dir``: ``<kernel>.so`` (the tvm-ffi library of
        :meth:`build_module`, ``shapes`` as there), ``<kernel>.h`` (a C header declaring its entry),
        ``metadata.json`` (the entry, each argument's dtype and shape, each device kernel's metadata)
        and ``<kernel>.tsrb`` (the image the tsr* C runtime loads)."""
        from .module import export_bundle

        return export_bundle(self, out_dir, shapes)

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
        keys = backend_for(self.config).program_files
        if keys:  # several files per device kernel (Tenstorrent's five)
            return "\n".join(program_text(dk, keys) for dk in devices)
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
            flops, nbytes = dk.work
            for meta in dk.lowered.metadata:
                out.append(
                    {
                        **meta,
                        "fused_kernel": dk.name,
                        "schedule": dk.schedule.as_dict(),
                        "flops": flops,
                        "bytes": nbytes,
                    }
                )
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
        """Run on numpy arrays or torch CPU tensors (CPU configs), or on torch CUDA tensors or numpy arrays
        (CUDA configs on a GPU); numpy in gives numpy out, torch in gives torch out. Returns the result(s)."""
        try:
            if _trace.active() is not None or _metrics.active() is not None:
                return self._observed_call(arrays)
            return self._call(arrays)
        except Exception as exc:  # a crash capture (tessera.repro); not for mistakes in the arguments
            capture_call_failure(exc, self, arrays)
            raise

    def _observed_call(self, arrays: Sequence[Any]) -> Any:
        """A call under a trace (spans for the checks and each device kernel) or with metrics on (one
        row with its wall time and rates)."""
        recorder = _metrics.active()
        self._ran = self._instance  # the fast path runs the last instance; the others say which ran
        start = time.perf_counter()
        result = self._traced_call(arrays) if _trace.active() is not None else self._call(arrays)
        backend_for(self.config).runner.synchronize()  # torch in, torch out: a GPU's kernels may still be queued
        seconds = time.perf_counter() - start
        instance = self._ran
        if recorder is not None and instance is not None:
            devices = instance.devices
            flops = sum(dk.work[0] for dk in devices)
            nbytes = sum(dk.work[1] for dk in devices)
            grids = [g for dk in devices for g in dk.grids]
            row = _metrics.call_row(self.kernel.name, self.config.name, instance.env, seconds, flops, nbytes, grids)
            row["time"] = time.time()
            recorder.record(row)
        return result

    def _call(self, arrays: Sequence[Any]) -> Any:
        # numpy arrays exactly as the last instance takes them (dtype, shape, C order) run its tvm-ffi
        # entry without more checks: the entry checks them too (CPU configs; host_entry is None elsewhere).
        if self._instance is not None:
            result = self._instance._run_entry(arrays, exact_only=True)
            if result is not None:
                return result
        runner = backend_for(self.config).runner
        if runner.device_memory:  # the compiled instance on a device: its built kernels, then the arrays
            instance = self._require_instance("running")
            runner.check_built(instance, self.build)
            return runner.run(instance, _check_args(self.kernel, arrays, self.shapes, allow_torch=True))
        if not runner.runnable(self._instance):
            raise NotRunnableError(runner.refusal(self.kernel.name, self.config))
        arrays, env = self._checked(arrays)
        return runner.run(self._instance_of(env), arrays)

    def _checked(self, arrays: Sequence[Any]) -> tuple[Any, dict[str, int]]:
        """The arrays checked against the kernel, and the dims they bind."""
        arrays = _check_args(self.kernel, arrays, self.shapes, allow_torch_cpu=True)
        return arrays, _bind(self.kernel, arrays, self.shapes)

    def _instance_of(self, env: dict[str, int]) -> Instance:
        """The instance for dims ``env`` (compiled on first use); the one a call runs."""
        instance = self._instances.get(tuple(sorted(env.items()))) or self._instantiate(env)
        self._ran = instance
        return instance

    def _traced_call(self, arrays: Sequence[Any]) -> Any:
        """``__call__`` under a trace (tessera_tvm/trace.py): the call, its argument checks and, on
        the host, each device kernel (run one by one, each a span, instead of the tvm-ffi entry)."""
        with _trace.span(f"call {self.kernel.name}", "host", target=self.config.name):
            runner = backend_for(self.config).runner
            if runner.device_memory or not runner.runnable(self._instance):
                return self._call(arrays)  # one span for the call (and NVTX ranges on a GPU)
            with _trace.span("check arguments", "host"):
                arrays, env = self._checked(arrays)
            instance = self._instance_of(env)
            if arrays and not all(isinstance(a, np.ndarray) for a in arrays):
                return instance.run(arrays)  # torch CPU tensors go through the entry: one span for the call
            return instance.run(arrays, memory=HOST)

    def emulate(self, *arrays: Any, cache_dir: str | os.PathLike | None = None) -> Any:
        """Run a Tenstorrent compile in the tt-metal emulator (``tessera_tvm.target.tt.emulate``, g++
        needed): each device kernel's ``tt.plan.json`` in order, on numpy arrays; returns numpy arrays
        in the kernel's result dtypes. Slow (it compiles and runs every core's kernels on the host):
        for checking, not for speed."""
        in_emulator = backend_for(self.config).runner.emulator(self.kernel.name, self.config, cache_dir)
        checked = _check_args(self.kernel, arrays, self.shapes)
        instance = self._instance_of(_bind(self.kernel, checked, self.shapes))
        return instance.run(checked, memory=HOST, device_run=in_emulator)


_CACHE: dict[tuple, Instance] = {}


def clear_cache() -> None:
    """Forget every compiled kernel (the in-memory cache)."""
    _CACHE.clear()


# ---------------------------------------------------------------------------------------------
# ts.compile
# ---------------------------------------------------------------------------------------------


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
    from .distributed import ShardedKernel, _process_rank
    from .sharded_runtime import ShardedCompiledKernel

    if isinstance(kernel, ShardedKernel):  # each rank: the kernel for its local shapes, then the collectives
        local_shapes = kernel.local_shapes(shapes) if shapes else None
        config = tessera_tvm.load_config(target)
        rank = _process_rank()
        local_kernel = kernel.local_kernel_for(rank, shapes, config)
        local = compile(
            local_kernel,
            target,
            shapes=local_shapes,
            schedule=schedule,
            dump=dump,
            dump_dir=dump_dir,
            build=build,
            autotune=autotune,
        )
        own = None if local_kernel is kernel.local_kernel else rank  # a graph of this rank's own
        return ShardedCompiledKernel(kernel, local, config, shapes, own)
    if not isinstance(kernel, Kernel):
        raise TypeError(f"ts.compile takes a @tessera.kernel, found {kernel!r}")
    with _trace.span(f"compile {kernel.name}", "host", target=str(target)):
        return _compile(kernel, target, shapes, schedule, dump, dump_dir, build, autotune)


def _compile(kernel, target, shapes, schedule, dump, dump_dir, build, autotune) -> CompiledKernel:
    config = tessera_tvm.load_config(target)
    env = kernel.check_shapes(shapes)
    overrides = {**kernel.schedule_overrides, **dict(schedule or {})}
    stages, base = _dump_settings(kernel, dump, dump_dir)
    if backend_for(config).fixed_shapes:
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
