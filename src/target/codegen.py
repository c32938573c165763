"""Device source generation: the lowered device module to CUDA, HIP or C source text.

The codegen is chosen by the config's ``codegen.kind``; each maps to one of TileLang's registered
source generators, called without compiling so that source generation never needs a toolchain.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.config import TargetConfig

_SOURCE_GENERATORS = {
    "cuda": "target.build.tilelang_cuda_without_compile",
    "hip": "target.build.tilelang_hip_without_compile",
    "c": "target.build.tilelang_c",
}

#: File suffix of each codegen's source artifact.
SOURCE_SUFFIX = {"cuda": ".cu", "hip": ".hip.cpp", "c": ".cpp", "tt": ".tt.cpp"}  # tt: five files instead (lower.py)


def device_source(device_mod, config: TargetConfig, target=None) -> str:
    """Generate the device source of ``device_mod`` (after CodegenPrep) for ``config``."""
    kind = config.codegen_kind
    target = target if target is not None else config.tvm_target()
    generate = tvm.ffi.get_global_func(_SOURCE_GENERATORS[kind])
    with target:
        return generate(device_mod, target).inspect_source()
