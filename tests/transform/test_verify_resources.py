"""tessera.VerifyResources: device kernels against the config's resource limits."""

from __future__ import annotations

import re

import pytest
from tvm.script import ir as I
from tvm.script import tirx as T

from tessera_tvm._tvm import tvm
from tessera_tvm.config import load_config
from tessera_tvm.errors import ResourceError, TesseraError
from tessera_tvm.registry import BuildContext, get_pass
from tessera_tvm.transform.verify_resources import check_registers, verify_kernel

from .tile_programs import lower, with_tessera_passes


def verify(mod, config):
    return get_pass("tessera.VerifyResources").factory(BuildContext(config, config.tvm_target()))(mod)


# A CUDA kernel with 8 KiB of dynamic shared memory, 16 bytes of mbarriers and 128 threads.
@I.ir_module
class GpuKernel:
    @T.prim_func
    def main_kernel(A: T.handle("float16", "global")):
        T.func_attr(
            {
                "calling_conv": 2,
                "global_symbol": "main_kernel",
                "target": T.target({"kind": "cuda", "arch": "sm_90a"}),
                "dyn_shared_memory_buf": 8192,
                "thread_extent": {"blockIdx.x": 4, "threadIdx.x": 128},
            }
        )
        A_1 = T.decl_buffer((512,), "float16", data=A)
        bx = T.launch_thread("blockIdx.x", 4)
        buf_dyn_shmem = T.alloc_buffer((8192,), "uint8", scope="shared.dyn")  # noqa: F841
        mbarrier = T.alloc_buffer((2,), "uint64", scope="shared.barrier")  # noqa: F841
        tx = T.launch_thread("threadIdx.x", 128)
        A_1[bx * 128 + tx] = T.float16(0)


# A C kernel: no threads, its tiles are stack arrays (4096 + 2048 floats = 24 KiB).
@I.ir_module
class CpuKernel:
    @T.prim_func
    def main_kernel(A: T.handle("float32", "global")):
        T.func_attr({"global_symbol": "main_kernel", "target": T.target("c"), "thread_extent": {}})
        A_1 = T.decl_buffer((4096,), data=A)
        C_l = T.alloc_buffer((4096,), scope="local")
        A_s = T.alloc_buffer((2048,), scope="shared.dyn")
        for i in range(4096):
            C_l[i] = A_1[i] + A_s[i % 2048]
            A_1[i] = C_l[i]


def test_under_the_limits_the_module_is_unchanged():
    after = verify(GpuKernel, load_config("hopper"))
    tvm.ir.assert_structural_equal(after, GpuKernel)
    tvm.ir.assert_structural_equal(verify(CpuKernel, load_config("cpu")), CpuKernel)


def test_shared_memory_over_the_limit():
    config = with_tessera_passes("hopper", shared_memory_per_block=8192)
    with pytest.raises(ResourceError) as info:
        verify_kernel("main_kernel", GpuKernel["main_kernel"], config)
    assert (info.value.resource, info.value.amount, info.value.limit) == (
        "bytes of shared memory per block",
        8192 + 16,
        8192,
    )
    assert str(info.value) == (
        "kernel 'main_kernel' needs 8208 bytes of shared memory per block but target 'hopper' allows at most "
        "8192; use smaller tiles, or fewer T.Pipelined stages (each stage keeps its own copy of the buffers it "
        "loads)"
    )


def _on_hip(mod):
    func = mod["main_kernel"].with_attr("target", tvm.target.Target({"kind": "hip", "mcpu": "gfx942"}))
    return tvm.IRModule({"main_kernel": func})


def test_hip_barrier_words_take_no_shared_memory():
    # TileLang's HIP codegen declares the mbarrier words as plain locals, so only the 8 KiB of LDS count.
    kernel = _on_hip(GpuKernel)["main_kernel"]
    verify_kernel("main_kernel", kernel, with_tessera_passes("rocm", shared_memory_per_block=8192))
    with pytest.raises(ResourceError) as info:
        verify_kernel("main_kernel", kernel, with_tessera_passes("rocm", shared_memory_per_block=8191))
    assert info.value.amount == 8192


def test_hip_gemm_at_exactly_the_lds_limit_lowers():
    import tilelang.language as TL

    import tessera_tvm

    size = 1024

    @TL.prim_func
    def gemm(
        A: TL.Tensor((size, size), "float16"),
        B: TL.Tensor((size, size), "float16"),
        C: TL.Tensor((size, size), "float32"),
    ):
        with TL.Kernel(size // 128, size // 128, threads=256) as (bx, by):
            A_s = TL.alloc_shared((128, 128), "float16")  # 32 KiB
            B_s = TL.alloc_shared((128, 128), "float16")  # 32 KiB: 64 KiB of LDS in all, rocm's limit
            bar = TL.alloc_barrier(1)
            C_l = TL.alloc_fragment((128, 128), "float32")
            TL.clear(C_l)
            for k in TL.serial(size // 128):
                TL.copy(A[by * 128, k * 128], A_s)
                TL.copy(B[k * 128, bx * 128], B_s)
                TL.barrier_arrive(bar[0])
                TL.barrier_wait(bar[0], k % 2)
                TL.gemm(A_s, B_s, C_l)
            TL.copy(C_l, C[by * 128, bx * 128])

    lowered = tessera_tvm.lower(gemm, "rocm")
    assert re.search(r"^\s+uint64_t bar\[1\];", lowered.source, re.M), "the barrier is no longer a local"
    assert lowered.metadata[0]["resources"]["smem_per_cta"] == 65536


def test_threads_over_the_limit():
    config = with_tessera_passes("hopper", threads_per_block=64)
    with pytest.raises(ResourceError, match="needs 128 threads per block but .* at most 64; use fewer"):
        verify_kernel("main_kernel", GpuKernel["main_kernel"], config)


def test_cpu_local_memory_over_the_limit():
    config = with_tessera_passes("cpu", local_memory_per_kernel=16384)
    with pytest.raises(
        ResourceError,
        match=re.escape(
            "kernel 'main_kernel' needs 24576 bytes of local (stack) memory but target 'cpu' allows at most "
            "16384; use smaller tiles"
        ),
    ):
        verify_kernel("main_kernel", CpuKernel["main_kernel"], config)


def test_absent_limits_are_not_checked():
    # cpu.yaml has no shared-memory or thread limits, hopper.yaml no local-memory limit.
    verify_kernel("main_kernel", GpuKernel["main_kernel"], with_tessera_passes("cpu"))
    verify_kernel("main_kernel", CpuKernel["main_kernel"], with_tessera_passes("hopper"))


def test_registers():
    hopper = load_config("hopper")
    check_registers("main_kernel", 255, hopper, threads_per_block=256)  # 65280 <= 65536
    with pytest.raises(ResourceError, match="needs 256 registers per thread but target .hopper. allows"):
        check_registers("main_kernel", 256, hopper)
    with pytest.raises(ResourceError, match="needs 131072 registers per block .* at most 65536"):
        check_registers("main_kernel", 128, hopper, threads_per_block=1024)
    check_registers("main_kernel", 10_000, load_config("cpu"))  # no register limits on CPU


# ---------------------------------------------------------------------------------------------
# In the pipeline, at the end of OptimizeForTarget, on the lowered 1024^3 GEMM.
# The error crosses TVM's FFI there, which keeps its message but not its class: the pipeline
# reports it as a TesseraError (LoweringError) naming the pass.
# ---------------------------------------------------------------------------------------------


def test_gemm_fits_every_shipped_config():
    for config in ("hopper", "ampere", "rocm"):
        lower("matmul", config)
    lower("matmul_cpu", "cpu")


def test_pipeline_rejects_gemm_over_the_shared_memory_limit():
    # 3 stages of 128x32 + 32x128 fp16 tiles (49152 bytes) + 6 mbarriers (48 bytes) > 32 KiB
    with pytest.raises(
        TesseraError,
        match=re.escape(
            "kernel 'main_kernel' needs 49200 bytes of shared memory per block but target 'hopper' allows at "
            "most 32768; its buffers: A_s 128x32 float16 (8192 B), B_s 32x128 float16 (8192 B), pipelined over 3 "
            "stages; use smaller tiles, or fewer T.Pipelined stages"
        ),
    ):
        lower("matmul", "hopper", shared_memory_per_block=32768)


def test_pipeline_rejects_warp_specialised_block_over_the_thread_limit():
    # The program asks for 128 threads; warp specialisation launches 256.
    with pytest.raises(TesseraError, match="'main_kernel' needs 256 threads per block but target 'hopper'"):
        lower("matmul", "hopper", threads_per_block=128)


def test_pipeline_rejects_cpu_tiles_over_the_stack_limit():
    with pytest.raises(TesseraError, match="'main_kernel' needs 32768 bytes of local .stack. memory"):
        lower("matmul_cpu", "cpu", local_memory_per_kernel=16384)


# --- through tessera_tvm.lower: the hint names the program's own buffers (issue #13) -------------


def test_a_row_kernel_is_told_about_its_rows_not_gemm_tiles(monkeypatch):
    import tessera_tvm
    from tests.programs import gemm as programs

    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")
    with pytest.raises(ResourceError) as info:
        tessera_tvm.lower(programs.row_stage(256, 65536), "hopper", build=False)
    message = str(info.value)
    assert "needs 262144 bytes of shared memory" in message
    assert "its buffers: rows 1x65536 float32 (262144 B); use smaller tiles" in message
    assert "Pipelined" not in message and "A and one B" not in message


def test_a_pipelined_gemm_is_told_its_tiles_and_stages(monkeypatch):
    import tessera_tvm
    from tests.programs import gemm as programs

    monkeypatch.setenv("TESSERA_DISABLE_CACHE", "1")
    with pytest.raises(
        ResourceError,
        match="its buffers: A_s 256x64 float16 \\(32768 B\\), B_s 64x256 float16 "
        "\\(32768 B\\), pipelined over 4 stages; use smaller tiles, or fewer T.Pipelined stages",
    ):
        tessera_tvm.lower(programs.gemm(1024, 1024, 1024, 256, 256, 64, stages=4), "hopper", build=False)
