"""Row normalisations as TileLang users write them: RMS norm, a multi-block online softmax, layer norm.

Written for Tessera's corpus (in a real file: @T.prim_func reads its own source).
"""

import tilelang.language as T

from tessera_tvm._tvm import tilelang  # noqa: F401  (TileLang's TVM first)

from . import Case, checks


def rms_norm(M, N, block_m=8, dtype="float16", accum_dtype="float32", eps=1e-6, threads=128):
    """Y = X / sqrt(mean(X^2) + eps) * W per row; fp16 in/out, fp32 math, one row block per CTA."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), W: T.Tensor((N,), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            x_s = T.alloc_shared((block_m, N), dtype)
            x = T.alloc_fragment((block_m, N), accum_dtype)
            sq = T.alloc_fragment((block_m, N), accum_dtype)
            ssq = T.alloc_fragment((block_m,), accum_dtype)
            y = T.alloc_fragment((block_m, N), dtype)
            T.copy(X[bx * block_m, 0], x_s)
            for i, j in T.Parallel(block_m, N):
                x[i, j] = T.cast(x_s[i, j], accum_dtype)
                sq[i, j] = x[i, j] * x[i, j]
            T.reduce_sum(sq, ssq, dim=1)
            for i in T.Parallel(block_m):
                ssq[i] = T.rsqrt(ssq[i] / N + eps)
            for i, j in T.Parallel(block_m, N):
                y[i, j] = T.cast(x[i, j] * ssq[i] * T.cast(W[j], accum_dtype), dtype)
            T.copy(y, Y[bx * block_m, 0])

    return main


def online_softmax(M, N, block_m=16, block_n=256, dtype="float16", accum_dtype="float32", threads=128):
    """Row softmax for rows longer than one block.

    Pass one walks the column blocks keeping a running max and a running sum rescaled by
    exp2((m_old - m_new) * log2 e); pass two re-reads the blocks and writes exp(x - m) / l.
    """
    log2e = 1.44269504

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            x = T.alloc_fragment((block_m, block_n), accum_dtype)
            y = T.alloc_fragment((block_m, block_n), dtype)
            m_run = T.alloc_fragment((block_m,), accum_dtype)
            m_blk = T.alloc_fragment((block_m,), accum_dtype)
            l_run = T.alloc_fragment((block_m,), accum_dtype)
            l_blk = T.alloc_fragment((block_m,), accum_dtype)
            T.fill(m_run, -T.infinity(accum_dtype))
            T.fill(l_run, 0)
            for k in T.serial(T.ceildiv(N, block_n)):
                for i, j in T.Parallel(block_m, block_n):
                    x[i, j] = T.cast(X[bx * block_m + i, k * block_n + j], accum_dtype)
                T.reduce_max(x, m_blk, dim=1, clear=True)
                for i in T.Parallel(block_m):
                    m_blk[i] = T.max(m_blk[i], m_run[i])
                    l_run[i] = l_run[i] * T.exp2((m_run[i] - m_blk[i]) * log2e)
                    m_run[i] = m_blk[i]
                for i, j in T.Parallel(block_m, block_n):
                    x[i, j] = T.exp2((x[i, j] - m_run[i]) * log2e)
                T.reduce_sum(x, l_blk, dim=1)
                for i in T.Parallel(block_m):
                    l_run[i] = l_run[i] + l_blk[i]
            for k in T.serial(T.ceildiv(N, block_n)):
                for i, j in T.Parallel(block_m, block_n):
                    y[i, j] = T.cast(
                        T.exp2((T.cast(X[bx * block_m + i, k * block_n + j], accum_dtype) - m_run[i]) * log2e)
                        / l_run[i],
                        dtype,
                    )
                T.copy(y, Y[bx * block_m, k * block_n])

    return main


def layer_norm(M, N, block_m=4, dtype="float16", accum_dtype="float32", eps=1e-5, threads=32):
    """Y = (X - mean) / sqrt(var + eps) * W + B per row (two-pass mean and variance in fp32)."""

    @T.prim_func
    def main(
        X: T.Tensor((M, N), dtype),
        W: T.Tensor((N,), dtype),
        B: T.Tensor((N,), dtype),
        Y: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            x = T.alloc_fragment((block_m, N), accum_dtype)
            d = T.alloc_fragment((block_m, N), accum_dtype)
            mean = T.alloc_fragment((block_m,), accum_dtype)
            var = T.alloc_fragment((block_m,), accum_dtype)
            w_s = T.alloc_shared((N,), dtype)
            b_s = T.alloc_shared((N,), dtype)
            y = T.alloc_fragment((block_m, N), dtype)
            T.copy(W, w_s)
            T.copy(B, b_s)
            T.copy(X[bx * block_m, 0], x)
            T.reduce_sum(x, mean, dim=1)
            for i in T.Parallel(block_m):
                mean[i] = mean[i] / N
            for i, j in T.Parallel(block_m, N):
                d[i, j] = (x[i, j] - mean[i]) * (x[i, j] - mean[i])
            T.reduce_sum(d, var, dim=1)
            for i in T.Parallel(block_m):
                var[i] = T.rsqrt(var[i] / N + eps)
            for i, j in T.Parallel(block_m, N):
                y[i, j] = T.cast(
                    (x[i, j] - mean[i]) * var[i] * T.cast(w_s[j], accum_dtype) + T.cast(b_s[j], accum_dtype), dtype
                )
            T.copy(y, Y[bx * block_m, 0])

    return main


CASES = [
    Case("rms_norm_fp16", lambda: rms_norm(512, 1024), gpu=checks.rms_norm_check(512, 1024)),
    Case("online_softmax_fp16", lambda: online_softmax(256, 4096), gpu=checks.softmax_check(256, 4096)),
    Case("layer_norm_fp16", lambda: layer_norm(512, 1024), gpu=checks.layer_norm_check(512, 1024)),
]
