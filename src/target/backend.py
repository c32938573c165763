"""The backend registry: one :class:`Backend` manifest per codegen kind (``cuda``, ``hip``, ``c``, ``tt``).

A backend is everything Tessera does differently for one codegen kind: the suffix of its source,
the generator of that source, the toolchain build, how a built kernel runs in this process (its
runner: memory, launch, timing for the autotuner, emulation), and the
facts the schedule and tile-program builders read (thread blocks or serial C blocks, which tile
program builds each kernel family). Each kind registers its manifest in ``src/target/<kind>/backend.py``;
code outside ``src/target/<kind>/`` asks :func:`backend_for` and reads the manifest's fields instead
of comparing kind names. Hooks are ``"module:attribute"`` strings, imported on first use
(:func:`resolve`), so that reading a manifest never imports TVM, a toolchain or the tile generators.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import TesseraError

__all__ = [
    "Backend",
    "UnknownBackendError",
    "backend_for",
    "backend_of_device",
    "backends_of_tvm_kind",
    "known_kinds",
    "register_backend",
    "resolve",
    "tvm_kinds",
]

#: The kinds shipped with Tessera, registered on the first look-up (their manifests live in these modules).
_BUILTIN = {
    "cuda": "tessera_tvm.target.cuda.backend",
    "hip": "tessera_tvm.target.hip.backend",
    "c": "tessera_tvm.target.cpu.backend",
    "tt": "tessera_tvm.target.tt.backend",
}


class UnknownBackendError(TesseraError, KeyError):
    """No backend is registered for a codegen kind."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Backend:
    """The manifest of one codegen kind: what it owns, as facts and hooks (``"module:attribute"``)."""

    kind: str  # the config's codegen.kind it serves (cuda, hip, c, tt)
    tvm_kind: str  # the TVM target kind its configs name (Tenstorrent: c, TVM has no tt kind)
    title: str  # what messages call it ("CUDA", "Tenstorrent")
    source_suffix: str  # suffix of the generated source file (".cu"); also names the target.<ext> dump
    device: str  # what Schedule.device says of its kernels: "gpu", "cpu" or "tenstorrent"
    # Kernels run as thread blocks (threads, shared memory, fragments, MMA); False: each block is
    # serial C code with local arrays (CPU, Tenstorrent's 32x32 tiles).
    thread_blocks: bool
    # family -> the tile-program builder ``(spec, schedule) -> PrimFunc`` of that kernel family.
    tile_programs: Mapping[str, str]
    # family -> the TileSchedule fields its tile program reads (schedules equal in them build one program).
    program_fields: Mapping[str, tuple[str, ...]]
    default_config: str  # the config whose schedule defaults a bare build_tile_program(spec, kind) uses
    # A fixed TileSchedule (``"module:attribute"``) its programs are built with (Tenstorrent); every
    # kernel family then takes the config's ``schedule:`` section as is (no per-family defaults).
    fixed_schedule: str | None = None
    # The module whose import registers this backend's own TIR passes (Tenstorrent: ``tt.*``); the
    # driver imports it with Tessera's shared passes, before a config names them. None: it has none.
    passes: str | None = None
    # Dtypes its programs cannot hold: a tile spec must not use them (the C codegen has no fp8 type).
    unheld_dtypes: tuple[str, ...] = ()
    # Hook ``spec -> spec`` giving the spec its programs are built from (CPU: fp8 held as float32).
    tile_spec: str | None = None
    # TileLang's registered source generator (``target.build.*``), called without compiling.
    source_generator: str | None = None
    # Hook ``device_mod -> program`` for a backend that emits several files instead of one source
    # (the program has .source, .metadata and .write(out_dir)); used instead of source_generator.
    program_generator: str | None = None
    # The artifacts (by .artifacts key) that stand for the source when program_generator writes files.
    program_files: tuple[str, ...] = ()
    # Config validation: hook ``(target, check) -> None`` checking the ``target:`` keys this kind
    # needs (CUDA: an sm_ arch), and the name of the config section only this kind takes with its
    # hook ``(data, target, resources, check) -> dict`` (Tenstorrent: ``tt:``, the arch table's limits).
    check_target: str | None = None
    section: str | None = None
    parse_section: str | None = None
    # Hook ``(lowered, out_dir) -> None`` that runs the config's compiler; None: no compiler here.
    build: str | None = None
    build_step: str = ""  # how a failing build is named in the error ("the CUDA build (nvcc, runtime library)")
    # Hook ``(device_mod, input_buffers, buffer_order) -> entry`` recording what the in-process
    # runner needs to call the kernel (CPU: the C symbol and its ctypes signature).
    entry: str | None = None
    # Hook ``(lowered, arrays, named) -> None`` that runs a lowered module in this process; None: it cannot.
    run: str | None = None
    run_needs: str | None = None  # the artifact the runner needs (CUDA: the runtime library)
    # Hook ``(plans, out_dir, flags) -> Path`` building a compiled kernel (a ModulePlan per set of
    # dims) into one tvm-ffi library (``__tvm_ffi_<kernel>``: every device kernel, intermediates
    # inside, the dims bound from the arguments); None: not yet for this kind.
    module: str | None = None
    # Hook ``(lowered) -> tuple[GpuLaunch]``: what a GPU kernel's host code launches, read out of it
    # (a backend whose module entry launches device functions itself); None: calls are C functions.
    device_launches: str | None = None
    # Hook ``(ModulePlan, libraries) -> function``: the entry built against what the device kernels
    # were built into (CPU: their libraries; CUDA: their cubins), kept in the kernel cache and loaded,
    # which ts.compile's calls run (None: they run kernel by kernel).
    linked_module: str | None = None
    # Hook ``(lowered) -> None`` reloading a built library after its files moved (cache, out_dir).
    reload: str | None = None
    # How ts.compile's kernels run in this process (``"module:attribute"`` of a
    # tessera_tvm.target.runner.Runner, read as ``.runner``): the values' memory, the launch, waiting
    # for queued work, the autotuner's bench, an emulator. The default runs nothing and says why.
    runner_hook: str = "tessera_tvm.target.runner:NOT_HERE"
    # Why a compiled kernel does not run here, after "was compiled for <config>" (None: the generic reason).
    not_runnable: str | None = None
    # What sched.pipeline says of how a serial block runs (no thread blocks): ``"module:attribute"`` of
    # ``(schedule) -> str`` (the CPU's serial loops, Tenstorrent's cores); None: nothing.
    block_note: str | None = None
    # The grid's blocks can be shared among the cores' threads when the config's parallel_grid feature
    # is on (tessera.MarkParallelGrid; the CPU).
    parallel_grid: bool = False
    # The DLPack device type a runtime module's tensors live on (ModulePlan.device): cpu or cuda.
    tensor_device: str = "cpu"
    # TVM's shared-memory scopes hold no barriers on this backend's GPUs: the barrier scopes do not
    # count as shared memory (HIP: TileLang keeps them apart).
    barriers_apart: bool = False
    fixed_shapes: bool = True  # ts.compile needs every dim bound (False: the CPU binds them per call)
    # Its tile programs take a symbolic dim in every extent they loop over and clamp at the edge: a
    # GEMM's K and N, a reduced axis, attention's sequence lengths (the CPU). False: only the dims
    # the grid runs over (a GEMM's M and batch, the rows of a row kernel, attention's batch).
    symbolic_extents: bool = False
    tuning_refused: str | None = None  # why ts.autotune has nothing to tune here (None: it tunes)
    # Relax: why this backend cannot be used from Relax (None: it can).
    relax_refused: str | None = None
    # Relax: the device kernels are C functions compiled into the host library (the host calls them
    # by symbol, export_library compiles them with the config's flags, the VM runs on the CPU).
    kernels_in_host: bool = False
    # Relax, from upstream apache-tvm (tessera_tvm.relax.bridge): hook ``(partitioned, kernels, config) ->
    # sources`` giving the sources an upstream module carries for its kernels; None: it carries none.
    upstream_sources: str | None = None
    # Relax: hook ``(gemm_spec, schedule) -> PackedPanels | None``: the layout in which its GEMM program
    # takes a constant B packed when the module is built (CPU: the micro-kernel's panels); None: it
    # reads every B as it is.
    packed_weights: str | None = None
    # Relax: dtypes its device code cannot take from a Relax graph (the C codegen has no such type).
    relax_unsupported_dtypes: tuple[str, ...] = ()
    # hook ``(flags, compiler) -> str``: what the config's compiler flags build for on this machine
    # (CPU: a digest of g++'s predefined macros, -march=native resolved, and whether kernels link the
    # runtime objects), part of every kernel's cache key; None: the flags alone say it (a GPU's arch is
    # in its config).
    isa_identity: str | None = None
    # The op table's element-wise ops (tessera_tvm/op_table.py tile names) its element-wise programs
    # take, and the EpilogueOp kinds its GEMM programs take, in the order its refusals list them;
    # None: every one. An op left out is refused by name when a program would need it.
    unary_ops: tuple[str, ...] | None = None
    binary_ops: tuple[str, ...] | None = None
    epilogue_ops: tuple[str, ...] | None = None
    # The op table's anchors (AnchorDef names) whose family it lists in tile_programs but whose programs
    # refuse them by name: its configs' graph phase decomposes them first (Tenstorrent: softmax and the
    # norms over the last axis, tessera.DecomposeRowOps). A family it does not list it builds for no anchor.
    decomposed_anchors: tuple[str, ...] = ()

    def hook(self, name: str) -> Callable[..., Any] | None:
        """The hook field ``name`` imported (None when the backend has none)."""
        where = getattr(self, name)
        return resolve(where) if where is not None else None

    @property
    def runner(self) -> Any:
        """The backend's :class:`~tessera_tvm.target.runner.Runner` (its module imported on first use)."""
        return resolve(self.runner_hook)

    def tile_program(self, family: str) -> Callable[..., Any]:
        """The tile-program builder ``(spec, schedule) -> PrimFunc`` of kernel ``family``."""
        try:
            return resolve(self.tile_programs[family])
        except KeyError:
            raise TesseraError(
                f"the {self.kind} backend has no tile program for {family!r} kernels; "
                f"it builds {', '.join(self.tile_programs)}"
            ) from None


def resolve(where: str) -> Any:
    """``"package.module:attribute"`` -> the attribute (the module imported on first use)."""
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute)


_BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    """Register ``backend`` for its kind (a kind registered again is replaced); returns it."""
    if not isinstance(backend, Backend):
        raise TypeError(f"register_backend takes a Backend, found {backend!r}")
    _BACKENDS[backend.kind] = backend
    return backend


def known_kinds() -> tuple[str, ...]:
    """The codegen kinds with a backend (the shipped ones and any registered since)."""
    _load_builtin()
    return tuple(_BACKENDS)


def _load_builtin() -> None:
    for kind, module in _BUILTIN.items():
        if kind not in _BACKENDS:
            importlib.import_module(module)  # its import registers the manifest


def backend_of_device(device: str) -> Backend:
    """The first backend whose kernels run on ``device`` (``Backend.device``, what ``Schedule.device``
    says): backends sharing a device agree on the facts a schedule's text reads."""
    _load_builtin()
    for backend in _BACKENDS.values():
        if backend.device == device:
            return backend
    raise UnknownBackendError(
        f"no backend runs on device {device!r}; known: {sorted({b.device for b in _BACKENDS.values()})}"
    )


def tvm_kinds(*, thread_blocks: bool) -> frozenset[str]:
    """The TVM target kinds of the backends whose kernels run as thread blocks (or, False, as serial C)."""
    _load_builtin()
    return frozenset(b.tvm_kind for b in _BACKENDS.values() if b.thread_blocks == thread_blocks)


def backends_of_tvm_kind(tvm_kind: str) -> tuple[Backend, ...]:
    """The backends whose configs name TVM target kind ``tvm_kind`` (``c``: the CPU and Tenstorrent)."""
    _load_builtin()
    return tuple(b for b in _BACKENDS.values() if b.tvm_kind == tvm_kind)


def backend_for(config_or_kind: Any) -> Backend:
    """The backend of a TargetConfig (keyed on its ``codegen.kind``) or of a codegen kind string.

    The Tenstorrent config has TVM target kind ``c`` but codegen kind ``tt``: the codegen kind
    decides. An unknown kind raises :class:`UnknownBackendError` naming it and the known kinds.
    """
    kind = getattr(config_or_kind, "codegen_kind", config_or_kind)
    backend = _BACKENDS.get(kind) if isinstance(kind, str) else None
    if backend is None:
        _load_builtin()
        backend = _BACKENDS.get(kind) if isinstance(kind, str) else None
    if backend is None:
        where = f" (config {config_or_kind.name!r})" if hasattr(config_or_kind, "name") else ""
        raise UnknownBackendError(
            f"no backend for codegen kind {kind!r}{where}; known kinds: {', '.join(sorted(_BACKENDS))}. "
            "A new kind registers a Backend in src/target/<kind>/backend.py (tessera_tvm.target.backend)"
        )
    return backend
