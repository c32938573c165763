"""Tessera's TIR pipelines inside ``tvm.compile``: one named pipeline per target config.

TileLang's TVM (0.25.dev0) keeps its TIR pipelines in ``tvm.tirx.pipeline.PIPELINE_MAP`` (name ->
factory returning a ``Pass``); ``tvm.compile(mod, target, tir_pipeline=NAME)`` looks NAME up there.
Tessera registers ``tessera.<config>`` for every shipped config (and, on demand, for a config file):

    ex = tvm.compile(mod, target, tir_pipeline="tessera.hopper")

The pipeline splits the module's PrimFuncs. Tessera tile kernels (the PrimFuncs
``partition_for_tessera`` added, marked ``tessera.kernel``) are lowered by ``tessera_tvm.lower``,
that is by the config's own named lists (LowerAndLegalize, OptimizeForTarget, CodegenPrep) from the
one pass registry; every other PrimFunc goes through TVM's default TIR pipeline for the target.

Code generation is by target kind in this TVM (``target.build.<kind>``), and TVM's CUDA/C codegens
do not know TileLang's intrinsics. So each Tessera kernel leaves the pipeline as its host function
(compiled with TVM's host code, it checks the arguments and launches the kernel) plus a *carrier*:
an empty PrimFunc bound to TVM's otherwise unused ``ext_dev`` target that holds the lowered device
module. TVM hands ``ext_dev`` functions to ``target.build.ext_dev``, which Tessera registers: it
generates the device code with TileLang's codegen for the config (CUDA + nvcc, HIP source, C), the
same source ``tessera_tvm.lower`` writes, and TVM imports it into the host module.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import numpy as np

from .._tvm import tvm
from ..config import TargetConfig, available_configs, load_config
from ..errors import TesseraError
from ..registry import tessera_module_pass
from ..target.backend import backend_for
from ..transform.exact_float_constants import exact_float_constants_in

#: Attributes partition_for_tessera puts on the tile programs it adds.
KERNEL_ATTR = "tessera.kernel"  # the kernel family (gemm, attention, softmax, norm)
CONFIG_ATTR = "tessera.config"  # the config name
FINGERPRINT_ATTR = "tessera.config_fingerprint"
#: Attributes TVM's Relax pipeline reads: opaque (never fused with neighbours), already scheduled
#: (dlight leaves it alone).
RELAX_ATTRS = {"op_pattern": 8, "tirx.is_scheduled": True}

#: Attributes of a device carrier (see the module docstring).
DEVICE_MOD_ATTR = "tessera.device_mod"
PIPELINE_ATTR = "tessera.pipeline"
CARRIER_SUFFIX = "__tessera_device"
CARRIER_TARGET_KIND = "ext_dev"

PREFIX = "tessera."

_CONFIGS: dict[str, TargetConfig] = {}  # pipeline name -> config (set when registered or first used)


class PipelineError(TesseraError):
    """A module cannot go through a Tessera TIR pipeline (wrong target, wrong config, ...)."""


# ---------------------------------------------------------------------------------------------
# Names and registration (the fork's registry: tvm.tirx.pipeline.PIPELINE_MAP)
# ---------------------------------------------------------------------------------------------


def _registry() -> dict[str, Any]:
    return tvm.tirx.pipeline.PIPELINE_MAP


def _factory(name: str):
    def make(**_kwargs):
        return tessera_tir_pipeline(_config_of(name))

    make.__name__ = f"tessera_pipeline_{re.sub(r'[^0-9A-Za-z_]', '_', name)}"
    make.__doc__ = f"The Tessera TIR pipeline {name!r} (see tessera_tvm.relax.pipeline)."
    return make


def _config_of(name: str) -> TargetConfig:
    if name not in _CONFIGS:  # a shipped config, registered by name only
        _CONFIGS[name] = load_config(name[len(PREFIX) :])
    return _CONFIGS[name]


def check_supported(config: TargetConfig) -> None:
    """Raise if ``config`` has no runtime TVM can load (Tenstorrent kernels are tt-metal programs)."""
    refused = backend_for(config).relax_refused
    if refused is not None:
        raise PipelineError(f"config {config.name!r} {refused}")


def pipeline_name(config: TargetConfig | str) -> str:
    """The ``tir_pipeline`` name for ``config`` (registering it with TVM if needed).

    Shipped configs are ``tessera.<name>``; a config file whose name is taken by a different
    config gets ``tessera.<name>.<fingerprint>``.
    """
    config = load_config(config)
    check_supported(config)
    ensure_registered()
    name = PREFIX + config.name
    known = _CONFIGS.get(name)
    if known is None and name in _registry():
        known = _config_of(name)
    if known is not None and known.fingerprint() != config.fingerprint():
        name = f"{name}.{config.fingerprint()[:8]}"
    _CONFIGS[name] = config
    if name not in _registry():
        _registry()[name] = _factory(name)
    return name


_registered = False


def ensure_registered() -> None:
    """Register ``tessera.<config>`` for every shipped config and the ``ext_dev`` code generator."""
    global _registered
    if _registered:
        return
    _registered = True
    registry = _registry()
    for name in available_configs():
        if backend_for(_config_of(PREFIX + name)).relax_refused is not None:  # Tenstorrent: no TVM runtime
            continue
        registry.setdefault(PREFIX + name, _factory(PREFIX + name))
    default = registry.get(_DEFAULT)
    if default is not None and not getattr(default, "_tessera_guard", False):
        registry[_DEFAULT] = _guarded(default)
    builder = "target.build." + CARRIER_TARGET_KIND
    ours = tvm.get_global_func(_OWNER_MARK, allow_missing=True) is not None
    if tvm.get_global_func(builder, allow_missing=True) is not None and not ours:
        raise PipelineError(
            f"{builder} is already registered by someone else; Tessera routes its device kernels through "
            f"TVM's otherwise unused {CARRIER_TARGET_KIND!r} target kind and cannot share it"
        )
    tvm.register_global_func(builder, _build_carriers, override=True)
    tvm.register_global_func(_OWNER_MARK, lambda: True, override=True)
    _register_c_intrinsics()


def _register_c_intrinsics() -> None:
    """Lowering rules the C code generator lacks in this TVM, for the operators a model leaves to TVM.

    - ``tirx.fabs`` has no rule for the ``c`` target (nor a default one), so any ``R.abs`` (and
      ``torch.norm``, ``F.normalize``, ``isinf``, ``isfinite``... which use it) stopped the build
      with "Unresolved call tirx.fabs".
    - The default rules of the float math functions (exp, log, tanh...) call the C library's float
      or double function and know no half precision: a float16 model's softmax stopped the build
      with "Unresolved call tirx.exp". In float16 and bfloat16 they now compute in float32 and
      round back, as torch does on the CPU.

    A ``c`` rule that TVM already has is left alone.
    """
    _register_c_rule("tirx.fabs", _fabs_in_c)
    for name in _HALF_MATH:
        default = _attr(tvm.ir.Op.get(name), "default.FLowerIntrinsic")
        if default is not None:
            _register_c_rule(name, functools.partial(_half_through_float, default))


#: Float math whose default lowering knows float and double only.
_HALF_MATH = tuple(
    f"tirx.{name}"
    for name in ("exp", "exp2", "log", "log2", "log10", "log1p", "sqrt", "tanh", "erf", "pow", "sin", "cos", "tan")
)


def _attr(op, name: str):
    # has_attr first: get_attr raises where no op has the attribute yet, and the first error a
    # process raises from TVM's C++ costs ~1 s (its backtrace support loads), at every import.
    return op.get_attr(name) if op.has_attr(name) else None


def _register_c_rule(name: str, rule) -> None:
    if _attr(tvm.ir.Op.get(name), "c.FLowerIntrinsic") is None:
        tvm.ir.register_intrin_lowering(name, target="c", f=rule, level=10)


def _fabs_in_c(call):
    x = call.args[0]
    dtype = str(x.dtype)
    if dtype in ("float32", "float64") and x.dtype.lanes == 1:
        return tvm.tirx.call_pure_extern(dtype, "fabsf" if dtype == "float32" else "fabs", x)
    # float16 and other widths: the sign bit cleared by a comparison (-0.0 stays -0.0, NaN stays NaN)
    return tvm.tirx.Select(x < tvm.tirx.const(0, dtype), -x, x)


def _half_through_float(default, call):
    """``call`` by TVM's default rule, or for float16/bfloat16 arguments computed in float32."""
    dtype = str(call.dtype)
    if dtype not in ("float16", "bfloat16"):
        return default(call)
    widened = [tvm.tirx.Cast("float32", a) if str(a.dtype) == dtype else a for a in call.args]
    inner = tvm.tirx.Call("float32", call.op, widened)
    return tvm.tirx.Cast(dtype, default(inner))


_OWNER_MARK = "tessera.relax.owns_ext_dev_builder"

#: The pipeline TVM's "default" TIR pipeline is in this TVM (tvm.tirx.get_default_tir_pipeline).
_DEFAULT = "s_tir"


def _guarded(original):
    """TVM's default TIR pipeline, refusing a module that holds Tessera kernels with the fix: it
    cannot lower TileLang's tile programs, and fails deep inside with "Unknown device id in
    current IR" (what ``tvm.compile(mod, target)`` without ``tir_pipeline=`` gives)."""

    def make(**kwargs):
        inner = original(**kwargs)

        def run(mod, _ctx):
            kernels = sorted(str(gv.name_hint) for gv, f in mod.functions.items() if is_tessera_kernel(f))
            if kernels:
                configs = sorted({str(f.attrs[CONFIG_ATTR]) for f in mod.functions.values() if is_tessera_kernel(f)})
                shown = ", ".join(kernels[:3]) + (f" and {len(kernels) - 3} more" if len(kernels) > 3 else "")
                raise PipelineError(
                    f"the module holds Tessera kernels ({shown}) and is compiled with TVM's default TIR pipeline, "
                    "which cannot lower them. Compile with tvm.compile(mod, report.target, "
                    f"tir_pipeline=report.tir_pipeline) ('{PREFIX}{configs[0]}' here), or with "
                    f"tessera_tvm.relax.build(mod, '{configs[0]}')"
                )
            return inner(mod)

        return tvm.transform.module_pass(run, opt_level=0, name="tessera.CheckNoTesseraKernels")

    make._tessera_guard = True
    make.__doc__ = original.__doc__
    return make


# ---------------------------------------------------------------------------------------------
# The pipeline pass
# ---------------------------------------------------------------------------------------------


def is_tessera_kernel(func) -> bool:
    return isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and KERNEL_ATTR in func.attrs


def tessera_tir_pipeline(config: TargetConfig | str):
    """The module pass ``tvm.compile`` runs for ``tir_pipeline="tessera.<config>"``."""
    config = load_config(config)
    check_supported(config)
    ensure_registered()
    name = pipeline_name(config)

    def run(mod, _ctx):
        kernels = {gv: f for gv, f in mod.functions.items() if is_tessera_kernel(f)}
        rest = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv not in kernels}, attrs=mod.attrs)
        target = _bound_target(mod, config)
        _check_target(target, config, name)
        for gv, func in kernels.items():
            _check_kernel_config(gv, func, config, name)
        if rest.functions and backend_for(config).thread_blocks:  # a GPU target (_check_target: the config's)
            rest = _bind_unscheduled(rest)
        out = tvm.tirx.get_default_tir_pipeline(target)(rest) if rest.functions else rest
        out = _constant_reinterprets_folded(out)
        out = _nan_constants_spelled_for_c(out, (target.host or target).kind.name)  # the host's code is C here
        out = exact_float_constants_in(out, (target.host or target).kind.name)  # C prints 7 of the 9 digits needed
        _check_tvm_codegen(out, config)
        for gv, func in kernels.items():
            host, carrier = lower_kernel(func, config, name)
            out[gv] = host
            out[tvm.ir.GlobalVar(str(gv.name_hint) + CARRIER_SUFFIX)] = carrier
        return out

    return tessera_module_pass(run, name=f"{name}.TIRPipeline")


def _bind_unscheduled(mod):
    """``mod`` with thread bindings for the GPU functions TVM's default schedules (dlight) left
    without, which stopped the build with "Variable ... is directly accessed by host memory. Did you
    forget to bind?": a scalar (the final division of a mean, as in ``cross_entropy``) gets TVM's
    ``DefaultGPUSchedule``; what that cannot schedule (``scatter_elements``, which TVM writes as CPU
    loops) runs on one GPU thread (correct, not fast). Bound functions are left alone."""
    out = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc) or _binds_threads(func):
            out[gv] = func
            continue
        unmarked = func.without_attr("tirx.is_scheduled")  # dlight marks what its fallback gave up on
        try:
            out[gv] = tvm.s_tir.transform.DefaultGPUSchedule()(tvm.IRModule({gv: unmarked}))[gv]
        except (tvm.error.TVMError, ValueError):  # "Cannot add loops on top of the root block"
            out[gv] = _on_one_thread(func)
    return tvm.IRModule(out, attrs=mod.attrs)


def _binds_threads(func) -> bool:
    found = []

    def visit(stmt):
        if isinstance(stmt, tvm.tirx.For) and stmt.kind == tvm.tirx.ForKind.THREAD_BINDING:
            found.append(stmt)
        elif isinstance(stmt, tvm.tirx.AttrStmt) and stmt.attr_key == "thread_extent":
            found.append(stmt)

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return bool(found)


def _on_one_thread(func):
    """``func`` with its parallel loops serial and its body inside a launch of one thread."""
    tirx = tvm.tirx

    def serial(stmt):
        if isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.PARALLEL:
            return tirx.For(stmt.loop_var, stmt.min, stmt.extent, tirx.ForKind.SERIAL, stmt.body)
        return None

    body = tirx.stmt_functor.ir_transform(func.body, None, serial, ["tirx.For"])
    for tag in ("threadIdx.x", "blockIdx.x"):
        var = tirx.Var(tag, "int32")
        binding = tirx.IterVar(tvm.ir.Range(0, 1), var, tirx.IterVar.ThreadIndex, tag)
        body = tirx.For(var, 0, 1, tirx.ForKind.THREAD_BINDING, body, thread_binding=binding)
    return func.with_body(body)


def _constant_reinterprets_folded(mod):
    """``mod`` with each ``reinterpret`` of a float constant replaced by the constant's bits.

    TVM's bfloat16 legalisation rounds a float32 to bfloat16 through ``reinterpret`` of its bits,
    which the C code generator prints as ``*(uint32_t *)(&(x))``: of a constant, ``&(0.0f)``, which
    no C compiler takes ("lvalue required as unary '&' operand"). A bfloat16 ``zeros_like`` (the
    unused indices of a bfloat16 ``max_pool2d``) stopped the build of the operators left to TVM."""
    tirx = tvm.tirx
    reinterpret = tvm.ir.Op.get("tirx.reinterpret")
    widths = {"float32": np.float32, "float64": np.float64, "float16": np.float16}

    def fold(expr):
        if not (isinstance(expr, tirx.Call) and expr.op.same_as(reinterpret) and len(expr.args) == 1):
            return None
        (value,) = expr.args
        if not isinstance(value, tirx.FloatImm) or str(value.dtype) not in widths or expr.dtype.lanes != 1:
            return None
        bits = np.asarray(value.value, dtype=widths[str(value.dtype)]).view(f"uint{value.dtype.bits}")
        if str(expr.dtype) != f"uint{value.dtype.bits}":
            return None
        return tirx.IntImm(str(expr.dtype), int(bits))

    out = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            func = func.with_body(tirx.stmt_functor.ir_transform(func.body, None, fold, ["tirx.Call"]))
        out[gv] = func
    return tvm.IRModule(out, attrs=mod.attrs)


def _nan_constants_spelled_for_c(mod, host_kind: str):
    """``mod`` with each NaN constant of its C functions written as ``0.0f / 0.0f``.

    TVM's C code generator prints a NaN as ``nanf`` (``nan``), which are libm's functions: a model
    holding a NaN (``torch.full_like(x, float("nan"))``) stopped the build of the operators left to
    TVM (g++: "cannot convert 'float(const char*)' to 'float'"). A call of ``__builtin_nanf`` cannot
    stand in: the code generator declares every function it calls, and that declaration clashes with
    the builtin's."""
    tirx = tvm.tirx

    def spell(expr):
        if not (isinstance(expr, tirx.FloatImm) and math.isnan(expr.value)):
            return None
        zero = tirx.FloatImm(str(expr.dtype), 0.0)
        return tirx.Div(zero, zero)  # the node itself: the folding operator `/` would give the NaN back

    out = {}
    for gv, func in mod.functions.items():
        target = func.attrs.get("target") if isinstance(func, tirx.PrimFunc) and func.attrs else None
        if target is not None and target.kind.name == host_kind:  # TileLang's TVM: the host is C
            func = func.with_body(tirx.stmt_functor.ir_transform(func.body, None, spell, ["ir.FloatImm"]))
        out[gv] = func
    return tvm.IRModule(out, attrs=mod.attrs)


def _bound_target(mod, config: TargetConfig):
    """The target ``tvm.compile`` bound to the functions (its ``BindTarget`` ran before us)."""
    for func in mod.functions.values():
        if func.attrs is not None and "target" in func.attrs:
            return func.attrs["target"]
    current = tvm.target.Target.current(allow_none=True)
    return current if current is not None else config.tvm_target()


def _target_summary(target) -> str:
    arch = target.attrs.get("arch") if "arch" in target.attrs else target.attrs.get("mcpu", "")
    return f"{target.kind.name}{' ' + str(arch) if arch else ''}"


def _check_target(target, config: TargetConfig, name: str) -> None:
    want = config.tvm_target()
    same_kind = target.kind.name == want.kind.name
    same_arch = all(str(target.attrs.get(k, "")) == str(want.attrs.get(k, "")) for k in ("arch", "mcpu"))
    if not (same_kind and same_arch):
        raise PipelineError(
            f"tvm.compile target is {_target_summary(target)} but tir_pipeline={name!r} compiles for "
            f"{_target_summary(want)} (config {config.name!r}); pass the config's target: "
            f"tessera_tvm.load_config({config.name!r}).tvm_target()"
        )


def _check_kernel_config(gv, func, config: TargetConfig, name: str) -> None:
    built_for = str(func.attrs.get(CONFIG_ATTR, "?"))
    fingerprint = str(func.attrs.get(FINGERPRINT_ATTR, ""))
    if fingerprint != config.fingerprint():
        raise PipelineError(
            f"Tessera kernel {gv.name_hint} was partitioned for config {built_for!r} but is compiled with "
            f"tir_pipeline={name!r}; partition and compile with the same config (report.tir_pipeline)"
        )


def _check_tvm_codegen(mod, config: TargetConfig) -> None:
    """Fail now, with the reason, when TVM itself cannot generate code for its own device kernels."""
    kinds = {
        f.attrs["target"].kind.name
        for f in mod.functions.values()
        if f.attrs is not None and "target" in f.attrs and f.attrs["target"].kind.name not in ("c", "llvm")
    }
    for kind in sorted(kinds):
        if tvm.get_global_func(f"target.build.{kind}", allow_missing=True) is None:
            names = sorted(
                str(gv.name_hint)
                for gv, f in mod.functions.items()
                if f.attrs is not None and "target" in f.attrs and f.attrs["target"].kind.name == kind
            )
            raise PipelineError(
                f"TVM in this build has no code generator for target kind {kind!r} (target.build.{kind}), "
                f"so the operators left to TVM cannot be compiled for config {config.name!r}: "
                f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''}. The Tessera kernels still "
                "lower and generate source: tessera_tvm.relax.device_sources(mod, config)."
            )


# ---------------------------------------------------------------------------------------------
# One Tessera kernel: lower with the config's lists, keep the host function, carry the device code
# ---------------------------------------------------------------------------------------------

_ADDED_ATTRS = (KERNEL_ATTR, CONFIG_ATTR, FINGERPRINT_ATTR, "target", *RELAX_ATTRS)


def tile_program(func):
    """The tile program as ``build_tile_program`` made it (without the attrs Relax/TVM added)."""
    for key in _ADDED_ATTRS:
        if func.attrs is not None and key in func.attrs:
            func = func.without_attr(key)
    return func


def lower_kernel(func, config: TargetConfig, pipeline: str):
    """Lower one tile program; return (its host function, the ext_dev carrier of its device code)."""
    from ..lower import lower

    lowered = lower(tile_program(func), config, build=False)  # the config's named lists; cached
    hosts = list(lowered.host_mod.functions.items())
    if len(hosts) != 1:
        raise PipelineError(f"{lowered.name}: expected one host function, found {[str(g.name_hint) for g, _ in hosts]}")
    host = hosts[0][1].without_attr("tirx.is_entry_func")  # the module has many functions, no single entry
    if backend_for(config).kernels_in_host:  # a C function in the same library, not a launch
        host = _call_cpu_kernels_by_symbol(host, lowered.device_mod)
    else:
        host = tensormaps_aligned(host)
    symbol = str(func.attrs["global_symbol"]) + CARRIER_SUFFIX
    carrier = tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(0)).with_attrs(
        {
            "target": tvm.target.Target(CARRIER_TARGET_KIND),
            "global_symbol": symbol,
            DEVICE_MOD_ATTR: lowered.device_mod,
            PIPELINE_ATTR: pipeline,
            CONFIG_ATTR: config.name,
        }
    )
    return host, carrier


#: ``cuTensorMapEncodeTiled`` wants its descriptor 64-byte aligned (TVM's runtime checks it).
TENSORMAP_ALIGN = 64


def tensormaps_aligned(host):
    """``host`` with each TMA descriptor it encodes (``__tvm_tensormap_create_*``) at a 64-byte
    aligned address.

    TileLang's host code puts a descriptor in ``tvm_stack_alloca("tvm_ffi_any", 16)``, which TVM's C
    host codegen declares as ``TVMFFIAny stack[16]``: 16-byte aligned, so a Relax executable's
    first TMA launch failed with "tensorMap address must be 64-byte aligned" on an H200 (2026-11-30;
    TileLang's own JIT and Tessera's CUDA modules encode their descriptors elsewhere). Each such
    stack array gets room for one more 64 bytes and the descriptor starts at its first aligned byte.
    """
    tirx = tvm.tirx
    alloca = tvm.ir.Op.get("tirx.tvm_stack_alloca")
    call_packed = tvm.ir.Op.get("tirx.tvm_call_packed")
    descriptors = []

    def find(node) -> None:
        if (
            isinstance(node, tirx.Call)
            and node.op.same_as(call_packed)
            and str(node.args[0].value).startswith("__tvm_tensormap_create")
        ):
            descriptors.append(node.args[1])

    tirx.stmt_functor.post_order_visit(host.body, find)
    if not descriptors:
        return host
    extra = TENSORMAP_ALIGN // 16  # a tvm_ffi_any is 16 bytes
    align = tirx.const(TENSORMAP_ALIGN, "uint64")

    def rewrite(node):
        if not (
            any(node.var.same_as(d) for d in descriptors)
            and isinstance(node.value, tirx.Call)
            and node.value.op.same_as(alloca)
        ):
            return None
        kind, count = node.value.args
        stack = tirx.Var(f"{node.var.name}_stack", "handle")
        address = tirx.Call("uint64", "tirx.reinterpret", [stack])
        skip = tirx.Cast("int64", (align - address % align) % align)
        return tirx.SeqStmt(
            [
                tirx.Bind(stack, tirx.Call("handle", alloca, [kind, count + extra])),
                tirx.Bind(node.var, tirx.Call("handle", "tirx.handle_add_byte_offset", [stack, skip])),
            ]
        )

    return host.with_body(tirx.stmt_functor.ir_transform(host.body, None, rewrite, ["tirx.Bind"]))


def _call_cpu_kernels_by_symbol(host, device_mod):
    """CPU: the host calls its device kernel as a C function; make that an extern call by symbol.

    The device kernel is compiled in its own translation unit (TileLang's C codegen), so the host's
    C code must not need the PrimFunc; pointers travel as ``void*`` (C linkage ignores the type).
    """
    names = {str(gv.name_hint) for gv in device_mod.get_global_vars()}

    def rewrite(node):
        if isinstance(node, tvm.tirx.Call) and isinstance(node.op, tvm.ir.GlobalVar) and node.op.name_hint in names:
            args = [tvm.tirx.Cast("handle", a) if a.dtype == "handle" else a for a in node.args]
            return tvm.tirx.call_extern(node.dtype, str(node.op.name_hint), *args)
        return None

    return host.with_body(tvm.tirx.stmt_functor.ir_transform(host.body, None, rewrite, ["tirx.Call"]))


# ---------------------------------------------------------------------------------------------
# target.build.ext_dev: TileLang's device codegen for each carrier
# ---------------------------------------------------------------------------------------------


_CONTEXTS: dict[str, Any] = {}


def device_runtime_module(device_mod, config: TargetConfig, *, compile_device: bool | None = None):
    """The runtime module of one kernel's lowered device module (C source, CUDA or HIP).

    CUDA is compiled with nvcc when the config says so and nvcc is on PATH (else source only).
    """
    from .._tvm import create_backend_context
    from ..target.cuda.nvcc import nvcc_available

    target = config.tvm_target()
    key = config.fingerprint()
    if key not in _CONTEXTS:  # TileLang's backend for the target (resolving it logs; once is enough)
        _CONTEXTS[key] = create_backend_context(target, target.host, execution_backend="auto")
    context = _CONTEXTS[key]
    if compile_device is None:
        compile_device = config.codegen_dict["compiler"] == "nvcc" and nvcc_available()
    with target:
        module = context.codegen_device(device_mod, compile_device=compile_device)
    if backend_for(config).kernels_in_host:  # compiled by export_library with the host code
        names = sorted(str(gv.name_hint) for gv in device_mod.get_global_vars())
        module = _self_contained_c(module, names, config.codegen_dict["flags"])
    return module


def _self_contained_c(module, kernel_names: list[str], flags) -> Any:
    """The C source as ``export_library`` can compile it with no options: TileLang's and Tessera's
    CPU headers included by absolute path, and the config's ``-DNAME=VALUE`` flags as ``#define``
    lines (the generated code may use those macros)."""
    from ..target.cpu.build import RUNTIME_INCLUDE_DIR, aligned_local_arrays, with_spec_pragmas
    from ..target.toolchain import tilelang_include_dirs

    header = f'#include "{tilelang_include_dirs()[0]}/tl_templates/cpp/common.h"'
    source = with_spec_pragmas(aligned_local_arrays(module.inspect_source()))  # every kernel is from a spec
    source = source.replace("#include <tl_templates/cpp/common.h>", header)
    source = source.replace("#include <tessera/cpu.h>", f'#include "{RUNTIME_INCLUDE_DIR}/tessera/cpu.h"')
    defines = [_define(flag[2:]) for flag in flags if flag.startswith("-D")]
    if defines:
        source = "// compiler flags of the config, as macros\n" + "\n".join(defines) + "\n" + source
    pragmas = optimization_pragmas(tuple(flags))
    if pragmas:
        source = "\n".join(pragmas) + "\n" + source
    return tvm.get_global_func("runtime.CSourceModuleCreate")(source, "cc", kernel_names, [])


@functools.cache
def optimization_pragmas(flags: tuple[str, ...]) -> list[str]:
    """The config's ``-O`` and ``-march`` flags as GCC pragmas, so that the kernels are optimised
    even when ``export_library`` (or the VM's own ``jit``) compiles them without options: without
    them g++ builds at -O0 and a model runs ~20x slower. They apply only to a compile without -O. ``-march=native`` is resolved to this
    machine's CPU name (pragmas do not take "native"). ``-fopenmp`` has no pragma: without the
    export options the kernels run on one thread."""
    from ..target.toolchain import find_tool, run_tool

    lines = []
    level = next((f[2:] for f in reversed(flags) if re.fullmatch(r"-O[0-3sfast]*", f)), None)
    if level:
        lines.append(f'#pragma GCC optimize("O{level}")')
    arch = next((f.split("=", 1)[1] for f in reversed(flags) if f.startswith("-march=")), None)
    cxx = find_tool("g++")
    if arch == "native" and cxx is not None:
        report = run_tool([cxx, "-march=native", "-Q", "--help=target"], timeout=60).output
        found = re.search(r"^\s*-march=\s+(\S+)", report, re.MULTILINE)
        arch = found[1] if found else None
    if arch and arch != "native":
        lines.append(f'#pragma GCC target("arch={arch}")')
    if level:  # what the config turns off at that level stays off (-fno-strict-aliasing, ...)
        lines += [f'#pragma GCC optimize("{f[2:]}")' for f in flags if f.startswith("-fno-")]
    if lines:  # only when the compile has no -O (pragmas next to the same flags would block inlining)
        lines.insert(0, "// the config's optimisation flags, for a compile without them (GCC)")
        lines = ["#if defined(__GNUC__) && !defined(__clang__) && !defined(__OPTIMIZE__)", *lines, "#endif"]
    return lines


def _define(definition: str) -> str:
    """``-DNAME=VALUE`` (or ``-DNAME``) as the ``#define`` line it means."""
    name, sep, value = definition.partition("=")
    return f"#define {name} {value if sep else '1'}"


def _build_carriers(mod, _target):
    """``target.build.ext_dev``: one runtime module importing every carried device module."""
    modules = []
    for _, carrier in sorted(mod.functions.items(), key=lambda item: str(item[0].name_hint)):
        config = _config_of(str(carrier.attrs[PIPELINE_ATTR]))
        modules.append(device_runtime_module(carrier.attrs[DEVICE_MOD_ATTR], config))
    root = modules[0]
    for other in modules[1:]:
        root.import_module(other)
    return root
