"""Device source generation: the lowered device module to CUDA, HIP or C source text.

Each backend names one of TileLang's registered source generators (``Backend.source_generator``),
called here without compiling so that source generation never needs a toolchain.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.config import TargetConfig

from .backend import backend_for


def device_source(device_mod, config: TargetConfig, target=None) -> str:
    """Generate the device source of ``device_mod`` (after CodegenPrep) for ``config``."""
    target = target if target is not None else config.tvm_target()
    generate = tvm.ffi.get_global_func(backend_for(config).source_generator)
    with target:
        return generate(device_mod, target).inspect_source()
