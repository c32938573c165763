"""The CPU backend's manifest (codegen kind ``c``): serial C blocks, g++, and kernels run in-process.

The CPU is the target every machine has: its kernels run on numpy arrays with ctypes, so it is the
reference Tessera runs anywhere, and the only one whose dims may stay symbolic until a call.
"""

from __future__ import annotations

from ..backend import Backend, register_backend

#: Dtypes TVM's C codegen cannot hold (no fp8 type; its C legalisation decodes fp8 wrongly): CPU
#: tile programs take them as float32 (tessera_tvm.tile.CPU_WIDENED, exact for every fp8 value).
_WIDENED = ("float8_e4m3fn", "float8_e5m2")

CPU = register_backend(
    Backend(
        kind="c",
        tvm_kind="c",
        title="CPU",
        source_suffix=".cpp",
        device="cpu",
        thread_blocks=False,
        tile_programs={
            "gemm": "tessera_tvm.tile.gemm:gemm_cpu_program",
            "elementwise": "tessera_tvm.tile.elementwise:elementwise_cpu_program",
            "reduce": "tessera_tvm.tile.reduce:reduce_cpu_program",
            "softmax": "tessera_tvm.tile.reduce:softmax_cpu_program",
            "norm": "tessera_tvm.tile.reduce:norm_cpu_program",
            "attention": "tessera_tvm.tile.attention:attention_cpu_program",
            "conv2d": "tessera_tvm.tile.conv:conv2d_cpu_program",
            "pool2d": "tessera_tvm.tile.pool:pool2d_cpu_program",
        },
        # A block's body is serial code, so no program reads threads or stages.
        program_fields={
            "gemm": ("block_m", "block_n", "block_k"),
            "attention": ("block_m", "block_n", "kv_packs_per_head"),
            "softmax": ("block_m",),  # a row at a time, in vector lanes of a fixed width: no block_n
            "norm": ("block_m",),
            "reduce": ("block_m",),
            "elementwise": ("block_m", "block_n"),
            "conv2d": ("block_m", "block_n", "block_k", "conv_algorithm"),
            "pool2d": (),  # a block per plane
        },
        default_config="cpu",
        unheld_dtypes=_WIDENED,
        tile_spec="tessera_tvm.tile.storage:cpu_storage",
        source_generator="target.build.tilelang_c",
        build="tessera_tvm.target.cpu.lowered:build",
        build_step="the CPU build (g++)",
        entry="tessera_tvm.target.cpu.lowered:entry",
        run="tessera_tvm.target.cpu.lowered:run",
        reload="tessera_tvm.target.cpu.lowered:reload",
        module="tessera_tvm.target.cpu.module:build_module",
        linked_module="tessera_tvm.target.cpu.module:linked_entry",
        runner_hook="tessera_tvm.target.cpu.runner:HOST_RUNNER",
        block_note="tessera_tvm.target.cpu.runner:block_note",
        parallel_grid=True,
        fixed_shapes=False,
        symbolic_extents=True,
        kernels_in_host=True,
        upstream_sources="tessera_tvm.relax.bridge:host_c_sources",
        packed_weights="tessera_tvm.tile.gemm:cpu_packed_b",
        isa_identity="tessera_tvm.target.cpu.build:build_identity",
        # TileLang's C codegen cannot put fp8 in a kernel signature (ts.compile widens it; Relax cannot).
        # bfloat16 is held as uint16 storage (configs/cpu.yaml: tirx.BF16StorageLegalize), in Relax too.
        relax_unsupported_dtypes=_WIDENED,
    )
)
