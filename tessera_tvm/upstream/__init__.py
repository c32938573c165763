"""Tessera offload inside a user's own apache-tvm (issue #17): ``import tessera_tvm`` in a process
whose ``tvm`` is upstream apache-tvm (and where tilelang is not installed) gives this API.

    import tvm, tessera_tvm
    mod, report = tessera_tvm.partition_for_tessera(mod, "cpu")   # the same patterns and report
    ex = tvm.compile(mod, "llvm")                                  # upstream's LLVM for the rest
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    tessera_tvm.export_library(ex, "model.so", "cpu")               # kernels linked in, objects cached

The module travels as TVMScript text to Tessera's toolchain process (tessera_tvm/upstream/
toolchain.py), which partitions it and compiles the kernels in TileLang's TVM
(tessera_tvm/relax/bridge.py). What comes back: the module with each kernel call an
``R.call_dps_packed`` of the kernel's symbol, and the kernels' C sources, attached to the module as
``external_mods`` so that ``tvm.compile`` links them into the executable and ``export_library``
into one library.

GPU configs (hopper, ampere) take static shapes. Their kernels come as one C++ source each: the
kernel's tvm-ffi entry with its cubins in it, which launches through the CUDA driver itself. Build
with a CUDA target (``tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")``); a
VM on ``tvm.cuda()`` needs an apache-tvm built with CUDA (PyPI's wheel has no CUDA runtime: it
builds and exports such a model but cannot run it).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import TesseraError, ToolchainProcessError  # noqa: F401
from ..relax_rewrites import fold_batch_norms
from .lift import bind_constants, lift_constants
from .toolchain import Toolchain, shared_toolchain, toolchain_python  # noqa: F401


@dataclass
class OffloadReport:
    """What the toolchain's ``partition_for_tessera`` did (its report, as data); ``str()`` is the
    same table the toolchain side prints."""

    config: str
    tir_pipeline: str
    offloaded: list[dict[str, Any]] = field(default_factory=list)
    not_offloaded: list[dict[str, Any]] = field(default_factory=list)
    rebuilt: dict[str, int] = field(default_factory=dict)
    text: str = ""
    fixed: dict[str, int] = field(default_factory=dict)
    folded: dict[str, int] = field(default_factory=dict)
    checked: dict[str, int] = field(default_factory=dict)

    @property
    def kernels(self) -> list[str]:
        return sorted({o["kernel"] for o in self.offloaded})

    @property
    def relax_pipeline(self) -> str:
        """``tvm.compile(..., relax_pipeline=report.relax_pipeline)`` as in TileLang's TVM: upstream's
        default (apache-tvm has neither of the faults the TileLang-side pipeline keeps out)."""
        return "default"

    def __str__(self) -> str:
        return self.text


def partition_for_tessera(
    mod,
    config: str = "cpu",
    *,
    functions: list[str] | None = None,
    dim_hints: dict[str, int] | None = None,
):
    """Offload what Tessera takes from the Relax module ``mod`` (upstream apache-tvm), as
    ``tessera_tvm.partition_for_tessera`` does in TileLang's TVM. Returns ``(module, OffloadReport)``;
    build the module with upstream's own ``tvm.compile(mod, "llvm")`` (a CUDA target with an LLVM
    host for the GPU configs)."""
    import tvm

    if not isinstance(mod, tvm.IRModule):
        raise TesseraError(f"partition_for_tessera takes a tvm.IRModule of Relax functions, found {type(mod).__name__}")
    if not isinstance(config, str):
        raise TesseraError(
            f"config is {config!r}; from upstream apache-tvm pass a config name such as 'cpu' or a YAML path"
        )
    if config.endswith((".yaml", ".yml")) and os.path.exists(config):  # a YAML path: the toolchain runs elsewhere
        config = os.path.abspath(config)
    # Batch norms are folded here, while the weights are still constants (they travel as parameters).
    mod, folded = fold_batch_norms(mod, tvm)
    lifted_mod, constants = lift_constants(mod)
    request = {"op": "offload", "text": lifted_mod.script(), "config": config, "functions": functions}
    answer = shared_toolchain().request({**request, "dim_hints": dim_hints, "folded": {"batch_norm": folded}})
    try:
        out = tvm.script.from_source(answer["text"])
    except Exception as exc:  # noqa: BLE001 - a dialect difference the bridge does not translate yet
        raise TesseraError(f"upstream TVM could not parse the partitioned module from the toolchain: {exc}") from None
    out = bind_constants(out, constants)
    if answer["sources"]:
        out = out.with_attr("external_mods", [*_existing_external_mods(mod), _kernel_module(answer["sources"])])
    runtime, title = answer.get("device_runtime"), answer.get("device_title")
    if runtime and not tvm.runtime.enabled(runtime):
        warnings.warn(
            f"config {config!r} offloads to {title} kernels, but this apache-tvm {tvm.__version__} has no {title} "
            "runtime (PyPI's wheel is built without it): the module builds and exports here, and runs where "
            f"apache-tvm is built with {title}",
            stacklevel=2,
        )
    data = answer["report"]
    report = OffloadReport(
        data["config"],
        data["tir_pipeline"],
        list(data["offloaded"]),
        list(data["not_offloaded"]),
        dict(data["rebuilt"]),
        answer["report_text"],
        dict(data.get("fixed", {})),
        dict(data.get("folded", {})),
        dict(data.get("checked", {})),
    )
    return out, report


def _existing_external_mods(mod) -> list:
    attrs = dict(mod.attrs) if mod.attrs else {}
    return list(attrs.get("external_mods", []))


def _kernel_module(sources: list[dict[str, Any]]):
    """The kernels' C sources as one runtime module: the host functions (the entries the VM calls by
    name), importing the device kernels' sources. ``export_library`` (or the VM's ``jit``) compiles
    and links them into the user's library."""
    import tvm

    create = tvm.get_global_func("runtime.CSourceModuleCreate")
    host, *devices = (create(s["code"], s["format"], s["names"], []) for s in sources)
    for device in devices:
        host.import_module(device)
    return host


def export_options(config: str = "cpu") -> list[str]:
    """Options for ``export_library`` that build the kernels as the config says (``-O3
    -march=native -fopenmp`` for the CPU), from the toolchain (``tessera_tvm.relax.export_options``
    there). Without them the kernels still get the config's optimisation (pragmas in their source)
    but run on one thread."""
    return list(shared_toolchain().request({"op": "export_options", "config": config})["options"])


def export_library(executable, path: str | os.PathLike[str], config: str = "cpu") -> str:
    """``executable.export_library(path)`` with the config's options (:func:`export_options`); on a
    CPU config the toolchain compiles each source into an object of its own, in parallel, the kernels
    with the precompiled C prelude, keeps the objects in the kernel cache (a model exported again
    links in about a second) and links the library. Returns ``path``."""
    path = os.fspath(path)

    def fcompile(output, files, options=None, **kwargs):
        request = {
            "op": "build_library",
            "config": config,
            "output": os.fspath(output),
            "files": [os.fspath(f) for f in files],
            "options": list(options or []),
        }
        if not shared_toolchain().request(request).get("built"):
            from tvm.contrib import cc

            cc.create_shared(output, files, options=options, **kwargs)

    executable.export_library(path, fcompile=fcompile, options=export_options(config))
    return path


def patch_torch_frontend() -> bool:
    """Give apache-tvm's torch importer the converters it lacks or gets wrong
    (tessera_tvm/frontend_fixes.py); run by ``import tessera_tvm``. False without a torch frontend."""
    import tvm

    from ..frontend_fixes import patch_exported_program_importer

    return patch_exported_program_importer(tvm)
