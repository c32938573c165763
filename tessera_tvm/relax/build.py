"""Compiling and running a Relax module with Tessera kernels: ``tvm.compile`` plus what TVM leaves out.

    built = tessera_tvm.relax.build(mod, "cpu")          # partition + tvm.compile(tir_pipeline=...)
    built.report                                         # what Tessera took, what TVM kept
    out = built.run("forward", x, w1, b1, ...)           # CPU: numpy in, numpy out (relax VM)
    built.kernel_sources()                               # {kernel: device source} of the Tessera kernels

On the CPU, TVM's host code and TileLang's kernels are C sources that ``export_library`` compiles
into one shared library; :func:`export_library` passes the config's compiler flags (``-O3
-march=native``: without ``-O`` the kernels run ~60x slower). A plain ``ex.export_library(path)``
also works (the sources include TileLang's header by absolute path), just without optimisation.
"""

from __future__ import annotations

import re
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._tvm import tvm
from ..config import TargetConfig, load_config
from ..errors import TesseraError
from ..registry import take_pending_error
from ..target.backend import backend_for
from ..target.cpu.blas_threads import share_blas_threads
from .constants import keep_constants_apart
from .offload import OffloadReport, partition_for_tessera
from .pipeline import is_tessera_kernel, pipeline_name

relax = tvm.relax


def compile_module(mod, config: TargetConfig | str, *, target=None):
    """``tvm.compile(mod, target, tir_pipeline="tessera.<config>")`` under the target's context.

    The target defaults to the config's. Tessera's own errors (e.g. a wrong target) come back as
    their class, not as the RuntimeError TVM's FFI turns them into.
    """
    config = load_config(config)
    target = target if target is not None else config.tvm_target()
    take_pending_error()
    try:
        with target:  # TVM's nvcc callback reads the arch from the current target
            return tvm.compile(
                mod, target, relax_pipeline=relax_pipeline(config, target), tir_pipeline=pipeline_name(config)
            )
    except Exception as exc:
        error = take_pending_error()
        if error is not None:
            raise error from None
        raise exc


def relax_pipeline(config: TargetConfig | str, target=None):
    """The Relax pipeline ``tvm.compile`` runs for a module with Tessera kernels of ``config``
    (``OffloadReport.relax_pipeline``): TVM's default for ``target`` (the config's unless given; as
    ``tvm.compile`` picks it: a GPU target's own pipeline where it has one, else the generic one),
    with two of TileLang's TVM's silent errors kept out: a match_cast that restates its input's
    type becomes a plain alias first (:func:`alias_restating_match_casts`), and constants whose
    hashes collide are kept apart last (:func:`.constants.keep_constants_apart`)."""
    config = load_config(config)
    target = target if target is not None else config.tvm_target()
    default = relax.get_pipeline("default")
    if backend_for(config).thread_blocks:  # a GPU: the target's pipeline where it has one
        try:
            default = relax.get_default_pipeline(target)
        except (ValueError, AttributeError):
            pass
    return tvm.transform.Sequential(
        [_alias_restating_match_casts, default, keep_constants_apart], name="tessera.relax_pipeline"
    )


@tvm.transform.module_pass(opt_level=0, name="tessera.AliasRestatingMatchCasts")
def _alias_restating_match_casts(mod, _ctx):
    return alias_restating_match_casts(mod)


def export_options(config: TargetConfig | str) -> list[str]:
    """Compiler options for ``Executable.export_library`` on a C host: the config's flags (CPU).

    ``-D`` flags are left out: the kernel sources carry them as ``#define`` lines already.
    """
    config = load_config(config)
    # Kernels compiled into the host library (CPU) take the config's flags; a GPU's host code needs few.
    if not backend_for(config).kernels_in_host:
        return ["-std=c++17", "-O2", *C_CONSTANTS]
    return ["-std=c++17", *_flags_without_defines(config), *C_CONSTANTS]


def _flags_without_defines(config: TargetConfig) -> list[str]:
    return [f for f in config.codegen_dict["flags"] if not f.startswith("-D")]


def host_library_flags(config: TargetConfig) -> list[str] | None:
    """The flags ``tessera_tvm.target.cpu.host_library`` compiles an export's sources with (the
    config's, without ``-D``), or None where the kernels are not C in the host library built by GCC
    (TVM's own one-call compile is used there)."""
    if not backend_for(config).kernels_in_host or config.codegen_dict["compiler"] not in ("g++", "gcc"):
        return None
    return _flags_without_defines(config)


#: TVM's C codegen prints a float32 infinity as ``inff`` (``-inff`` in the masks torch's decomposed
#: attention builds), which no C compiler knows: define it as the value meant. (Not ``nanf``, which
#: libm declares as a function.) It spells float16 ``half``, which C does not have: ``_Float16``.
C_CONSTANTS = ("-Dinff=__builtin_inff()", "-Dhalf=_Float16")


def export_library(executable, path: str | Path, config: TargetConfig | str) -> Path:
    """Write ``executable`` as a shared library at ``path``, compiled with the config's flags.

    On a CPU config each C source (TVM's host code, each kernel) becomes an object of its own, in
    parallel, the kernels with the precompiled C prelude, and the objects are kept in the kernel
    cache (``tessera_tvm.target.cpu.host_library``): a model built again links in about a second."""
    from ..target.cpu.host_library import build_host_library, pack_imports

    config = load_config(config)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    options = export_options(config)
    flags = host_library_flags(config)
    if flags is not None:

        def fcompile(output, files, options=None, **_):
            build_host_library(output, files, options or [], flags)

        executable.export_library(str(path), fcompile=fcompile, fpack_imports=pack_imports, options=options)
    else:
        executable.export_library(str(path), options=options)
    return path


def load_vm(executable, config: TargetConfig | str, device=None, *, path: str | Path | None = None):
    """A ``relax.VirtualMachine`` for ``executable`` (exported with the config's flags, then loaded).

    ``device`` defaults to the CPU for CPU configs and to GPU 0 otherwise (a GPU must be present).
    """
    config = load_config(config)
    # Without a path: a scratch library, removed once loaded (the loaded copy stays mapped).
    with tempfile.TemporaryDirectory(prefix="tessera_relax_") if path is None else nullcontext() as scratch:
        library = tvm.runtime.load_module(str(export_library(executable, path or Path(scratch) / "module.so", config)))
    in_host = backend_for(config).kernels_in_host
    if in_host:
        share_blas_threads()  # numpy's OpenBLAS on the kernels' OpenMP threads (target/cpu/blas_threads.py)
    if device is None:  # kernels in the host library run on the host CPU, others on the target's device 0
        device = tvm.cpu() if in_host else tvm.device(config.tvm_kind, 0)
    return relax.VirtualMachine(library, device)


def _modules(module):
    yield module
    for imported in module.imports:
        yield from _modules(imported)


def kernel_sources(executable, kernels: list[str]) -> dict[str, str]:
    """The device source holding each Tessera kernel (by PrimFunc name) in a compiled executable."""
    root = executable.mod if hasattr(executable, "mod") else executable
    found: dict[str, str] = {}
    for module in list(_modules(root))[1:]:
        try:
            source = module.inspect_source()
        except Exception:  # a library loaded from disk keeps no source
            continue
        for name in kernels:
            host = "__tvm_ffi_" in source  # TVM's host code calls the kernels; it does not define them
            if not host and re.search(rf"\b{re.escape(name)}_kernel\s*\(", source):
                found.setdefault(name, source)
    return found


def device_sources(mod, config: TargetConfig | str) -> dict[str, str]:
    """The device source of every Tessera kernel in a partitioned module, without ``tvm.compile``.

    The same path as the TIR pipeline (the config's pass lists, TileLang's codegen) minus TVM's
    part: for targets whose operators TVM itself cannot compile here (HIP) and to read sources
    without nvcc.
    """
    from .pipeline import device_runtime_module, lower_kernel

    config = load_config(config)
    name = pipeline_name(config)
    out = {}
    for gv, func in mod.functions.items():
        if is_tessera_kernel(func):
            _, carrier = lower_kernel(func, config, name)
            module = device_runtime_module(carrier.attrs["tessera.device_mod"], config, compile_device=False)
            out[str(gv.name_hint)] = module.inspect_source()
    return out


@dataclass
class RelaxBuild:
    """A Relax module partitioned for Tessera and compiled by ``tvm.compile``."""

    module: Any  # the partitioned IRModule
    report: OffloadReport
    executable: Any  # tvm.relax.VMExecutable
    config: TargetConfig
    _vm: Any = field(default=None, repr=False)

    def kernel_sources(self) -> dict[str, str]:
        """{Tessera kernel: its device source} as compiled into the executable."""
        return kernel_sources(self.executable, self.report.kernels)

    def vm(self, device=None):
        """The ``relax.VirtualMachine`` (exported with the config's flags; CPU unless ``device``)."""
        if self._vm is None or device is not None:
            self._vm = load_vm(self.executable, self.config, device)
        return self._vm

    def run(self, function: str, *arrays):
        """Call ``function`` on numpy arrays in the VM (CPU configs); numpy result(s)."""
        if not backend_for(self.config).kernels_in_host:
            raise TesseraError(f"{self.config.name!r} kernels run on a GPU; use .vm(tvm.cuda()) on a machine with one")
        result = self.vm()[function](*[tvm.runtime.tensor(a) for a in arrays])
        return _to_numpy(result)


def _to_numpy(value):
    if hasattr(value, "numpy"):
        return value.numpy()
    return tuple(_to_numpy(v) for v in value)


def build(
    mod,
    config: TargetConfig | str,
    *,
    target=None,
    functions: list[str] | None = None,
    dim_hints: dict[str, int] | None = None,
    pack_weights: bool = True,
) -> RelaxBuild:
    """Partition ``mod`` for ``config`` and compile it with ``tvm.compile`` (Tessera's TIR pipeline).
    ``pack_weights``: constant GEMM weights packed in the layout their kernels read (see
    :func:`partition_for_tessera`)."""
    config = load_config(config)
    partitioned, report = partition_for_tessera(
        mod, config, functions=functions, dim_hints=dim_hints, pack_weights=pack_weights
    )
    executable = compile_module(partitioned, config, target=target)
    return RelaxBuild(partitioned, report, executable, config)


def alias_restating_match_casts(mod):
    """``mod`` with every ``v = R.match_cast(t, S)`` whose ``t`` already has struct info ``S``, or a
    shape provably equal to it (it checks nothing and defines no symbolic var), turned into the plain
    alias ``v = t``.

    TVM's ``StaticPlanBlockMemory`` does not count a match_cast's result as a use of its input's
    storage: the storage is handed to the next allocation while the cast tensor is still read.
    ``y = x + 1; z = R.match_cast(y, R.Tensor((8, 12))); R.split(z, 2, axis=-1)[1]`` came out wrong
    (the split's first output was written over y's storage as the split read it), in TileLang's TVM
    with TVM's own pipeline too (apache-tvm 0.27 gets it right). A plain alias is counted."""
    analyzer = tvm.arith.Analyzer()

    def restates(have, want) -> bool:
        if tvm.ir.structural_equal(have, want):
            return True
        if not all(isinstance(i, relax.TensorStructInfo) for i in (have, want)) or have.dtype != want.dtype:
            return False
        if not all(isinstance(getattr(i, "shape", None), relax.ShapeExpr) for i in (have, want)):
            return False
        if len(have.shape.values) != len(want.shape.values):
            return False  # a dim that defines a new symbolic var is never provably equal to another
        return all(analyzer.can_prove_equal(h, w) for h, w in zip(have.shape.values, want.shape.values, strict=True))

    @relax.expr_functor.mutator
    class Alias(relax.PyExprMutator):
        def visit_match_cast_(self, binding):
            value = self.visit_expr(binding.value)
            if restates(value.struct_info, binding.struct_info):
                self.builder_.emit_normalized(relax.VarBinding(binding.var, value))
                return
            super().visit_match_cast_(binding)

    out = mod
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            rewritten = Alias().visit_expr(func)
            if not rewritten.same_as(func):
                out = out if out is not mod else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
                out[gv] = rewritten
    return out
