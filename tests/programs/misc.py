"""Everyday TileLang kernels that are not GEMMs or norms: a fused element-wise epilogue, a select
through a bool mask, an fp8 quantising cast, a per-row top-k, an im2col convolution and a hand
warp-specialised GEMM.

Written for Tessera's corpus (in a real file: @T.prim_func reads its own source).
"""

import numpy as np
import tilelang.language as T

from tessera_tvm._tvm import tilelang  # noqa: F401  (TileLang's TVM first)

from . import Case, checks


def add_gelu(M, N, block_m=32, block_n=128, dtype="float16", threads=128):
    """Y = gelu(X + R) (tanh approximation) in fp32 math over a ragged 2-D fp16 tensor."""
    k0 = 0.7978845608028654  # sqrt(2 / pi)
    k1 = 0.044715

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), R: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            x = T.alloc_fragment((block_m, block_n), dtype)
            r = T.alloc_fragment((block_m, block_n), dtype)
            y = T.alloc_fragment((block_m, block_n), dtype)
            T.copy(X[by * block_m, bx * block_n], x)
            T.copy(R[by * block_m, bx * block_n], r)
            for i, j in T.Parallel(block_m, block_n):
                v = T.cast(x[i, j], "float32") + T.cast(r[i, j], "float32")
                y[i, j] = T.cast(0.5 * v * (1.0 + T.tanh(k0 * (v + k1 * v * v * v))), dtype)
            T.copy(y, Y[by * block_m, bx * block_n])

    return main


def masked_where(M, N, block_m=32, block_n=64, threads=128):
    """Y = where(Mask, A, B) with a bool mask, as padding masks are applied."""

    @T.prim_func
    def main(
        Mask: T.Tensor((M, N), "bool"),
        A: T.Tensor((M, N), "float32"),
        B: T.Tensor((M, N), "float32"),
        Y: T.Tensor((M, N), "float32"),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            for i, j in T.Parallel(block_m, block_n):
                row, col = by * block_m + i, bx * block_n + j
                if row < M and col < N:
                    Y[row, col] = T.if_then_else(Mask[row, col], A[row, col], B[row, col])

    return main


def _cpu_masked_where_case(M=8, N=16):
    # The CPU form loops over the whole tensor in one block. GCC 12.2 at -O3 with AVX2 vectorised this
    # loop nest wrongly (48 of these 128 elements came out wrong) until the CPU config turned loop
    # if-conversion off for programs that are not Tessera's own.
    @T.prim_func
    def main(
        Mask: T.Tensor((M, N), "bool"),
        A: T.Tensor((M, N), "float32"),
        B: T.Tensor((M, N), "float32"),
        Y: T.Tensor((M, N), "float32"),
    ):
        with T.Kernel(1, 1) as (bx, by):
            for i, j in T.grid(M, N):
                Y[i, j] = T.if_then_else(Mask[i, j], A[i, j], B[i, j])

    def run(lowered):
        rng = np.random.default_rng(0)
        mask = rng.random((M, N)) > 0.5
        a = rng.standard_normal((M, N), dtype=np.float32)
        b = a + 10
        y = np.zeros((M, N), np.float32)
        lowered(mask, a, b, y)
        np.testing.assert_array_equal(y, np.where(mask, a, b))

    return main, run


def fp8_quant_rows(M, N, block_m=16, threads=128):
    """Per-row dynamic fp8 quantisation: scale = max|x| / 448, Q = e4m3(x / scale), S = scale."""
    fp8 = "float8_e4m3fn"
    fp8_max = 448.0

    @T.prim_func
    def main(X: T.Tensor((M, N), "float16"), Q: T.Tensor((M, N), fp8), S: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            x = T.alloc_fragment((block_m, N), "float32")
            q = T.alloc_fragment((block_m, N), fp8)
            amax = T.alloc_fragment((block_m,), "float32")
            T.copy(X[bx * block_m, 0], x)
            T.reduce_absmax(x, amax, dim=1)
            for i in T.Parallel(block_m):
                amax[i] = T.max(amax[i], 1e-4) / fp8_max
            for i, j in T.Parallel(block_m, N):
                q[i, j] = T.cast(T.clamp(x[i, j] / amax[i], -fp8_max, fp8_max), fp8)
            T.copy(q, Q[bx * block_m, 0])
            for i in T.Parallel(block_m):
                S[bx * block_m + i] = amax[i]

    return main


def topk_rows(M, N, k=4, threads=128, dtype="float32"):
    """Top-k values and their column indices per row, largest first: one thread owns a row and keeps
    a sorted k-array in registers, inserting each element by compare-and-swap down the array."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Vals: T.Tensor((M, k), dtype), Idx: T.Tensor((M, k), "int32")):
        with T.Kernel(T.ceildiv(M, threads), threads=threads) as bx:
            vals = T.alloc_local((k,), dtype)
            idxs = T.alloc_local((k,), "int32")
            cur_v = T.alloc_var(dtype)
            cur_i = T.alloc_var("int32")
            tmp_v = T.alloc_var(dtype)
            tmp_i = T.alloc_var("int32")
            tx = T.get_thread_binding(0)
            row = bx * threads + tx
            if row < M:
                for j in T.unroll(k):
                    vals[j] = -T.infinity(dtype)
                    idxs[j] = -1
                for n in T.serial(N):
                    cur_v = X[row, n]
                    cur_i = n
                    for j in T.unroll(k):
                        if cur_v > vals[j]:
                            tmp_v = vals[j]
                            tmp_i = idxs[j]
                            vals[j] = cur_v
                            idxs[j] = cur_i
                            cur_v = tmp_v
                            cur_i = tmp_i
                for j in T.unroll(k):
                    Vals[row, j] = vals[j]
                    Idx[row, j] = idxs[j]

    return main


def conv2d_im2col(
    N,
    H,
    W,
    C,
    F,
    KH=3,
    stride=1,
    pad=1,
    dilation=1,
    block_m=128,
    block_n=128,
    block_k=64,
    dtype="float16",
    stages=2,
    threads=128,
):
    """NHWC 3x3 convolution as an implicit GEMM: ``T.im2col`` gathers a (N*OH*OW) x (KH*KW*C) patch
    tile into shared memory, the weights are (KH*KW*C) x F, the output (N*OH*OW) x F."""
    OH = (H + 2 * pad - dilation * (KH - 1) - 1) // stride + 1
    OW = (W + 2 * pad - dilation * (KH - 1) - 1) // stride + 1
    GM = N * OH * OW
    GK = KH * KH * C

    @T.prim_func
    def main(img: T.Tensor((N, H, W, C), dtype), wgt: T.Tensor((GK, F), dtype), out: T.Tensor((GM, F), dtype)):
        with T.Kernel(T.ceildiv(F, block_n), T.ceildiv(GM, block_m), threads=threads) as (bx, by):
            patch = T.alloc_shared((block_m, block_k), dtype)
            w_tile = T.alloc_shared((block_k, block_n), dtype)
            acc = T.alloc_fragment((block_m, block_n), "float32")
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(GK, block_k), num_stages=stages):
                T.im2col(img, patch, by, ko, KH, stride, dilation, pad)
                T.copy(wgt[ko * block_k, bx * block_n], w_tile)
                T.gemm(patch, w_tile, acc)
            T.copy(acc, out[by * block_m, bx * block_n])

    return main


def gemm_warp_specialized(M, N, K, block_m=128, block_n=128, block_k=32, stages=3, dtype="float16"):
    """Hand warp-specialised GEMM: warp group 1 produces (TMA loads into a ring of ``stages`` shared
    slots), warp group 0 consumes (tensor-core GEMM). A full/empty mbarrier pair per slot hands the
    slots back and forth; the phase bit is the round number's parity."""
    consumer_threads = 128
    producer_threads = 128

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=consumer_threads + producer_threads) as (
            bx,
            by,
        ):
            a_ring = T.alloc_shared((stages, block_m, block_k), dtype)
            b_ring = T.alloc_shared((stages, block_k, block_n), dtype)
            acc = T.alloc_fragment((block_m, block_n), "float32")
            full = T.alloc_barrier([producer_threads] * stages)
            empty = T.alloc_barrier([consumer_threads] * stages)
            with T.ws(0):
                T.clear(acc)
            # Both roles walk the same K loop, each in its own warp-group scope; they meet only at
            # the mbarriers (a split into two loops would let TileLang put a CTA-wide barrier
            # between the scopes, which deadlocks once the ring wraps: tile-ai/tilelang#2192).
            for ko in T.serial(T.ceildiv(K, block_k)):
                with T.ws(1):
                    T.mbarrier_wait_parity(empty[ko % stages], ((ko // stages) & 1) ^ 1)
                    T.tma_copy(
                        A[by * block_m : (by + 1) * block_m, ko * block_k : (ko + 1) * block_k],
                        a_ring[ko % stages, :, :],
                        barrier=full[ko % stages],
                    )
                    T.tma_copy(
                        B[ko * block_k : (ko + 1) * block_k, bx * block_n : (bx + 1) * block_n],
                        b_ring[ko % stages, :, :],
                        barrier=full[ko % stages],
                    )
                    T.mbarrier_arrive(full[ko % stages])
                with T.ws(0):
                    T.mbarrier_wait_parity(full[ko % stages], (ko // stages) & 1)
                    T.gemm(a_ring[ko % stages, :, :], b_ring[ko % stages, :, :], acc)
                    T.mbarrier_arrive(empty[ko % stages])
            with T.ws(0):
                T.copy(acc, C[by * block_m, bx * block_n])

    return main


CASES: list[Case] = [
    Case("add_gelu_ragged", lambda: add_gelu(300, 200), ("elementwise",), gpu=checks.add_gelu_check(300, 200)),
    Case(
        "masked_where",
        lambda: masked_where(256, 200),
        ("elementwise", "bool"),
        cpu=_cpu_masked_where_case,
        gpu=checks.masked_where_check(256, 200),
    ),
    Case("fp8_quant_rows", lambda: fp8_quant_rows(256, 512), ("fp8", "reduce"), gpu=checks.fp8_quant_check(256, 512)),
    Case("topk_rows", lambda: topk_rows(1000, 256, k=4), ("topk", "local_var"), gpu=checks.topk_check(1000, 256, 4)),
    Case(
        "conv2d_im2col_nhwc",
        lambda: conv2d_im2col(8, 32, 32, 64, 128),
        ("im2col", "pipelined"),
        gpu=checks.conv2d_check(8, 32, 32, 64, 128),
    ),
    # TMA and mbarriers are sm90 features: ampere is kept as an expected failure (TileLang rejects
    # T.tma_copy there); on rocm TileLang silently emits per-thread "barriers", so rocm is left out.
    Case(
        "gemm_warp_specialized",
        lambda: gemm_warp_specialized(512, 512, 512),
        ("warp_specialized", "tma"),
        targets=("hopper", "ampere"),
        gpu=checks.gemm_check(512, 512, 512),
    ),
]
