"""A kernel compiled for one target with every dim bound, and running it on memory.

An :class:`Instance` holds the Graph IR and, per fused kernel, a :class:`DeviceKernel` (its binding,
schedule, TileLang PrimFunc and lowered module), with the :class:`PassLogEntry` records of the compile
that made it. :meth:`Instance.run` runs the fused kernels in order through their :class:`Launch`
plans, keeping the values in a :class:`Memory`: numpy on the host (:data:`HOST`), torch tensors on a
GPU (the CUDA runner's ``TorchMemory``, ``tessera_tvm.target.cuda.runner``). The arrays of a call are checked against the kernel's parameters
(``_check_args``) and its symbolic dims bound from their shapes (``_bind``) here too;
:mod:`tessera.build` makes instances and :mod:`tessera.compiler` caches them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessera_tvm import trace as _trace
from tessera_tvm.graph import GraphIR, KernelBinding
from tessera_tvm.target.runner import readable
from tessera_tvm.tile import dtype_bytes

from .errors import ArgumentError
from .kernel import Kernel
from .schedule import Schedule


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

    @functools.cached_property
    def work(self) -> tuple[int, int]:
        """(FLOPs, bytes) of one run: the GEMM's 2MNK or attention's 4 B H Sq Skv D (half of it
        causal), 0 FLOPs for the memory-bound families; bytes are every parameter read or written
        once. Kept in the kernel's metadata (``flops``, ``bytes``) and behind the metrics' rates."""
        spec = self.spec
        nbytes = sum(math.prod(p.shape) * dtype_bytes(p.dtype) for p in spec.params())
        if spec.family == "gemm":
            return int(spec.flops), int(nbytes)
        if spec.family == "attention":
            flops = 4 * spec.B * spec.H * spec.S_q * spec.S_kv * spec.D
            return int(flops // 2 if spec.causal else flops), int(nbytes)
        return 0, int(nbytes)

    @property
    def grids(self) -> list[list[int]]:
        return [list(m["launch"]["grid"]) for m in self.lowered.metadata if "launch" in m]

    def tile_text(self) -> str:
        return f"# kernel {self.name}: {self.spec!r}\n{self.tile.script()}"

    def run(self, arrays: dict[str, np.ndarray]) -> None:
        """Run on the CPU with arrays by spec parameter name (outputs written in place)."""
        # The tile program's buffers are named after the spec's parameters, in the same order.
        self.lowered(*[arrays[p.name] for p in self.spec.params()])


#: Dtypes numpy hands to DLPack as they are (numpy bf16 and fp8 arrays go kernel by kernel).
_NUMPY_DLPACK = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")


def _bf16_through_torch(array: np.ndarray) -> Any:
    """A bf16 numpy array (ml_dtypes, which has no DLPack) as a torch bf16 tensor over the same memory,
    which tvm-ffi takes: its bits viewed as uint16, then as bf16 (no copy)."""
    import torch

    return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)


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

    @functools.cached_property
    def host_entry(self) -> tuple[Any, Any, bool] | None:
        """``(function, plan, bf16)``: the tvm-ffi entry that runs every device kernel in one call (its
        backend's ``linked_module``, CPU), and ``bf16`` the positions of its bf16 arguments (inputs,
        then outputs) where numpy arrays can be handed to it, False where they cannot: those of
        DLPack's dtypes go as they are, bf16 ones as torch views of the same memory (ml_dtypes has
        no DLPack); fp8 cannot (the CPU programs take it as float32). None where there is no entry:
        another backend, a kernel not built, or a plan the entry cannot run."""
        from tessera_tvm.target.backend import backend_for
        from tessera_tvm.target.module import ModuleError

        from .module import module_plan

        link = backend_for(self.config).hook("linked_module")
        libraries = [dk.lowered.artifacts.get("library") for dk in self.devices]
        if link is None or not libraries or any(lib is None for lib in libraries):
            return None
        try:
            plan = module_plan(self)
        except ModuleError:
            return None
        dtypes = [t.dtype for t in (*plan.inputs, *plan.outputs)]
        takes_numpy = set(dtypes) <= {*_NUMPY_DLPACK, "bfloat16"}
        return link(plan, libraries), plan, takes_numpy and tuple(i for i, d in enumerate(dtypes) if d == "bfloat16")

    @functools.cached_property
    def gpu_entry(self) -> tuple[Any, Any] | None:
        """``(function, plan)``: the tvm-ffi library that runs every device kernel of a GPU instance
        in one call (its backend's ``linked_module``: CUDA), built into the kernel cache on first
        use. None where a kernel has no cubin or the plan cannot be a library; its kernels then run
        one by one through their runtime libraries."""
        from tessera_tvm.target.backend import backend_for
        from tessera_tvm.target.module import ModuleError

        from .module import module_plan

        backend = backend_for(self.config)
        link = backend.hook("linked_module")
        if link is None or not backend.runner.device_memory:
            return None
        try:
            plan = module_plan(self)
        except ModuleError:
            return None
        binaries = [call.binary for call in plan.calls]
        if not binaries or any(b is None for b in binaries):
            return None
        return link(plan, binaries), plan

    def _run_entry(self, arrays: Sequence[Any], exact_only: bool = False) -> Any:
        """Run through :attr:`host_entry` when the arrays are what it takes as they are: numpy arrays
        (of dtypes numpy hands to DLPack) or torch CPU tensors, of the parameters' dtypes and shapes,
        contiguous. The results are of the kind given. None otherwise (the caller runs kernel by kernel).
        ``exact_only``: the arrays were not checked yet, so only numpy arrays whose dtype, shape and
        order this checks here run."""
        entry = self.host_entry
        if entry is None:
            return None
        function, plan, bf16 = entry
        if len(arrays) != len(plan.inputs):
            return None
        if arrays and all(type(a) is np.ndarray for a in arrays):
            if bf16 is False:
                return None
            for array, t in zip(arrays, plan.inputs, strict=True):
                if not (array.dtype.name == t.dtype and array.shape == t.shape and array.flags.c_contiguous):
                    return None
            arrays = [readable(a) for a in arrays]
            outs = [np.empty(t.shape, _numpy_dtype(t.dtype)) for t in plan.outputs]
            args = [*arrays, *outs]
            for i in bf16:
                args[i] = _bf16_through_torch(args[i])
        elif exact_only:  # the caller has not checked the arguments: numpy arrays only
            return None
        else:  # torch CPU tensors (_check_args let nothing else through)
            import torch

            from .gpu import torch_dtype

            outs = [torch.empty(t.shape, dtype=torch_dtype(t.dtype)) for t in plan.outputs]
            args = [*arrays, *outs]
        function(*args)
        return tuple(outs) if self.graph.simplified.tuple_output else outs[0]

    def run(
        self,
        arrays: Sequence[Any],
        memory: Memory | None = None,
        device_run: Callable[[DeviceKernel, dict[str, Any]], None] | None = None,
        collective: Callable[..., Any] | None = None,
    ) -> Any:
        """Run the fused kernels in order on ``arrays`` (the graph's parameters) and return the graph's
        output(s). ``memory`` holds the values: numpy on the CPU, torch on a GPU (``tessera.gpu``).
        On the host, one call of the tvm-ffi entry runs them all where it can (:attr:`host_entry`).
        ``device_run(device, named)`` runs one device kernel instead of :meth:`DeviceKernel.run`
        (the Tenstorrent emulator: ``CompiledKernel.emulate``). A sharded kernel's collectives
        between its kernels (``graph.simplified.collectives``) are computed by
        ``collective(c, value, *others)`` when a kernel first reads them (``tessera.distributed``)."""
        device_run = device_run or DeviceKernel.run
        steps = {c.var: c for c in self.graph.simplified.collectives}
        if steps and collective is None:
            raise ArgumentError(
                f"{self.kernel.name}: its kernels exchange values through collectives "
                f"({', '.join(f'{c.kind} over {c.axis!r}' for c in steps.values())}); run it through "
                "ts.compile(ts.shard(...)) under torch.distributed"
            )
        if memory is None and not steps:
            result = self._run_entry(arrays)
            if result is not None:
                return result
            if arrays and not isinstance(arrays[0], np.ndarray):
                raise ArgumentError(
                    f"{self.kernel.name}: torch CPU tensors run through the kernel's tvm-ffi entry, which "
                    f"{self.kernel.name} on {self.config.name} does not have (its values are held in another "
                    "dtype on the CPU); pass numpy arrays"
                )
        memory = memory or HOST
        values: dict[Any, Any] = dict(zip(self.graph.params, arrays, strict=True))

        def value(var):
            if var not in values and var in steps:  # a collective between the kernels
                c = steps[var]
                values[var] = collective(c, value(c.source), *(value(o) for o in c.others))
            return values[var]

        traced = _trace.active() is not None
        for launch in self.launches:
            for var, *_ in launch.inputs:
                value(var)
            if traced:
                self._run_traced(launch, values, memory, device_run)
                continue
            named = {name: memory.hold(values[var], dtype, shape) for var, name, dtype, shape in launch.inputs}
            name, dtype, shape = launch.output
            named[name] = out = memory.empty(shape, dtype)
            device_run(launch.device, named)
            var, dtype, shape = launch.result
            values[var] = memory.result(out, dtype, shape)
        params = set(self.graph.params)
        results = [memory.copy(values[o]) if o in params else value(o) for o in self.graph.outputs]
        return tuple(results) if self.graph.simplified.tuple_output else results[0]

    @staticmethod
    def _run_traced(launch: Launch, values: dict[Any, Any], memory: Memory, device_run) -> None:
        """One launch of :meth:`run` under a trace: its copies and its device kernel as spans."""
        device = launch.device
        with _trace.span(f"copy in {device.name}", "copy"):
            named = {name: memory.hold(values[var], dtype, shape) for var, name, dtype, shape in launch.inputs}
            name, dtype, shape = launch.output
            named[name] = out = memory.empty(shape, dtype)
            memory.sync()
        phase = _trace.FAMILY_PHASE.get(device.spec.family, "host")
        with _trace.span(device.name, phase, family=device.spec.family, flops=getattr(device.spec, "flops", None)):
            device_run(device, named)
            memory.sync()  # a GPU kernel's span ends when it has run, not when it was queued
        var, dtype, shape = launch.result
        with _trace.span(f"copy out {device.name}", "copy"):
            values[var] = memory.result(out, dtype, shape)
            memory.sync()


class Memory:
    """Where :meth:`Instance.run` keeps arrays. The host's, numpy: fp8 travels as float32 (what the
    CPU tile programs take) and each result is rounded to its graph dtype, as the kernel's store would."""

    def hold(self, value: Any, dtype: str, shape: tuple[int, ...]) -> Any:
        """``value`` as a contiguous ``dtype`` array of ``shape``, ready to pass to a kernel."""
        return readable(np.ascontiguousarray(value, dtype=_numpy_dtype(dtype)).reshape(shape))

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        return np.empty(shape, dtype=_numpy_dtype(dtype))

    def result(self, out: Any, dtype: str, shape: tuple[int, ...]) -> Any:
        """A kernel's output buffer as the graph value it computes."""
        return out.astype(_numpy_dtype(dtype), copy=False).reshape(shape)

    def copy(self, value: Any) -> Any:
        return value.copy()

    def sync(self) -> None:
        """Wait for the work queued on this memory's device (the host's runs at once)."""


HOST = Memory()


@functools.cache
def _numpy_dtype(tvm_dtype: str):
    from .types import dtype as as_dtype

    return as_dtype(tvm_dtype).numpy


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


def _check_args(
    kernel: Kernel,
    arrays: Sequence[Any],
    shapes: dict[str, int],
    *,
    allow_torch: bool = False,
    allow_torch_cpu: bool = False,
) -> list[Any]:
    """The arrays, checked against the kernel's parameters and made contiguous.

    With ``allow_torch`` (CUDA configs) torch CUDA tensors are accepted next to numpy arrays; with
    ``allow_torch_cpu`` (CPU configs) torch CPU tensors, all arguments or none."""
    from . import gpu

    names = ", ".join(n for n, _ in kernel.params)
    if len(arrays) != len(kernel.params):
        raise ArgumentError(f"{kernel.name} takes {len(kernel.params)} arrays ({names}), got {len(arrays)}")
    if allow_torch_cpu and 0 < sum(gpu.is_torch_tensor(a) for a in arrays) < len(arrays):
        raise ArgumentError(
            f"{kernel.name}: pass all arguments as torch CPU tensors or all as numpy arrays, not a mix "
            "(the results come back as the kind given)"
        )
    out = []
    for (name, ttype), arr in zip(kernel.params, arrays, strict=True):
        torch_arg = (allow_torch or allow_torch_cpu) and gpu.is_torch_tensor(arr)
        if torch_arg:
            if allow_torch and not gpu.on_gpu(arr):
                raise ArgumentError(
                    f"{kernel.name}: argument {name} is a torch tensor on {arr.device}; expected a CUDA tensor "
                    f"or a numpy array {ttype.describe()}: move it with {name}.cuda()"
                )
            if allow_torch_cpu and arr.device.type != "cpu":
                raise ArgumentError(
                    f"{kernel.name}: argument {name} is a torch tensor on {arr.device}, but this kernel runs on "
                    f"the CPU: pass {name}.cpu() or a numpy array {ttype.describe()}"
                )
            if arr.dtype != gpu.torch_dtype(ttype.dtype.tvm):
                wanted = gpu.torch_dtype(ttype.dtype.tvm)
                raise ArgumentError(
                    f"{kernel.name}: argument {name} has dtype {arr.dtype}, expected {ttype.dtype} "
                    f"({wanted}); convert it: {name}.to({wanted})"
                )
        elif not isinstance(arr, np.ndarray):
            expected = (
                "a torch CUDA tensor or a numpy array"
                if allow_torch
                else "a numpy array or a torch CPU tensor"
                if allow_torch_cpu
                else "a numpy array"
            )
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
