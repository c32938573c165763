"""``tessera_tvm.lower``: a TileLang tile program + a target config -> source, artifacts, metadata.

    art = tessera_tvm.lower(gemm, "hopper", dump_dir="build/dump", out_dir="build/gemm")
    art.source        # CUDA / HIP / C source of the device kernels
    art.host_ir       # the host IRModule as TVMScript
    art.metadata      # one dict per device kernel (tile, fragments, resources, launch, epilogue)
    art.pass_log      # one PassRecord per pass: phase, name, seconds, status
    art.artifacts     # files written: source, cubin/ptx (nvcc), .so (CPU), metadata.json, passes.txt
    art(a, b, c)      # CPU configs: run the kernel on numpy arrays

With ``dump_dir`` the input and the IR after every pass are written as numbered TVMScript files
(``000_input.py``, ``001_tl.NestedLoopChecker.py``, ...) next to a timing table (``timing.txt``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ._tvm import is_jit_kernel, jit_program, load_json, pass_context_with, tvm
from .capture import collecting_logs, pass_context_record, start_capture
from .config import TargetConfig, load_config
from .errors import LoweringError, TesseraError, ToolchainError
from .pipeline import PassRecord, PassRecorder, recording, run_phase
from .target.backend import backend_for
from .transform.analysis import is_device_kernel


@contextmanager
def step(what: str, kernel: str, config: TargetConfig) -> Iterator[None]:
    """Turn a failure of ``what`` (a codegen, a build) into a ``LoweringError`` naming the kernel,
    the config and the step; Tessera's own errors pass through as they are."""
    try:
        yield
    except TesseraError:
        raise
    except Exception as exc:
        from .pipeline import in_config_terms, short_tvm_message

        message = in_config_terms(short_tvm_message(exc), config)
        raise LoweringError(f"{what} failed on kernel {kernel!r} (config {config.name!r}):\n{message}") from exc


def split_host_device(mod):
    """Split a lowered module into (host module, device module)."""
    device = tvm.tirx.transform.Filter(is_device_kernel)(mod)
    host = tvm.tirx.transform.Filter(lambda f: not is_device_kernel(f))(mod)
    return host, device


def _as_module(program) -> tuple[Any, str]:
    if isinstance(program, tvm.tirx.PrimFunc):
        name = str(program.attrs["global_symbol"]) if program.attrs and "global_symbol" in program.attrs else "main"
        return tvm.IRModule({name: program}), name
    if isinstance(program, tvm.IRModule):
        names = sorted(str(gv.name_hint) for gv in program.get_global_vars())
        return program, names[0] if len(names) == 1 else "module"
    raise TesseraError(
        f"tessera_tvm.lower expects a TileLang PrimFunc (@T.prim_func), a tvm.IRModule or a @tilelang.jit "
        f"kernel, found {type(program).__name__}"
    )


def _jit_program(kernel, args: tuple, kwargs: dict | None, config: TargetConfig):
    """The program and pass configs of a @tilelang.jit kernel; building it is the user's code, so its
    failure says which call failed."""
    try:
        return jit_program(kernel, args, kwargs)
    except Exception as exc:
        name = getattr(getattr(kernel, "func", None), "__name__", type(kernel).__name__)
        hint = "" if args or kwargs else "; pass the arguments you would call it with: jit_args=(...)"
        raise TesseraError(
            f"building the program of @tilelang.jit kernel {name!r} for config {config.name!r} failed: "
            f"{type(exc).__name__}: {exc}{hint}"
        ) from exc


@dataclass
class LoweredModule:
    """What lowering one tile program for one config produced."""

    name: str
    config: TargetConfig
    source: str
    host_mod: Any
    device_mod: Any
    metadata: list[dict[str, Any]]
    pass_log: list[PassRecord]
    artifacts: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    from_cache: bool = False  # True when the persistent kernel cache served this compile
    _timing: str = ""
    _kernel: Any = None  # the kernel loaded for in-process calls (CPU: a CpuKernel)
    _entry: tuple[str, list, list] | None = None  # its entry (CPU: C symbol, KernelParams, program's buffer order)
    _tt_program: Any = None  # a backend's multi-file program (Tenstorrent: the five artifacts, target/tt/codegen)
    _program_order: list[str] = field(default_factory=list)  # the tile program's buffer parameters, in order
    _cuda_kernel: Any = None
    _program_shapes: dict[str, list] = field(default_factory=dict)  # buffer -> dims (int, or a symbolic dim's name)

    @property
    def entry(self) -> tuple[str, list, list] | None:
        """What calls the kernel: on the CPU its C symbol, its parameters in the C order
        (``KernelParam``s: buffers, then symbolic dims as scalars) and the tile program's buffer order."""
        return self._entry

    @property
    def host_ir(self) -> str:
        return self.host_mod.script()

    @property
    def device_ir(self) -> str:
        return self.device_mod.script()

    def timing_table(self) -> str:
        return self._timing

    def dims(self, *arrays, **named) -> dict[str, int]:
        """The value of each symbolic dim of the program, read from the arrays' shapes (arrays as
        for a call); a dim given two different sizes is an error naming both buffers."""
        found: dict[str, tuple[int, str]] = {}
        ordered = self._ordered(self._program_order, arrays, dict(named))
        for buffer, array in zip(self._program_order, ordered, strict=True):
            declared = self._program_shapes.get(buffer, [])
            shape = tuple(getattr(array, "shape", ()))
            if len(shape) != len(declared):
                raise TesseraError(
                    f"{self.name!r}: array {buffer!r} has shape {list(shape)}, expected {len(declared)} dims {declared}"
                )
            for axis, (dim, size) in enumerate(zip(declared, shape, strict=True)):
                if isinstance(dim, str) and dim.isidentifier():  # a dim, not an expression over dims
                    seen = found.setdefault(dim, (int(size), f"{buffer}.shape[{axis}]"))
                    if seen[0] != int(size):
                        raise TesseraError(
                            f"{self.name!r}: dim {dim} is {seen[0]} in {seen[1]} but {size} in {buffer}.shape[{axis}]"
                        )
        return {dim: size for dim, (size, _) in found.items()}

    def resolved_metadata(self, *arrays, **named) -> list[dict[str, Any]]:
        """The metadata with every symbolic extent (grid, shared memory, ...) evaluated for these arrays."""
        from .transform.analysis import resolve_extent

        dims = self.dims(*arrays, **named)

        def resolve(value):
            if isinstance(value, dict):
                return {k: v if k in ("name", "unchecked") else resolve(v) for k, v in value.items()}
            if isinstance(value, list):
                return [resolve(v) for v in value]
            return (
                resolve_extent(value, dims) if isinstance(value, str | int) and not isinstance(value, bool) else value
            )

        return [
            {**kernel, "launch": resolve(kernel["launch"]), "resources": resolve(kernel["resources"])}
            for kernel in self.metadata
        ]

    def _check_symbolic_resources(self, arrays, named) -> None:
        """What VerifyResources could not check at compile time, checked with the call's dims."""
        from .transform.verify_resources import check_resolved

        dims = self.dims(*arrays, **named)
        for kernel in self.metadata:
            if kernel.get("unchecked"):
                check_resolved(kernel, dims, self.config)

    def __call__(self, *arrays, **named):
        """Run the kernel on numpy arrays (CPU configs); outputs are written in place.

        Arrays come in the tile program's parameter order, or by buffer name (``A=a``); other
        keywords are scalar parameters. Resource amounts over symbolic dims are checked first.
        """
        if any(kernel.get("unchecked") for kernel in self.metadata):
            self._check_symbolic_resources(arrays, named)
        backend = backend_for(self.config)
        run = backend.hook("run")
        if run is None or (backend.run_needs is not None and backend.run_needs not in self.artifacts):
            raise TesseraError(
                f"{self.name!r} was compiled for {self.config.name!r} without a runtime library (it needs nvcc "
                "and a cubin); only CPU configs and built CUDA kernels run in-process (see .artifacts)"
            )
        return run(self, arrays, named)

    def _ordered(self, order: list[str], arrays: tuple, named: dict) -> list:
        """``arrays`` (positional, then by buffer name from ``named``, which loses them) in ``order``."""
        if len(arrays) > len(order):
            raise TesseraError(f"{self.name!r} takes {len(order)} arrays ({', '.join(order)}), got {len(arrays)}")
        by_name = dict(zip(order, arrays, strict=False))  # fewer positional arrays: the rest by name
        for buffer in order:
            if buffer in named:
                if buffer in by_name:
                    raise TesseraError(f"{self.name!r}: array {buffer!r} given both by position and by name")
                by_name[buffer] = named.pop(buffer)
        missing = [b for b in order if b not in by_name]
        if missing:
            raise TesseraError(f"{self.name!r}: missing array(s) {', '.join(missing)}; expects ({', '.join(order)})")
        return [by_name[b] for b in order]

    def cuda_kernel(self):
        """The CUDA runtime library's entry as a :class:`~tessera_tvm.target.cuda.runtime.CudaKernel`
        (torch CUDA tensors in the tile program's parameter order); needs the ``runtime`` artifact."""
        from tessera_tvm.target.cuda.lowered import cuda_kernel

        return cuda_kernel(self)


def lower(
    program,
    config: TargetConfig | str,
    *,
    dump_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
    build: bool = True,
    jit_args: tuple = (),
    jit_kwargs: dict | None = None,
) -> LoweredModule:
    """Lower a TileLang tile program through ``config``'s pipelines and generate its device source.

    ``program`` is a ``@T.prim_func`` program, an IRModule of them, or a ``@tilelang.jit`` kernel:
    the decorated function (its program built from ``jit_args``/``jit_kwargs``, the arguments you
    would call it with) or a kernel it returned. A jit kernel's ``pass_configs`` are added to the
    current ``PassContext`` for this lowering (its keys win over the caller's; the caller's other
    config keys, opt_level, disabled and required passes and instruments stay). This differs from
    ``tilelang.compile``, which opens a fresh ``PassContext`` and ignores the caller's: here every
    program lowers under the caller's context, as ``tilelang.lower`` does, so an instrument or a
    disabled pass applies to a jit kernel as to any other program.

    With ``build`` the config's compiler runs (cubin/PTX with nvcc, a shared library with g++).
    ``out_dir`` receives the source, metadata.json, passes.txt and the binaries; without it they
    live in the persistent kernel cache (``tessera_tvm.cache``), whose hits skip the passes and the
    toolchain (except when ``dump_dir`` asks for the IR after every pass, and a timing table, or
    the current ``PassContext`` has instruments). The key covers the current ``PassContext``'s
    opt_level, config, disabled and required passes.
    """
    from .cache import KernelCache, cache_key

    config = load_config(config)
    if is_jit_kernel(program):
        func, pass_configs = _jit_program(program, jit_args, jit_kwargs, config)
        with pass_context_with(pass_configs):
            return lower(func, config, dump_dir=dump_dir, out_dir=out_dir, build=build)
    mod, name = _as_module(program)
    out = Path(out_dir) if out_dir is not None else None
    compiles = build and config.codegen_dict["compiler"] != "none"
    cache = KernelCache.from_env()
    pass_ctx = tvm.transform.PassContext.current()
    key = cache_key(mod, config, build=compiles, pass_ctx=pass_ctx) if cache.enabled else None
    lookup = key is not None and dump_dir is None and not list(pass_ctx.instruments)  # instruments see passes
    if lookup and (hit := _cached(cache, key, config, out)) is not None:
        return hit
    with cache.lock(key):  # one process compiles a key; the others wait here, then find its entry
        if lookup and (hit := _cached(cache, key, config, out)) is not None:
            return hit
        lowered = _lowered_for_the_other_build(cache, mod, config, pass_ctx, compiles) if lookup else None
        recorder = PassRecorder(dump_dir=Path(dump_dir) if dump_dir is not None else None)
        try:
            with collecting_logs():
                return _lower_and_write(mod, name, config, recorder, out, build, compiles, cache, key, lowered)
        except Exception as exc:
            _capture(exc, mod, name, config, recorder, build, pass_ctx)
            raise


def _cached(cache, key: str, config: TargetConfig, out: Path | None, *, load: bool = True) -> LoweredModule | None:
    """The module the cache holds for ``key``, or None; an entry that passes its checksums but does
    not load (a library the loader refuses, IR this TVM cannot read) is removed, with a warning.
    Without ``load`` its built kernel is not loaded into this process."""
    from .kernel_store import warn_once

    entry = cache.load(key)
    if entry is None:
        return None
    try:
        return _from_cache(entry, config, out, load=load)
    except OSError:  # copying into ``out_dir``: the entry is not at fault
        raise
    except Exception as exc:  # noqa: BLE001 - whatever it is, the compile below replaces the entry
        warn_once(
            f"damaged:{entry.path}",
            f"kernel cache entry {entry.path} does not load ({type(exc).__name__}: {exc}); it is removed and rebuilt",
        )
        cache.discard(entry.path)
        return None


def _lowered_for_the_other_build(cache, mod, config: TargetConfig, pass_ctx, compiles: bool) -> LoweredModule | None:
    """The lowering the cache holds for the same program under the other build flag, or None: a build
    after a look at the source (``build=False``) runs only the toolchain, and a look after a build
    runs nothing but the copy. Not for a backend whose artifacts are a program of several files
    (Tenstorrent: the cache keeps its files, not the program object that writes them)."""
    from .cache import cache_key

    if backend_for(config).program_generator is not None:
        return None
    other = _cached(cache, cache_key(mod, config, build=not compiles, pass_ctx=pass_ctx), config, None, load=False)
    if other is None:
        return None
    # The passes' results, not the other entry's files: those are written (and built) again here.
    return replace(other, artifacts={}, notes=list(other.notes), from_cache=False)


def _lower_and_write(mod, name, config, recorder, out, build, compiles, cache, key, lowered=None) -> LoweredModule:
    """Lower ``mod`` (unless ``lowered`` is its lowering already), write and build its artifacts (into
    ``out``, the cache or a scratch directory)."""
    from .kernel_store import BUILD_PREFIX, held_directory, scratch_directory

    if lowered is None:
        lowered = _lower(mod, name, config, recorder)
    if key is None:
        if out is not None:
            _write_artifacts_atomic(lowered, out, build=build)
        elif compiles or lowered._tt_program is not None:  # binaries / the five TT files need a home
            write_artifacts(lowered, scratch_directory(f"tessera_{name}_"), build=build)
        return lowered
    with held_directory(None, BUILD_PREFIX) as staging:  # a killed compile's is removed by the next process
        if out is not None:
            _write_artifacts_atomic(lowered, out, build=build)
        else:
            write_artifacts(lowered, staging, build=build)
        entry = cache.store(key, _cache_record(lowered), _cache_files(lowered, staging))
        if out is None and entry is not None:  # the staging files go away: point at the cache's copies
            lowered.artifacts = {k: entry.files[k] for k in lowered.artifacts}
        elif out is None:  # the cache cannot take them (read-only, full): keep them where they are
            kept = scratch_directory(f"tessera_{name}_")
            os.replace(staging, kept)  # over the new empty directory, on the same file system
            lowered.artifacts = {k: kept / Path(p).relative_to(staging) for k, p in lowered.artifacts.items()}
        if out is None and lowered._kernel is not None:
            lowered._kernel = None
            _reload(lowered)
    return lowered


def _capture(
    exc: BaseException, mod, name: str, config: TargetConfig, recorder: PassRecorder, build: bool, pass_ctx
) -> None:
    """Write the crash capture of a failed lowering (tessera_tvm.capture): the program, the config,
    the IR the failing pass received, the passes that ran, the metadata if the codegen got that far."""
    capture = start_capture(exc, "lower", name)
    if capture is None or "program.json" in capture.record["files"]:
        return
    try:
        capture.add_ir("program", mod)
        capture.add_config(config)
        stage = "toolchain" if isinstance(exc, ToolchainError) else "codegen"
        if recorder.failed is not None:
            pass_name, phase, before = recorder.failed
            capture.add_ir("before_pass", before)
            capture.update(failed_pass={"name": pass_name, "phase": phase})
            stage = phase
        capture.update(stage=stage, program={"name": name, "build": build}, pass_context=pass_context_record(pass_ctx))
        if recorder.metadata is not None:
            capture.add_json("metadata.json", recorder.metadata)
        if recorder.records:
            capture.append_log("passes that ran", recorder.timing_table())
    except Exception as failure:  # capture never hides the user's error
        capture.append_log("capture incomplete", f"{type(failure).__name__}: {failure}")
    finally:
        capture.save()


def _lower(mod, name: str, config: TargetConfig, recorder: PassRecorder) -> LoweredModule:
    """Run the three phases and the codegen (no cache, no files but the dumps)."""
    from tessera_tvm.target.codegen import device_source
    from tessera_tvm.target.cpu import aligned_local_arrays, with_spec_pragmas
    from tessera_tvm.tile.base import SPEC_ATTR

    backend = backend_for(config)
    dump = recorder.dump_dir
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        (dump / "000_input.py").write_text(mod.script())
    target = config.tvm_target()
    # MakePackedAPI erases buffer maps; keep the tile program's buffers for the CPU signature.
    funcs = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    input_buffers = {buf.data.name: buf for func in funcs for buf in func.buffer_map.values()}
    buffer_order = [str(f.buffer_map[p].name) for f in funcs for p in f.params if p in f.buffer_map]
    program_shapes = {
        str(buf.name): [int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in buf.shape]
        for func in funcs
        for buf in func.buffer_map.values()
    }
    with recording(recorder):
        mod = run_phase(mod, config, "lower_and_legalize")
        mod = run_phase(mod, config, "optimize_for_target")
        host_mod, device_mod = split_host_device(mod)
        device_mod = run_phase(device_mod, config, "codegen_prep")
    tt_program = None
    with step(f"codegen ({config.codegen_kind})", name, config):
        if backend.program_generator is not None:  # several files (Tenstorrent: from the tt.* annotations)
            tt_program = backend.hook("program_generator")(device_mod)
            source = tt_program.source
        else:
            source = device_source(device_mod, config, target)
            if backend.kernels_in_host:
                source = aligned_local_arrays(source)
                if any(f.attrs is not None and SPEC_ATTR in f.attrs for f in funcs):
                    source = with_spec_pragmas(source)
    timing = recorder.timing_table()
    if dump is not None:
        (dump / "timing.txt").write_text(timing)
    metadata = [tt_program.metadata] if tt_program else _metadata(device_mod)
    recorder.metadata = metadata
    return LoweredModule(
        name=name,
        config=config,
        source=source,
        host_mod=host_mod,
        device_mod=device_mod,
        metadata=metadata,
        pass_log=list(recorder.records),
        notes=[
            f"{kernel['name']}: {item} depends on symbolic dims: not checked at compile time, checked at each call"
            for kernel in metadata
            for item in kernel.get("unchecked", ())
        ],
        _timing=timing,
        _tt_program=tt_program,
        _entry=backend.hook("entry")(device_mod, input_buffers, buffer_order) if backend.entry else None,
        _program_order=buffer_order,
        _program_shapes=program_shapes,
    )


def _cache_record(lowered: LoweredModule) -> dict[str, Any]:
    entry = None
    if lowered._entry is not None:
        symbol, params, order = lowered._entry
        entry = [symbol, [[p.name, p.kind, p.dtype, list(p.shape), p.written] for p in params], order]
    return {
        "name": lowered.name,
        "source": lowered.source,
        "metadata": lowered.metadata,
        "pass_log": [r.as_dict() for r in lowered.pass_log],
        "notes": lowered.notes,
        "timing": lowered._timing,
        "artifacts": list(lowered.artifacts),  # in the order written: .artifacts reads the same from the cache
        "cpu_entry": entry,
        "program_order": lowered._program_order,
        "program_shapes": lowered._program_shapes,
    }


def _cache_files(lowered: LoweredModule, scratch: Path) -> dict[str, Path]:
    files = dict(lowered.artifacts)
    for key, mod in (("host_mod.json", lowered.host_mod), ("device_mod.json", lowered.device_mod)):
        files[key] = scratch / key
        files[key].write_text(tvm.ir.save_json(mod))
    return files


def _from_cache(entry, config: TargetConfig, out: Path | None, *, load: bool = True) -> LoweredModule:
    import shutil

    from tessera_tvm.target.cpu import KernelParam

    record = entry.record
    artifacts = {k: entry.files[k] for k in record["artifacts"]}
    if out is not None:  # copy next to the caller's other files, under the same names
        out.mkdir(parents=True, exist_ok=True)
        for key, path in list(artifacts.items()):
            artifacts[key] = Path(shutil.copy2(path, out / path.name))
    cpu_entry = None
    if record["cpu_entry"] is not None:  # the record's key from when only the CPU had an entry
        symbol, params, order = record["cpu_entry"]
        cpu_entry = (symbol, [KernelParam(n, k, d, tuple(shape), *rest) for n, k, d, shape, *rest in params], order)
    lowered = LoweredModule(
        name=record["name"],
        config=config,
        source=record["source"],
        host_mod=load_json(entry.files["host_mod.json"].read_text()),  # the key holds this TVM's version
        device_mod=load_json(entry.files["device_mod.json"].read_text()),
        metadata=record["metadata"],
        pass_log=[PassRecord(**r) for r in record["pass_log"]],
        artifacts=artifacts,
        notes=list(record["notes"]),
        from_cache=True,
        _timing=record["timing"],
        _entry=cpu_entry,
        _program_order=list(record.get("program_order", [])),
        _program_shapes=dict(record.get("program_shapes", {})),
    )
    if load:
        _reload(lowered)
    return lowered


def _metadata(device_mod) -> list[dict[str, Any]]:
    from .transform.annotate_kernel_metadata import kernel_metadata

    return kernel_metadata(device_mod)


def _write_artifacts_atomic(lowered: LoweredModule, out_dir: Path, *, build: bool) -> None:
    """:func:`write_artifacts` into ``out_dir``, all or nothing: the files are written and built in a
    staging sibling and moved into ``out_dir`` only when the build succeeded, so a failing compiler
    leaves ``out_dir`` as it was (no source without its library, no stale mix of old and new)."""
    from .errors import ToolchainError
    from .target.toolchain import atomic_output_dir

    staging = None
    try:
        with atomic_output_dir(out_dir) as staging:
            write_artifacts(lowered, staging, build=build)
    except ToolchainError as exc:
        if staging is None:
            raise
        raise type(exc)(exc.command, exc.output, str(exc).replace(str(staging), str(out_dir))) from None
    lowered.artifacts = {k: Path(out_dir) / Path(p).relative_to(staging) for k, p in lowered.artifacts.items()}
    if lowered._kernel is not None:  # loaded from the staging path: load the file now in place
        lowered._kernel = None
        _reload(lowered)


def write_artifacts(lowered: LoweredModule, out_dir: Path, *, build: bool = True) -> dict[str, Path]:
    """Write source, host IR, metadata and pass log to ``out_dir``; build with the config's compiler."""
    from tessera_tvm.target.metadata import write_metadata
    from tessera_tvm.target.toolchain import write_text_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    codegen = lowered.config.codegen_dict
    backend = backend_for(lowered.config)
    files = {
        "source": out_dir / f"{lowered.name}{backend.source_suffix}",
        "host_ir": out_dir / f"{lowered.name}.host.py",
        "metadata": out_dir / "metadata.json",
        "passes": out_dir / "passes.txt",
    }
    if lowered._tt_program is not None:  # five files instead of one source
        del files["source"]
        lowered.artifacts.update(lowered._tt_program.write(out_dir))
    else:
        write_text_atomic(files["source"], lowered.source)
    write_text_atomic(files["host_ir"], lowered.host_ir)
    write_text_atomic(files["passes"], lowered.timing_table())
    lowered.artifacts.update(files)
    write_metadata(lowered)
    if build:
        if codegen["compiler"] != "none" and backend.build is not None:  # the backend drives the config's compiler
            with step(backend.build_step, lowered.name, lowered.config):
                backend.hook("build")(lowered, out_dir)
        else:
            lowered.notes.append(
                f"{lowered.config.name}: no compiler runs for this target here; the generated sources are the artifacts"
            )
    return lowered.artifacts


def _reload(lowered: LoweredModule) -> None:
    """Load the built kernel again from where its artifacts are now (a backend with a loader only)."""
    reload = backend_for(lowered.config).hook("reload")
    if reload is not None:
        reload(lowered)
