"""The HIP backend's manifest (codegen kind ``hip``): CUDA's thread-block tile programs, HIP source only.

hipcc is not run here (configs/rocm.yaml has ``compiler: none``): the generated ``.hip.cpp`` is the
artifact, and HIP kernels do not run in this process.
"""

from __future__ import annotations

from ..backend import Backend, register_backend
from ..cuda.backend import THREAD_BLOCK_FIELDS, THREAD_BLOCK_PROGRAMS

HIP = register_backend(
    Backend(
        kind="hip",
        tvm_kind="hip",
        title="HIP",
        check_target="tessera_tvm.target.hip.config:check_target",
        source_suffix=".hip.cpp",
        device="gpu",
        thread_blocks=True,
        tile_programs=THREAD_BLOCK_PROGRAMS,  # TileLang lowers the same programs for AMD GPUs
        program_fields=THREAD_BLOCK_FIELDS,
        default_config="rocm",
        source_generator="target.build.tilelang_hip_without_compile",
        tensor_device="cuda",  # what a ModulePlan would say (no HIP module yet): a GPU's memory
        barriers_apart=True,
    )
)
