"""Attention kernels as TileLang users write them: flash attention forward and backward, GQA decode
with a split-KV combine, and chunked linear attention.

Written for Tessera's corpus (in a real file: @T.prim_func reads its own source).
"""

import math

import tilelang.language as T

from tessera_tvm._tvm import tilelang  # noqa: F401  (TileLang's TVM first)

from . import Case, checks

LOG2E = 1.44269504


def flash_attention_fwd(B, H, S, D, causal, block_m=64, block_n=64, stages=2, threads=128, dtype="float16"):
    """O = softmax(Q K^T / sqrt(D)) V over (B, H, S, D) tensors, one Q block per CTA.

    The KV loop keeps the row max and row sum online (in the exp2 domain) and rescales the
    output accumulator; with ``causal`` it stops at the diagonal block and masks inside it.
    """
    accum = "float32"
    shape = (B, H, S, D)
    scale = LOG2E / math.sqrt(D)

    @T.prim_func
    def main(
        Q: T.Tensor(shape, dtype),
        K: T.Tensor(shape, dtype),
        V: T.Tensor(shape, dtype),
        Out: T.Tensor(shape, dtype),
    ):
        with T.Kernel(T.ceildiv(S, block_m), H, B, threads=threads) as (bx, by, bz):
            Q_s = T.alloc_shared((block_m, D), dtype)
            K_s = T.alloc_shared((block_n, D), dtype)
            V_s = T.alloc_shared((block_n, D), dtype)
            O_s = T.alloc_shared((block_m, D), dtype)
            s = T.alloc_fragment((block_m, block_n), accum)
            p = T.alloc_fragment((block_m, block_n), dtype)
            o = T.alloc_fragment((block_m, D), accum)
            m_new = T.alloc_fragment((block_m,), accum)
            m_old = T.alloc_fragment((block_m,), accum)
            alpha = T.alloc_fragment((block_m,), accum)
            l_blk = T.alloc_fragment((block_m,), accum)
            l_run = T.alloc_fragment((block_m,), accum)

            T.copy(Q[bz, by, bx * block_m : (bx + 1) * block_m, :], Q_s)
            T.fill(o, 0)
            T.fill(l_run, 0)
            T.fill(m_new, -T.infinity(accum))

            n_blocks = (
                T.min(T.ceildiv(S, block_n), T.ceildiv((bx + 1) * block_m, block_n))
                if causal
                else T.ceildiv(S, block_n)
            )
            for kb in T.Pipelined(n_blocks, num_stages=stages):
                T.copy(K[bz, by, kb * block_n : (kb + 1) * block_n, :], K_s)
                if causal:
                    for i, j in T.Parallel(block_m, block_n):
                        s[i, j] = T.if_then_else(bx * block_m + i >= kb * block_n + j, 0, -T.infinity(accum))
                else:
                    T.clear(s)
                T.gemm(Q_s, K_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                T.copy(m_new, m_old)
                T.reduce_max(s, m_new, dim=1, clear=False)
                for i in T.Parallel(block_m):
                    alpha[i] = T.exp2(m_old[i] * scale - m_new[i] * scale)
                for i, j in T.Parallel(block_m, block_n):
                    s[i, j] = T.exp2(s[i, j] * scale - m_new[i] * scale)
                T.reduce_sum(s, l_blk, dim=1)
                for i in T.Parallel(block_m):
                    l_run[i] = l_run[i] * alpha[i] + l_blk[i]
                for i, j in T.Parallel(block_m, D):
                    o[i, j] = o[i, j] * alpha[i]
                T.copy(s, p)

                T.copy(V[bz, by, kb * block_n : (kb + 1) * block_n, :], V_s)
                T.gemm(p, V_s, o, policy=T.GemmWarpPolicy.FullRow)

            for i, j in T.Parallel(block_m, D):
                o[i, j] = o[i, j] / l_run[i]
            T.copy(o, O_s)
            T.copy(O_s, Out[bz, by, bx * block_m : (bx + 1) * block_m, :])

    return main


def flash_attention_bwd(B, H, S, D, causal, block_m=64, block_n=32, threads=128, dtype="float16"):
    """dK, dV (per KV block, accumulated in fragments) and dQ (fp32, atomically added) of attention.

    ``LSE`` is the forward's per-row log-sum-exp in the exp2 domain (of the scaled scores) and
    ``Delta`` is rowsum(O * dO); both come from the forward and a small preprocessing kernel.
    The shared fp32 dQ tile carries a swizzled layout before it is atomically added to global dQ.
    """
    accum = "float32"
    shape = (B, H, S, D)
    sm_scale = 1.0 / math.sqrt(D)
    scale = sm_scale * LOG2E

    @T.prim_func
    def main(
        Q: T.Tensor(shape, dtype),
        K: T.Tensor(shape, dtype),
        V: T.Tensor(shape, dtype),
        dO: T.Tensor(shape, dtype),
        LSE: T.Tensor((B, H, S), accum),
        Delta: T.Tensor((B, H, S), accum),
        dQ: T.Tensor(shape, accum),
        dK: T.Tensor(shape, dtype),
        dV: T.Tensor(shape, dtype),
    ):
        with T.Kernel(T.ceildiv(S, block_m), H, B, threads=threads) as (bx, by, bz):
            K_s = T.alloc_shared((block_m, D), dtype)
            V_s = T.alloc_shared((block_m, D), dtype)
            q_s = T.alloc_shared((block_n, D), dtype)
            do_s = T.alloc_shared((block_n, D), dtype)
            ds_s = T.alloc_shared((block_m, block_n), dtype)
            lse_s = T.alloc_shared((block_n,), accum)
            delta_s = T.alloc_shared((block_n,), accum)
            dq_s = T.alloc_shared((block_n, D), accum)
            dk_s = T.alloc_shared((block_m, D), dtype)
            dv_s = T.alloc_shared((block_m, D), dtype)
            pT = T.alloc_fragment((block_m, block_n), accum)
            pT_h = T.alloc_fragment((block_m, block_n), dtype)
            dpT = T.alloc_fragment((block_m, block_n), accum)
            dsT_h = T.alloc_fragment((block_m, block_n), dtype)
            dq = T.alloc_fragment((block_n, D), accum)
            dk = T.alloc_fragment((block_m, D), accum)
            dv = T.alloc_fragment((block_m, D), accum)

            T.annotate_layout({dq_s: tilelang.layout.make_swizzled_layout(dq_s)})

            T.copy(K[bz, by, bx * block_m : (bx + 1) * block_m, :], K_s)
            T.copy(V[bz, by, bx * block_m : (bx + 1) * block_m, :], V_s)
            T.clear(dk)
            T.clear(dv)
            q_start = T.floordiv(bx * block_m, block_n) if causal else 0
            for qb in T.serial(q_start, T.ceildiv(S, block_n)):
                T.copy(Q[bz, by, qb * block_n : (qb + 1) * block_n, :], q_s)
                T.clear(pT)
                T.gemm(K_s, q_s, pT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(LSE[bz, by, qb * block_n : (qb + 1) * block_n], lse_s)
                for i, j in T.Parallel(block_m, block_n):
                    pT[i, j] = T.exp2(pT[i, j] * scale - lse_s[j])
                if causal:
                    for i, j in T.Parallel(block_m, block_n):
                        pT[i, j] = T.if_then_else(bx * block_m + i <= qb * block_n + j, pT[i, j], 0)

                T.copy(dO[bz, by, qb * block_n : (qb + 1) * block_n, :], do_s)
                T.clear(dpT)
                T.gemm(V_s, do_s, dpT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(pT, pT_h)
                T.gemm(pT_h, do_s, dv, policy=T.GemmWarpPolicy.FullRow)

                T.copy(Delta[bz, by, qb * block_n : (qb + 1) * block_n], delta_s)
                for i, j in T.Parallel(block_m, block_n):
                    dsT_h[i, j] = T.cast(pT[i, j] * (dpT[i, j] - delta_s[j]) * sm_scale, dtype)
                T.gemm(dsT_h, q_s, dk, policy=T.GemmWarpPolicy.FullRow)

                T.copy(dsT_h, ds_s)
                T.clear(dq)
                T.gemm(ds_s, K_s, dq, transpose_A=True)
                T.copy(dq, dq_s)
                T.atomic_add(dQ[bz, by, qb * block_n : (qb + 1) * block_n, :], dq_s)

            T.copy(dv, dv_s)
            T.copy(dk, dk_s)
            T.copy(dv_s, dV[bz, by, bx * block_m : (bx + 1) * block_m, :])
            T.copy(dk_s, dK[bz, by, bx * block_m : (bx + 1) * block_m, :])

    return main


def gqa_decode(B, H, H_kv, S, D, num_split=4, block_n=64, threads=32, dtype="float16"):
    """One query token per sequence; each group of H // H_kv query heads shares one KV head.

    The first kernel splits the KV sequence ``num_split`` ways and writes a partial output and
    its log-sum-exp per split; the second combines the splits (K/V in (B, S, H_kv, D) layout).
    """
    accum = "float32"
    groups = H // H_kv
    split_len = S // num_split
    scale = LOG2E / math.sqrt(D)

    @T.prim_func
    def main(
        Q: T.Tensor((B, H, D), dtype),
        K: T.Tensor((B, S, H_kv, D), dtype),
        V: T.Tensor((B, S, H_kv, D), dtype),
        O_part: T.Tensor((B, H, num_split, D), accum),
        LSE_part: T.Tensor((B, H, num_split), accum),
        Out: T.Tensor((B, H, D), dtype),
    ):
        with T.Kernel(num_split, H_kv, B, threads=threads) as (sp, hk, bz):
            Q_s = T.alloc_shared((groups, D), dtype)
            K_s = T.alloc_shared((block_n, D), dtype)
            V_s = T.alloc_shared((block_n, D), dtype)
            s = T.alloc_fragment((groups, block_n), accum)
            p_s = T.alloc_shared((groups, block_n), dtype)
            o = T.alloc_fragment((groups, D), accum)
            m_new = T.alloc_fragment((groups,), accum)
            m_old = T.alloc_fragment((groups,), accum)
            alpha = T.alloc_fragment((groups,), accum)
            l_blk = T.alloc_fragment((groups,), accum)
            l_run = T.alloc_fragment((groups,), accum)

            T.copy(Q[bz, hk * groups : (hk + 1) * groups, :], Q_s)
            T.fill(o, 0)
            T.fill(l_run, 0)
            T.fill(m_new, -T.infinity(accum))
            for kb in T.Pipelined(T.ceildiv(split_len, block_n), num_stages=2):
                start = sp * split_len + kb * block_n
                T.copy(K[bz, start : start + block_n, hk, :], K_s)
                T.clear(s)
                T.gemm(Q_s, K_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                T.copy(m_new, m_old)
                T.reduce_max(s, m_new, dim=1, clear=False)
                for i in T.Parallel(groups):
                    alpha[i] = T.exp2(m_old[i] * scale - m_new[i] * scale)
                for i, j in T.Parallel(groups, block_n):
                    s[i, j] = T.exp2(s[i, j] * scale - m_new[i] * scale)
                T.reduce_sum(s, l_blk, dim=1)
                for i in T.Parallel(groups):
                    l_run[i] = l_run[i] * alpha[i] + l_blk[i]
                for i, j in T.Parallel(groups, D):
                    o[i, j] = o[i, j] * alpha[i]
                T.copy(s, p_s)
                T.copy(V[bz, start : start + block_n, hk, :], V_s)
                T.gemm(p_s, V_s, o, policy=T.GemmWarpPolicy.FullCol)
            for i, j in T.Parallel(groups, D):
                O_part[bz, hk * groups + i, sp, j] = o[i, j] / l_run[i]
            for i in T.Parallel(groups):
                LSE_part[bz, hk * groups + i, sp] = T.log2(l_run[i]) + m_new[i] * scale

        with T.Kernel(H, B, threads=threads) as (h, bz):
            acc = T.alloc_fragment((D,), accum)
            lse_max = T.alloc_local((1,), accum)
            lse_sum = T.alloc_local((1,), accum)
            lse = T.alloc_local((1,), accum)
            lse_max[0] = -T.infinity(accum)
            for k in T.serial(num_split):
                lse_max[0] = T.max(lse_max[0], LSE_part[bz, h, k])
            lse_sum[0] = 0
            for k in T.serial(num_split):
                lse_sum[0] += T.exp2(LSE_part[bz, h, k] - lse_max[0])
            lse[0] = T.log2(lse_sum[0]) + lse_max[0]
            T.clear(acc)
            for k in T.serial(num_split):
                for d in T.Parallel(D):
                    acc[d] += O_part[bz, h, k, d] * T.exp2(LSE_part[bz, h, k] - lse[0])
            for d in T.Parallel(D):
                Out[bz, h, d] = T.cast(acc[d], dtype)

    return main


def linear_attention(B, H, S, D, chunk=64, block_v=64, threads=128, dtype="float16"):
    """Causal linear attention O = tril(Q K^T) V, chunked: inside a chunk a masked Q K^T V, across
    chunks a running state sum(K^T V) held in a fragment (fp32) and used as Q @ state.
    """
    accum = "float32"
    shape = (B, H, S, D)

    @T.prim_func
    def main(
        Q: T.Tensor(shape, dtype),
        K: T.Tensor(shape, dtype),
        V: T.Tensor(shape, dtype),
        Out: T.Tensor(shape, dtype),
    ):
        with T.Kernel(T.ceildiv(D, block_v), H, B, threads=threads) as (bv, by, bz):
            Q_s = T.alloc_shared((chunk, D), dtype)
            K_s = T.alloc_shared((chunk, D), dtype)
            V_s = T.alloc_shared((chunk, block_v), dtype)
            a_s = T.alloc_shared((chunk, chunk), dtype)
            state_s = T.alloc_shared((D, block_v), dtype)
            O_s = T.alloc_shared((chunk, block_v), dtype)
            a = T.alloc_fragment((chunk, chunk), accum)
            o = T.alloc_fragment((chunk, block_v), accum)
            state = T.alloc_fragment((D, block_v), accum)

            T.clear(state)
            for c in T.Pipelined(T.ceildiv(S, chunk), num_stages=1):
                T.copy(Q[bz, by, c * chunk : (c + 1) * chunk, :], Q_s)
                T.copy(K[bz, by, c * chunk : (c + 1) * chunk, :], K_s)
                T.copy(V[bz, by, c * chunk : (c + 1) * chunk, bv * block_v : (bv + 1) * block_v], V_s)
                T.clear(a)
                T.gemm(Q_s, K_s, a, transpose_B=True)
                for i, j in T.Parallel(chunk, chunk):
                    a[i, j] = T.if_then_else(i >= j, a[i, j], 0)
                T.copy(a, a_s)
                T.clear(o)
                T.gemm(a_s, V_s, o)
                T.copy(state, state_s)
                T.gemm(Q_s, state_s, o)
                T.gemm(K_s, V_s, state, transpose_A=True)
                T.copy(o, O_s)
                T.copy(O_s, Out[bz, by, c * chunk : (c + 1) * chunk, bv * block_v : (bv + 1) * block_v])

    return main


CASES = [
    Case(
        "flash_attention_fwd_causal",
        lambda: flash_attention_fwd(1, 8, 512, 64, causal=True),
        features=("pipelined",),
        gpu=checks.flash_fwd_check(1, 8, 512, 64, causal=True),
    ),
    Case(
        "flash_attention_fwd",
        lambda: flash_attention_fwd(2, 4, 256, 128, causal=False),
        features=("pipelined",),
        gpu=checks.flash_fwd_check(2, 4, 256, 128, causal=False),
    ),
    Case(
        "flash_attention_bwd_causal",
        lambda: flash_attention_bwd(1, 4, 256, 64, causal=True),
        features=("annotate_layout", "atomic"),
        gpu=checks.flash_bwd_check(1, 4, 256, 64, causal=True),
    ),
    Case(
        "gqa_decode_split_kv",
        lambda: gqa_decode(2, 32, 2, 1024, 128, num_split=4),
        features=("pipelined",),
        gpu=checks.gqa_decode_check(2, 32, 2, 1024, 128, num_split=4),
    ),
    Case(
        "linear_attention_chunked",
        lambda: linear_attention(2, 4, 512, 64),
        features=("pipelined",),
        gpu=checks.linear_attention_check(2, 4, 512, 64),
    ),
]
