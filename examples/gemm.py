"""GEMM tile programs in TileLang, the kernels the main job lowers for every target.

tessera lower examples/gemm.py:gemm --target hopper --arg M=4096 --out build/gemm_hopper
"""

import tilelang.language as T

from tessera_tvm._tvm import tilelang  # noqa: F401  (TileLang's TVM first)


def gemm(
    M=1024,
    N=1024,
    K=1024,
    block_m=128,
    block_n=128,
    block_k=32,
    stages=3,
    threads=128,
    dtype="float16",
    accum_dtype="float32",
):
    """GPU GEMM: shared-memory tiles, a fragment accumulator, a software-pipelined K loop."""

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_m, block_k), dtype)
            B_s = T.alloc_shared((block_k, block_n), dtype)
            C_l = T.alloc_fragment((block_m, block_n), accum_dtype)
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, block_k), num_stages=stages):
                T.copy(A[by * block_m, k * block_k], A_s)
                T.copy(B[k * block_k, bx * block_n], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * block_m, bx * block_n])

    return gemm


def cpu_gemm(M=512, N=512, K=512, block_m=64, block_n=64, block_k=32, dtype="float32", accum_dtype="float32"):
    """CPU GEMM: a local accumulator per output tile and a serial K loop (no fragments on CPU)."""

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m)) as (bx, by):
            C_l = T.alloc_local((block_m, block_n), accum_dtype)
            T.clear(C_l)
            for k in T.serial(T.ceildiv(K, block_k)):
                for i, j, kk in T.grid(block_m, block_n, block_k):
                    C_l[i, j] += A[by * block_m + i, k * block_k + kk] * B[k * block_k + kk, bx * block_n + j]
            T.copy(C_l, C[by * block_m, bx * block_n])

    return gemm


def tt_gemm(M=256, N=256, K=256, dtype="bfloat16", accum_dtype="float32"):
    """Tenstorrent GEMM: one 32x32 output tile per block, the K loop in 32-wide steps."""

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, 32), T.ceildiv(M, 32)) as (bx, by):
            A_s = T.alloc_shared((32, 32), dtype)
            B_s = T.alloc_shared((32, 32), dtype)
            C_l = T.alloc_fragment((32, 32), accum_dtype)
            T.clear(C_l)
            for k in T.serial(T.ceildiv(K, 32)):
                T.copy(A[by * 32, k * 32], A_s)
                T.copy(B[k * 32, bx * 32], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * 32, bx * 32])

    return gemm
