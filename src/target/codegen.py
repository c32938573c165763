"""Device source generation: the lowered device module to CUDA, HIP or C source text, and the
symbol each kernel is compiled under (:func:`kernel_name`).

Each backend names one of TileLang's registered source generators (``Backend.source_generator``),
called here without compiling so that source generation never needs a toolchain.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm

from .backend import backend_for


def device_source(device_mod, config, target=None) -> str:
    """Generate the device source of ``device_mod`` (after CodegenPrep) for ``config`` (a TargetConfig)."""
    target = target if target is not None else config.tvm_target()
    generate = tvm.ffi.get_global_func(backend_for(config).source_generator)
    with target:
        return generate(device_mod, target).inspect_source()


def kernel_name(gv, func) -> str:
    """The symbol the kernel is compiled and launched under."""
    symbol = func.attrs.get("global_symbol") if func.attrs else None
    return str(symbol) if symbol is not None else str(gv.name_hint)
