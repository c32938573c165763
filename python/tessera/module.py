"""A compiled instance as one tvm-ffi library: the plan of its entry, read from the instance.

:func:`module_plan` turns an :class:`~tessera.instance.Instance` (every dim bound) into the backend's
``ModulePlan``: the kernel's inputs and outputs as DLPack tensors, the intermediates the entry
allocates, and the device kernels' calls in order. The backend builds it (``Backend.module``:
on the CPU ``tessera_tvm.target.cpu.module``). What the in-process runner does per call (numpy
dtype conversions) must happen inside the kernels for this: a value whose dtype the tile program
holds differently (fp8 on the CPU) is refused with a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tessera_tvm.graph.nodes import static_shape
from tessera_tvm.target.backend import backend_for
from tessera_tvm.target.module import Call, ModuleError, ModulePlan, TensorArg, check_variants, entry_header
from tessera_tvm.target.tsr import ABI_MAJOR, ABI_MINOR, image_metadata, write_image

from .instance import Instance


def _numel(shape) -> int:
    count = 1
    for d in shape:
        count *= int(d)
    return count


#: What a CPU tile program holds an fp8 value as (tessera_tvm.tile.CPU_WIDENED): the entry converts.
_FP8 = ("float8_e4m3fn", "float8_e5m2")


def _widened(value_dtype: str, kernel_dtype: str) -> bool:
    return value_dtype in _FP8 and kernel_dtype == "float32"


def _intermediate(tensors: dict[str, TensorArg], name: str, dtype: str, shape) -> TensorArg:
    arg = TensorArg(name, dtype, tuple(shape))
    tensors[name] = arg
    return arg


def module_plan(instance: Instance) -> ModulePlan:
    """The entry plan of ``instance``: inputs, outputs, intermediates, calls (see the module docstring)."""
    kernel, graph, env = instance.kernel, instance.graph, instance.env
    where = f"{kernel.name} ({instance.config.name})"
    if graph.simplified.collectives:
        raise ModuleError(
            f"{where}: a sharded kernel whose kernels exchange values through collectives has no single "
            "tvm-ffi entry (the collectives run on torch.distributed between its kernels)"
        )
    names: dict[Any, str] = {}
    tensors: dict[str, TensorArg] = {}

    def tensor(var, name: str) -> TensorArg:
        arg = TensorArg(name, str(var.struct_info.dtype), static_shape(var, env, where))
        names[var] = name
        tensors[name] = arg
        return arg

    inputs = tuple(tensor(var, pname) for var, (pname, _) in zip(graph.params, kernel.params, strict=True))
    outs = list(graph.outputs)
    if len(set(outs)) != len(outs):
        raise ModuleError(f"{where}: returns the same tensor twice; a tvm-ffi entry writes each output once")
    out_names = ["out"] if len(outs) == 1 else [f"out{i}" for i in range(len(outs))]
    taken = {t.name for t in inputs}
    out_names = [n if n not in taken else f"{n}_" for n in out_names]
    copies = []
    outputs = []
    for var, name in zip(outs, out_names, strict=True):
        arg = TensorArg(name, str(var.struct_info.dtype), static_shape(var, env, where))
        outputs.append(arg)
        tensors[name] = arg
        if var in names:  # the kernel returns one of its inputs
            copies.append((names[var], name))
        else:
            names[var] = name
    intermediates = []
    calls = []
    backend = backend_for(instance.config)
    launches = backend.hook("device_launches")
    for launch in instance.launches:
        dk = launch.device
        by_param: dict[str, str] = {}
        converts_in: list[tuple[str, str]] = []
        for var, pname, dtype, shape in launch.inputs:
            held = tensors[names[var]]
            if _numel(shape) != held.numel or (dtype != held.dtype and not _widened(held.dtype, dtype)):
                raise ModuleError(
                    f"{where}: kernel {dk.name} takes {pname} as {dtype} {list(shape)} but the value is "
                    f"{held.dtype} {list(held.shape)}; the tvm-ffi entry does not convert between them"
                )
            if dtype != held.dtype:  # fp8 held as float32 by this kernel: decoded before it runs
                wide = f"{held.name}_{dtype}"
                if wide not in tensors:
                    intermediates.append(_intermediate(tensors, wide, dtype, held.shape))
                converts_in.append((held.name, wide))
                by_param[pname] = wide
            else:
                by_param[pname] = held.name
        pname, dtype, shape = launch.output
        var, graph_dtype, graph_shape = launch.result
        if dtype != graph_dtype and not _widened(graph_dtype, dtype):
            raise ModuleError(
                f"{where}: kernel {dk.name} writes {dtype} for a {graph_dtype} value; the tvm-ffi entry does not "
                "convert between them"
            )
        if var not in names:
            intermediates.append(tensor(var, f"{dk.name}_out"))
        converts_out: list[tuple[str, str]] = []
        if dtype != graph_dtype:  # written as float32, encoded to the value's fp8 after the kernel
            wide = f"{names[var]}_{dtype}"
            intermediates.append(_intermediate(tensors, wide, dtype, tensors[names[var]].shape))
            converts_out.append((wide, names[var]))
            by_param[pname] = wide
        else:
            by_param[pname] = names[var]
        conversions = {"converts_in": tuple(converts_in), "converts_out": tuple(converts_out)}
        if launches is not None:  # a GPU: the host code's launches, over the program's buffers in order
            missing = [p for p in dk.lowered._program_order if p not in by_param]
            if missing:
                raise ModuleError(f"{where}: kernel {dk.name} takes {missing}, which are not tensors of the kernel")
            cubin = dk.lowered.artifacts.get("cubin")
            args = tuple(by_param[p] for p in dk.lowered._program_order)
            binary = str(cubin) if cubin is not None else None
            calls.append(
                Call(dk.name, dk.lowered.name, args, launches=launches(dk.lowered), binary=binary, **conversions)
            )
            continue
        entry = dk.lowered.entry
        if entry is None:
            raise ModuleError(f"{where}: kernel {dk.name} has no C entry on this target")
        symbol, params, _ = entry
        args: list[str | int] = []
        for p in params:
            if p.kind == "buffer":
                args.append(by_param[p.name])
            elif p.name in env:
                args.append(int(env[p.name]))
            else:
                raise ModuleError(f"{where}: kernel {dk.name} takes scalar {p.name}, which is not a bound dim")
        calls.append(Call(dk.name, symbol, tuple(args), **conversions))
    return ModulePlan(
        name=kernel.name,
        inputs=inputs,
        outputs=tuple(outputs),
        intermediates=tuple(intermediates),
        calls=tuple(calls),
        copies=tuple(copies),
        sources=tuple((launch.device.name, launch.device.lowered.source) for launch in instance.launches),
        device=backend.tensor_device,
        bound=tuple((s, int(instance.env[s])) for s in kernel.symbols if s in instance.env),
    )


def module_plans(compiled, shapes, what: str) -> list[ModulePlan]:
    """One plan per set of dims in ``shapes`` (each over ``compiled.shapes``), or the last instance's."""
    from .errors import ShapeError

    if not shapes:
        return [module_plan(compiled._require_instance(what))]
    if isinstance(shapes, dict):
        raise ShapeError(f"{what}: shapes takes a list of dicts, one per set of dims, e.g. [{{'M': 64}}, {{'M': 128}}]")
    plans = []
    for extra in shapes:
        env = {**compiled.shapes, **{k: int(v) for k, v in dict(extra).items()}}
        unknown = [k for k in env if k not in compiled.kernel.symbols]
        missing = [k for k in compiled.kernel.symbols if k not in env]
        if unknown or missing:
            raise ShapeError(
                f"{what}: {compiled.kernel.name} has dims {', '.join(compiled.kernel.symbols)}; shapes {dict(extra)} "
                + (f"names unknown dims {unknown}" if unknown else f"leaves {missing} unbound")
            )
        plans.append(module_plan(compiled._instance_for(env)))
    check_variants(plans)
    return plans


def _kernel_metadata(instance) -> list[dict]:
    """Each device kernel's metadata with its work per run (``flops``, ``bytes``: what the metrics'
    rates are computed from)."""
    return [
        {**m, "fused_kernel": dk.name, "flops": dk.work[0], "bytes": dk.work[1]}
        for dk in instance.devices
        for m in dk.lowered.metadata
    ]


def export_bundle(compiled, out_dir, shapes=None) -> dict[str, Path]:
    """Write ``compiled``'s AOT bundle to ``out_dir``: the tvm-ffi library, ``metadata.json`` (the
    entry, every argument's dtype and shape, each device kernel's metadata), a C header declaring
    the entry and the tsr* image. ``shapes``: several sets of dims, as ``build_module`` takes them.
    All files appear together or none does."""
    from tessera_tvm.target.toolchain import atomic_output_dir, untouched_on_failure

    build = compiled._module_builder()  # first: says which targets build libraries, before any planning
    plans = module_plans(compiled, shapes, "export()")
    plan = plans[0]
    name = plan.name
    instances = [compiled._instances[tuple(sorted(dict(p.bound).items()))] for p in plans]
    bound = " | ".join(", ".join(f"{k}={v}" for k, v in p.bound) for p in plans)

    def arguments(p: ModulePlan) -> list[dict[str, Any]]:
        return [
            {"name": t.name, "role": role, "dtype": t.dtype, "shape": list(t.shape)}
            for group, role in ((p.inputs, "input"), (p.outputs, "output"))
            for t in group
        ]

    metadata = {
        "name": name,
        "target": compiled.config.name,
        "abi": {
            "kind": "tvm-ffi",
            "entry": f"__tvm_ffi_{name}",
            "library": f"{name}.so",
            "header": f"{name}.h",
            "image": f"{name}.tsrb",  # for the tsr* C runtime: tsrLoadModule(ctx, image, size, &mod)
            "tsr_abi": f"{ABI_MAJOR}.{ABI_MINOR}",
        },
        "device": plan.device,  # where the arguments live: cpu or cuda
        "shapes": dict(plan.bound),
        "arguments": arguments(plan),
        "kernels": _kernel_metadata(instances[0]),
    }
    if len(plans) > 1:  # the entry binds the dims from the arguments and runs the matching variant
        metadata["variants"] = [
            {
                "shapes": dict(p.bound),
                "arguments": arguments(p),
                "kernels": _kernel_metadata(inst),
            }
            for p, inst in zip(plans, instances, strict=True)
        ]
    final = Path(out_dir).absolute()
    with untouched_on_failure(final), atomic_output_dir(final) as staging:
        library = build(plans, staging)
        (staging / f"{name}.h").write_text(entry_header(plans, f" Target {compiled.config.name}, {bound}."))
        (staging / "metadata.json").write_text(json.dumps(metadata, indent=2, default=str) + "\n")
        launches = [m["launch"] for m in metadata["kernels"]] if len(plans) == 1 else []
        write_image(staging / f"{name}.tsrb", image_metadata(plans, launches), library)
    return {
        "library": final / library.name,
        "header": final / f"{name}.h",
        "metadata": final / "metadata.json",
        "image": final / f"{name}.tsrb",
    }
