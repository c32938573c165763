"""GEMV / GEMM kernels with low-bit weights as TileLang users write them: a reducer GEMV, int4
GEMV (with a CPU form), an int4 GEMM dequantising into a swizzled shared tile, and fp4 (e2m1).

Written for Tessera's corpus (in a real file: @T.prim_func reads its own source).
Packed int4 weights hold element 2j in the low nibble and 2j + 1 in the high nibble of byte j,
as unsigned values with an implicit zero point of 8: w = (q - 8) * scale[n, k // group].
"""

import numpy as np
import tilelang.language as T

from tessera_tvm._tvm import tilelang  # noqa: F401  (TileLang's TVM first)

from . import Case, checks


def gemv_reducer(N, K, block_n=64, block_k=64, threads=128, dtype="float16", accum_dtype="float32"):
    """y = W @ x with a sum reducer: every (row, k) of a tile contributes once, finalised per row."""

    @T.prim_func
    def main(W: T.Tensor((N, K), dtype), x: T.Tensor((K,), dtype), y: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block_n), threads=threads) as bx:
            x_s = T.alloc_shared((block_k,), dtype)
            acc = T.alloc_reducer((block_n,), accum_dtype, op="sum")
            out = T.alloc_fragment((block_n,), accum_dtype)
            T.reducer_init(acc)
            for ko in T.serial(T.ceildiv(K, block_k)):
                T.copy(x[ko * block_k], x_s)
                for i, kk in T.Parallel(block_n, block_k):
                    T.reducer_update(
                        acc[i],
                        T.cast(W[bx * block_n + i, ko * block_k + kk], accum_dtype) * T.cast(x_s[kk], accum_dtype),
                    )
            T.finalize_reducer(acc, out)
            for i in T.Parallel(block_n):
                y[bx * block_n + i] = T.cast(out[i], dtype)

    return main


def _int4(byte, k):
    """The k-th int4 (k % 2 picks the nibble) of a packed byte, as a signed int32 in [-8, 8)."""
    return ((T.cast(byte, "int32") >> ((k % 2) * 4)) & 15) - 8


def int4_gemv(N, K, group=128, block_n=32, block_k=128, threads=128, dtype="float16", accum_dtype="float32"):
    """y = dequant(Wq) @ x: packed uint8 weights, an fp16 scale per group of ``group`` along K.

    Each CTA keeps a (block_n, block_k) partial-product fragment over the K loop and reduces it
    along K once at the end.
    """

    @T.prim_func
    def main(
        Wq: T.Tensor((N, K // 2), "uint8"),
        scales: T.Tensor((N, K // group), dtype),
        x: T.Tensor((K,), dtype),
        y: T.Tensor((N,), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n), threads=threads) as bx:
            x_s = T.alloc_shared((block_k,), dtype)
            part = T.alloc_fragment((block_n, block_k), accum_dtype)
            out = T.alloc_fragment((block_n,), accum_dtype)
            T.clear(part)
            for ko in T.serial(T.ceildiv(K, block_k)):
                T.copy(x[ko * block_k], x_s)
                for i, kk in T.Parallel(block_n, block_k):
                    k = ko * block_k + kk
                    part[i, kk] += (
                        T.cast(_int4(Wq[bx * block_n + i, k // 2], kk), accum_dtype)
                        * T.cast(scales[bx * block_n + i, k // group], accum_dtype)
                        * T.cast(x_s[kk], accum_dtype)
                    )
            T.reduce_sum(part, out, dim=1)
            for i in T.Parallel(block_n):
                y[bx * block_n + i] = T.cast(out[i], dtype)

    return main


def cpu_int4_gemv(N, K, group=64, block_n=32, block_k=64, dtype="float32"):
    """The CPU form of ``int4_gemv``: a local accumulator per row block and serial K loops."""

    @T.prim_func
    def main(
        Wq: T.Tensor((N, K // 2), "uint8"),
        scales: T.Tensor((N, K // group), dtype),
        x: T.Tensor((K,), dtype),
        y: T.Tensor((N,), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n)) as bx:
            acc = T.alloc_local((block_n,), dtype)
            T.clear(acc)
            for ko in T.serial(T.ceildiv(K, block_k)):
                for i, kk in T.grid(block_n, block_k):
                    k = ko * block_k + kk
                    acc[i] += (
                        T.cast(_int4(Wq[bx * block_n + i, k // 2], kk), dtype)
                        * scales[bx * block_n + i, k // group]
                        * x[k]
                    )
            for i in T.serial(block_n):
                y[bx * block_n + i] = acc[i]

    return main


def _cpu_int4_gemv_case(N=96, K=256, group=64):
    def run(lowered):
        rng = np.random.default_rng(0)
        q = rng.integers(0, 16, size=(N, K), dtype=np.uint8)
        wq = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
        scales = rng.uniform(0.01, 0.1, size=(N, K // group)).astype(np.float32)
        x = rng.standard_normal(K, dtype=np.float32)
        y = np.zeros(N, np.float32)
        lowered(wq, scales, x, y)
        w = (q.astype(np.float32) - 8) * np.repeat(scales, group, axis=1)
        np.testing.assert_allclose(y, w @ x, rtol=1e-4, atol=1e-4 * np.sqrt(K))

    return cpu_int4_gemv(N, K, group), run


def int4_gemm_swizzled(
    M,
    N,
    K,
    group=128,
    block_m=128,
    block_n=128,
    block_k=64,
    stages=2,
    threads=128,
    dtype="float16",
    accum_dtype="float32",
):
    """C = A @ dequant(Bq)^T: the packed (N, K/2) tile is staged in shared memory, dequantised with
    its group scale into an fp16 (block_n, block_k) shared tile that carries a swizzled layout,
    and fed to T.gemm.
    """

    @T.prim_func
    def main(
        A: T.Tensor((M, K), dtype),
        Bq: T.Tensor((N, K // 2), "uint8"),
        scales: T.Tensor((N, K // group), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_m, block_k), dtype)
            Bq_s = T.alloc_shared((block_n, block_k // 2), "uint8")
            B_s = T.alloc_shared((block_n, block_k), dtype)
            C_l = T.alloc_fragment((block_m, block_n), accum_dtype)
            T.annotate_layout({B_s: tilelang.layout.make_swizzled_layout(B_s)})
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, block_k), num_stages=stages):
                T.copy(A[by * block_m, ko * block_k], A_s)
                T.copy(Bq[bx * block_n, ko * block_k // 2], Bq_s)
                for i, j in T.Parallel(block_n, block_k):
                    B_s[i, j] = (
                        T.cast(_int4(Bq_s[i, j // 2], j), dtype) * scales[bx * block_n + i, (ko * block_k + j) // group]
                    )
                T.gemm(A_s, B_s, C_l, transpose_B=True)
            T.copy(C_l, C[by * block_m, bx * block_n])

    return main


def fp4_gemv(N, K, group=32, block_n=32, block_k=128, threads=128, dtype="float16", accum_dtype="float32"):
    """y = dequant(W) @ x with W stored as packed float4_e2m1fn and an fp16 scale per 32 along K."""

    @T.prim_func
    def main(
        W: T.Tensor((N, K), "float4_e2m1fn"),
        scales: T.Tensor((N, K // group), dtype),
        x: T.Tensor((K,), dtype),
        y: T.Tensor((N,), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n), threads=threads) as bx:
            x_s = T.alloc_shared((block_k,), dtype)
            part = T.alloc_fragment((block_n, block_k), accum_dtype)
            out = T.alloc_fragment((block_n,), accum_dtype)
            T.clear(part)
            for ko in T.serial(T.ceildiv(K, block_k)):
                T.copy(x[ko * block_k], x_s)
                for i, kk in T.Parallel(block_n, block_k):
                    part[i, kk] += (
                        T.cast(W[bx * block_n + i, ko * block_k + kk], accum_dtype)
                        * T.cast(scales[bx * block_n + i, (ko * block_k + kk) // group], accum_dtype)
                        * T.cast(x_s[kk], accum_dtype)
                    )
            T.reduce_sum(part, out, dim=1)
            for i in T.Parallel(block_n):
                y[bx * block_n + i] = T.cast(out[i], dtype)

    return main


CASES = [
    Case(
        "gemv_reducer_fp16", lambda: gemv_reducer(1024, 1024), features=("reducer",), gpu=checks.gemv_check(1024, 1024)
    ),
    Case(
        "int4_gemv",
        lambda: int4_gemv(1024, 2048),
        features=("int4",),
        cpu=_cpu_int4_gemv_case,
        gpu=checks.int4_gemv_check(1024, 2048, 128),
    ),
    Case(
        "int4_gemm_swizzled_b",
        lambda: int4_gemm_swizzled(512, 512, 1024),
        features=("int4", "annotate_layout", "pipelined"),
        gpu=checks.int4_gemm_check(512, 512, 1024, 128),
    ),
    Case("fp4_gemv", lambda: fp4_gemv(1024, 2048), features=("fp4",)),
]
