"""tessera.AnnotateKernelMetadata: the seed's Kernel Metadata (section 11.2) on every device kernel."""

from __future__ import annotations

import json

import pytest
from tvm.script import ir as I
from tvm.script import tirx as T

from tessera_tvm._tvm import tvm
from tessera_tvm.config import load_config
from tessera_tvm.pipeline import CodegenPrep
from tessera_tvm.registry import BuildContext, get_pass
from tessera_tvm.target.codegen import device_source
from tessera_tvm.transform import analysis
from tessera_tvm.transform.annotate_kernel_metadata import ATTR, KEYS, kernel_metadata, metadata_json

from .tile_programs import lower


def annotate(mod, config="hopper"):
    cfg = load_config(config)
    return get_pass("tessera.AnnotateKernelMetadata").factory(BuildContext(cfg, cfg.tvm_target()))(mod)


# A module as SplitHostDevice + LowerDeviceKernelLaunch leave it: a packed host function that
# carries RecordTileInfo's attr and launches one CUDA kernel with 8 KiB of dynamic shared memory
# and two mbarrier words (16 bytes of static shared memory).
@I.ir_module
class Before:
    @T.prim_func
    def main(A: T.handle("float16", "global")):
        T.func_attr(
            {
                "calling_conv": 1,
                "global_symbol": "__tvm_ffi_main",
                "target": T.target("c"),
                "tessera.tile_info": {
                    "tile": {"M": 64, "N": 64, "K": 32},
                    "stages": 2,
                    "dtype_in": "float16",
                    "dtype_acc": "float32",
                    "threads": 128,
                    "epilogue": ["bias", "relu"],
                },
            }
        )
        T.call_packed("main_kernel", A, 4, 2, 128, 1, 1, 8192)

    @T.prim_func
    def main_kernel(A: T.handle("float16", "global")):
        T.func_attr(
            {
                "calling_conv": 2,
                "global_symbol": "main_kernel",
                "target": T.target({"kind": "cuda", "arch": "sm_90a"}),
                "dyn_shared_memory_buf": 8192,
                "thread_extent": {"blockIdx.x": 4, "blockIdx.y": 2, "threadIdx.x": 128},
            }
        )
        A_1 = T.decl_buffer((1024,), "float16", data=A)
        bx = T.launch_thread("blockIdx.x", 4)
        buf_dyn_shmem = T.alloc_buffer((8192,), "uint8", scope="shared.dyn")  # noqa: F841
        mbarrier = T.alloc_buffer((2,), "uint64", scope="shared.barrier")  # noqa: F841
        by = T.launch_thread("blockIdx.y", 2)
        tx = T.launch_thread("threadIdx.x", 128)
        A_1[bx * 256 + by * 128 + tx] = T.float16(0)


@I.ir_module
class Expected:
    @T.prim_func
    def main(A: T.handle("float16", "global")):
        T.func_attr(
            {
                "calling_conv": 1,
                "global_symbol": "__tvm_ffi_main",
                "target": T.target("c"),
                "tessera.tile_info": {
                    "tile": {"M": 64, "N": 64, "K": 32},
                    "stages": 2,
                    "dtype_in": "float16",
                    "dtype_acc": "float32",
                    "threads": 128,
                    "epilogue": ["bias", "relu"],
                },
            }
        )
        T.call_packed("main_kernel", A, 4, 2, 128, 1, 1, 8192)

    @T.prim_func
    def main_kernel(A: T.handle("float16", "global")):
        T.func_attr(
            {
                "calling_conv": 2,
                "global_symbol": "main_kernel",
                "target": T.target({"kind": "cuda", "arch": "sm_90a"}),
                "dyn_shared_memory_buf": 8192,
                "thread_extent": {"blockIdx.x": 4, "blockIdx.y": 2, "threadIdx.x": 128},
                "tessera.metadata": {
                    "name": "main_kernel",
                    "tile": {"M": 64, "N": 64, "K": 32, "stages": 2},
                    "fragments": {"dtype_in": "float16", "dtype_acc": "float32"},
                    "resources": {"smem_per_cta": 8192 + 16, "threads_per_block": 128, "local_bytes": 0},
                    "launch": {"grid": [4, 2, 1], "block": [128, 1, 1], "smem_bytes": 8192},
                    "epilogue": ["bias", "relu"],
                },
            }
        )
        A_1 = T.decl_buffer((1024,), "float16", data=A)
        bx = T.launch_thread("blockIdx.x", 4)
        buf_dyn_shmem = T.alloc_buffer((8192,), "uint8", scope="shared.dyn")  # noqa: F841
        mbarrier = T.alloc_buffer((2,), "uint64", scope="shared.barrier")  # noqa: F841
        by = T.launch_thread("blockIdx.y", 2)
        tx = T.launch_thread("threadIdx.x", 128)
        A_1[bx * 256 + by * 128 + tx] = T.float16(0)


def test_annotates_device_kernel_from_host_tile_info():
    tvm.ir.assert_structural_equal(annotate(Before), Expected)


def test_leaves_its_input_unchanged():
    before = Before.script()
    annotate(Before)
    assert Before.script() == before


def test_kernel_without_tile_info_gets_measured_fields_only():
    mod = Before.clone()
    gv = mod.get_global_var("main")
    mod[gv] = mod[gv].without_attr("tessera.tile_info")
    (metadata,) = kernel_metadata(annotate(mod))
    assert metadata == {
        "name": "main_kernel",
        "tile": {},
        "fragments": {},
        "resources": {"smem_per_cta": 8208, "threads_per_block": 128, "local_bytes": 0},
        "launch": {"grid": [4, 2, 1], "block": [128, 1, 1], "smem_bytes": 8192},
        "epilogue": [],
    }


def test_kernel_metadata_is_plain_json_in_the_seeds_key_order():
    metadata = kernel_metadata(annotate(Before))
    assert [list(m) for m in metadata] == [list(KEYS)]
    assert json.loads(metadata_json(metadata)) == metadata
    assert metadata_json(metadata).startswith('[\n  {\n    "name": "main_kernel",\n    "tile": {')


# ---------------------------------------------------------------------------------------------
# End to end: the 1024^3 fp16 GEMM with 128x128x32 tiles, 3 stages (64x64x32 fp32 tiles on CPU),
# through each config with RecordTileInfo first and AnnotateKernelMetadata last.
# ---------------------------------------------------------------------------------------------

GEMM_TILE = {"M": 128, "N": 128, "K": 32, "stages": 3}
GEMM_FRAGMENTS = {"dtype_in": "float16", "dtype_acc": "float32"}


def test_hopper_gemm():
    (metadata,) = kernel_metadata(lower("matmul", "hopper"))
    assert metadata == {
        "name": "main_kernel",
        "tile": GEMM_TILE,
        "fragments": GEMM_FRAGMENTS,
        # 3 stages x (128x32 + 32x128) fp16 = 49152 bytes of TMA buffers, plus 6 mbarriers x 8 bytes
        # (full/empty per stage) that the warp-specialised kernel declares as static __shared__.
        "resources": {"smem_per_cta": 49152 + 48, "threads_per_block": 256, "local_bytes": 0},
        # 1024/128 = 8 tiles per axis. Warp specialisation adds a 128-thread TMA producer warp group
        # to the program's 128 consumer threads (which issue wgmma).
        "launch": {"grid": [8, 8, 1], "block": [256, 1, 1], "smem_bytes": 49152},
        "epilogue": [],
    }


def test_ampere_gemm():
    (metadata,) = kernel_metadata(lower("matmul", "ampere"))
    # cp.async multi-buffering: the same 3 x 16 KiB stages, no mbarriers, no producer warps.
    assert metadata["tile"] == GEMM_TILE and metadata["fragments"] == GEMM_FRAGMENTS
    assert metadata["resources"] == {"smem_per_cta": 49152, "threads_per_block": 128, "local_bytes": 0}
    assert metadata["launch"] == {"grid": [8, 8, 1], "block": [128, 1, 1], "smem_bytes": 49152}


def test_rocm_gemm():
    (metadata,) = kernel_metadata(lower("matmul", "rocm"))
    # TileLang 0.1.15 does not multi-buffer T.Pipelined on HIP (tilelang.lower gives the same):
    # one 128x32 + 32x128 fp16 stage = 16384 bytes of LDS, although the program asks for 3 stages.
    assert metadata["tile"] == GEMM_TILE and metadata["fragments"] == GEMM_FRAGMENTS
    assert metadata["resources"] == {"smem_per_cta": 16384, "threads_per_block": 128, "local_bytes": 0}
    assert metadata["launch"] == {"grid": [8, 8, 1], "block": [128, 1, 1], "smem_bytes": 16384}


def test_cpu_gemm():
    (metadata,) = kernel_metadata(lower("matmul_cpu", "cpu"))
    # The C kernel is one call whose threads share the 16x16 tile grid (1024 / 64 blocks each way),
    # one thread per block at a time. Its tiles are stack arrays:
    # C 64x64 + A 64x32 (shared.dyn in the program) + B 32x64, all fp32 = 16384 + 8192 + 8192 bytes.
    assert metadata == {
        "name": "main_kernel",
        "tile": {"M": 64, "N": 64, "K": 32},  # a T.serial K loop: no stages
        "fragments": {"dtype_in": "float32", "dtype_acc": "float32"},
        "resources": {"smem_per_cta": 0, "threads_per_block": 1, "local_bytes": 32768},
        "launch": {"grid": [16, 16, 1], "block": [1, 1, 1], "smem_bytes": 0},
        "epilogue": [],
    }


def test_epilogue_reaches_the_metadata():
    (metadata,) = kernel_metadata(lower("linear", "hopper"))
    assert metadata["epilogue"] == ["bias", "gelu", "cast"]


@pytest.mark.parametrize("config", ["hopper", "rocm", "cpu"])
def test_metadata_does_not_change_device_source(config):
    mod = lower("matmul_cpu" if config == "cpu" else "matmul", config)
    kernels = analysis.device_kernels(mod)
    assert all(ATTR in func.attrs for _, func in kernels)
    with_attr = tvm.IRModule(dict(kernels))
    without_attr = tvm.IRModule({gv: func.without_attr(ATTR) for gv, func in kernels})
    cfg = load_config(config)
    assert device_source(CodegenPrep(with_attr, cfg), cfg) == device_source(CodegenPrep(without_attr, cfg), cfg)


def test_launch_read_from_the_body_when_the_attr_is_missing():
    kernel = Before["main_kernel"].without_attr("thread_extent")
    assert analysis.kernel_launch(kernel) == ((4, 2, 1), (128, 1, 1))
