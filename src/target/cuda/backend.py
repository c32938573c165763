"""The CUDA backend's manifest (codegen kind ``cuda``): thread-block tile programs, nvcc, the runtime library.

It also holds the thread-block tile programs and the schedule fields they read, which HIP shares
(:mod:`tessera_tvm.target.hip.backend`): both run TileLang's shared-memory, fragment and MMA programs.
"""

from __future__ import annotations

from ..backend import Backend, register_backend

#: Kernel family -> its tile-program builder on a thread-block target (shared memory, T.gemm, T.Parallel).
THREAD_BLOCK_PROGRAMS = {
    "gemm": "tessera_tvm.tile.gemm:gemm_gpu_program",
    "elementwise": "tessera_tvm.tile.elementwise:elementwise_gpu_program",
    "reduce": "tessera_tvm.tile.reduce:reduce_gpu_program",
    "softmax": "tessera_tvm.tile.reduce:softmax_gpu_program",
    "norm": "tessera_tvm.tile.reduce:norm_gpu_program",
    "attention": "tessera_tvm.tile.attention:attention_gpu_program",
}

#: The TileSchedule fields each family's thread-block program reads.
THREAD_BLOCK_FIELDS: dict[str, tuple[str, ...]] = {
    "gemm": ("block_m", "block_n", "block_k", "stages", "threads", "rasterize"),
    "attention": ("block_m", "block_n", "stages", "threads", "overlap"),  # no K loop, no swizzle
    "softmax": ("block_m", "block_n", "threads"),  # not pipelined: no stages
    "norm": ("block_m", "block_n", "threads"),
    "reduce": ("block_m", "block_n", "threads"),
    "elementwise": ("block_m", "block_n", "threads"),
}

CUDA = register_backend(
    Backend(
        kind="cuda",
        tvm_kind="cuda",
        title="CUDA",
        check_target="tessera_tvm.target.cuda.config:check_target",
        source_suffix=".cu",
        device="gpu",
        thread_blocks=True,
        tile_programs=THREAD_BLOCK_PROGRAMS,
        program_fields=THREAD_BLOCK_FIELDS,
        default_config="hopper",
        source_generator="target.build.tilelang_cuda_without_compile",
        build="tessera_tvm.target.cuda.lowered:build",
        build_step="the CUDA build (nvcc, runtime library)",
        run="tessera_tvm.target.cuda.lowered:run",
        run_needs="runtime",
        tensor_device="cuda",
        upstream_sources="tessera_tvm.relax.bridge:cuda_sources",
        runner_hook="tessera_tvm.target.cuda.runner:GPU_RUNNER",
        module="tessera_tvm.target.cuda.module:build_module",
        linked_module="tessera_tvm.target.cuda.module:linked_module",
        device_launches="tessera_tvm.target.cuda.module:device_launches",
    )
)
