"""Attention variants beyond plain flash attention, as TileLang users write them: block-sparse
attention driven by a block mask, causal sliding-window attention, paged-KV decode through a block
table, MLA-style decode over a shared latent KV with a rope part, and bidirectional attention with
a symmetric ALiBi bias computed in the kernel.

Each program keeps the online softmax in the exp2 domain (fp32 row max, row sum and output
accumulator) as the flash attention programs of ``attention.py`` do. The GPU checks compare with an
explicit fp32 masked softmax in torch.

Written for Tessera's corpus (in a real file: @T.prim_func reads its own source).
"""

import math

import tilelang.language as T

from tessera_tvm._tvm import tilelang  # noqa: F401  (TileLang's TVM first)

from . import Case, checks

LOG2E = 1.44269504
#: A finite "minus infinity" for scores outside a window: a row whose first visited block is all
#: masked then gets exp2(0) = 1 terms that the first real maximum rescales to zero (no inf - inf).
NEG_BIG = -1.0e30


def block_sparse_attention(B, H, S, D, block_m=64, block_n=64, stages=2, threads=128, dtype="float16"):
    """O = softmax(Q K^T / sqrt(D) + mask) V where ``BlockMask[b, h, qb, kb]`` says whether query
    block ``qb`` sees key block ``kb`` at all: the KV loop skips the blocks it does not see.
    """
    accum = "float32"
    shape = (B, H, S, D)
    scale = LOG2E / math.sqrt(D)
    n_q, n_kv = S // block_m, S // block_n

    @T.prim_func
    def main(
        Q: T.Tensor(shape, dtype),
        K: T.Tensor(shape, dtype),
        V: T.Tensor(shape, dtype),
        BlockMask: T.Tensor((B, H, n_q, n_kv), "bool"),
        Out: T.Tensor(shape, dtype),
    ):
        with T.Kernel(n_q, H, B, threads=threads) as (bx, by, bz):
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
            visit = T.alloc_local((n_kv,), "bool")

            T.copy(Q[bz, by, bx * block_m : (bx + 1) * block_m, :], Q_s)
            for kb in T.serial(n_kv):
                visit[kb] = BlockMask[bz, by, bx, kb]
            T.fill(o, 0)
            T.fill(l_run, 0)
            T.fill(m_new, -T.infinity(accum))

            for kb in T.Pipelined(n_kv, num_stages=stages):
                if visit[kb]:
                    T.copy(K[bz, by, kb * block_n : (kb + 1) * block_n, :], K_s)
                    T.clear(s)
                    T.gemm(Q_s, K_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(m_new, m_old)
                    T.reduce_max(s, m_new, dim=1, clear=False)
                    for i in T.Parallel(block_m):
                        alpha[i] = T.exp2((m_old[i] - m_new[i]) * scale)
                    for i, j in T.Parallel(block_m, block_n):
                        s[i, j] = T.exp2((s[i, j] - m_new[i]) * scale)
                    T.reduce_sum(s, l_blk, dim=1)
                    for i in T.Parallel(block_m):
                        l_run[i] = l_run[i] * alpha[i] + l_blk[i]
                    for i, j in T.Parallel(block_m, D):
                        o[i, j] *= alpha[i]
                    T.copy(s, p)
                    T.copy(V[bz, by, kb * block_n : (kb + 1) * block_n, :], V_s)
                    T.gemm(p, V_s, o, policy=T.GemmWarpPolicy.FullRow)

            for i, j in T.Parallel(block_m, D):
                o[i, j] = o[i, j] / l_run[i]
            T.copy(o, O_s)
            T.copy(O_s, Out[bz, by, bx * block_m : (bx + 1) * block_m, :])

    return main


def sliding_window_attention(B, H, S, D, window, block_m=64, block_n=64, stages=2, threads=128, dtype="bfloat16"):
    """Causal local attention: query ``i`` sees keys ``j`` with ``i - window < j <= i``.

    The KV loop runs only over the blocks that meet the window of the query block (its start
    depends on the block index), and masks by token position inside them.
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
            s = T.alloc_fragment((block_m, block_n), accum)
            p_s = T.alloc_shared((block_m, block_n), dtype)
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

            first = T.max(bx * block_m - window + 1, 0) // block_n
            last = T.min(T.ceildiv((bx + 1) * block_m, block_n), T.ceildiv(S, block_n))
            for kb in T.Pipelined(first, last, num_stages=stages):
                T.copy(K[bz, by, kb * block_n : (kb + 1) * block_n, :], K_s)
                for i, j in T.Parallel(block_m, block_n):
                    q_pos = bx * block_m + i
                    k_pos = kb * block_n + j
                    s[i, j] = T.if_then_else((k_pos <= q_pos) & (q_pos - k_pos < window), 0, NEG_BIG)
                T.gemm(Q_s, K_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(m_new, m_old)
                T.reduce_max(s, m_new, dim=1, clear=False)
                for i in T.Parallel(block_m):
                    alpha[i] = T.exp2((m_old[i] - m_new[i]) * scale)
                for i, j in T.Parallel(block_m, block_n):
                    s[i, j] = T.exp2((s[i, j] - m_new[i]) * scale)
                T.reduce_sum(s, l_blk, dim=1)
                for i in T.Parallel(block_m):
                    l_run[i] = l_run[i] * alpha[i] + l_blk[i]
                for i, j in T.Parallel(block_m, D):
                    o[i, j] *= alpha[i]
                T.copy(s, p_s)
                T.copy(V[bz, by, kb * block_n : (kb + 1) * block_n, :], V_s)
                T.gemm(p_s, V_s, o, policy=T.GemmWarpPolicy.FullRow)

            for i, j in T.Parallel(block_m, D):
                o[i, j] = o[i, j] / l_run[i]
            T.copy(o, Out[bz, by, bx * block_m : (bx + 1) * block_m, :])

    return main


def paged_kv_decode(B, H, H_kv, D, page_size, max_pages, stages=1, threads=128, dtype="float16"):
    """One query token per sequence against a paged KV cache (GQA: H // H_kv query heads per KV head).

    ``BlockTable[b, p]`` is the physical page holding tokens ``p * page_size ...`` of sequence ``b``
    and ``SeqLens[b]`` its length: the loop runs over ``ceildiv(SeqLens[b], page_size)`` pages
    and masks the tail of the last one. One stage: with two, TileLang's sm_80 pipeline waits on
    ``cp.async`` groups by a count that depends on the run-time trip count, which its codegen rejects.
    """
    accum = "float32"
    groups = H // H_kv
    num_pages = B * max_pages
    scale = LOG2E / math.sqrt(D)
    cache = (num_pages, page_size, H_kv, D)

    @T.prim_func
    def main(
        Q: T.Tensor((B, H, D), dtype),
        K_cache: T.Tensor(cache, dtype),
        V_cache: T.Tensor(cache, dtype),
        BlockTable: T.Tensor((B, max_pages), "int32"),
        SeqLens: T.Tensor((B,), "int32"),
        Out: T.Tensor((B, H, D), dtype),
    ):
        with T.Kernel(H_kv, B, threads=threads) as (hk, bz):
            Q_s = T.alloc_shared((groups, D), dtype)
            K_s = T.alloc_shared((page_size, D), dtype)
            V_s = T.alloc_shared((page_size, D), dtype)
            O_s = T.alloc_shared((groups, D), dtype)
            s = T.alloc_fragment((groups, page_size), accum)
            p_s = T.alloc_shared((groups, page_size), dtype)
            o = T.alloc_fragment((groups, D), accum)
            m_new = T.alloc_fragment((groups,), accum)
            m_old = T.alloc_fragment((groups,), accum)
            alpha = T.alloc_fragment((groups,), accum)
            l_blk = T.alloc_fragment((groups,), accum)
            l_run = T.alloc_fragment((groups,), accum)
            seq_len = T.alloc_var("int32")

            seq_len = SeqLens[bz]
            T.copy(Q[bz, hk * groups : (hk + 1) * groups, :], Q_s)
            T.fill(o, 0)
            T.fill(l_run, 0)
            T.fill(m_new, -T.infinity(accum))

            for lp in T.Pipelined(T.ceildiv(seq_len, page_size), num_stages=stages):
                T.copy(K_cache[BlockTable[bz, lp], :, hk, :], K_s)
                for i, j in T.Parallel(groups, page_size):
                    s[i, j] = T.if_then_else(lp * page_size + j < seq_len, 0, -T.infinity(accum))
                T.gemm(Q_s, K_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                T.copy(m_new, m_old)
                T.reduce_max(s, m_new, dim=1, clear=False)
                for i in T.Parallel(groups):
                    alpha[i] = T.exp2((m_old[i] - m_new[i]) * scale)
                for i, j in T.Parallel(groups, page_size):
                    s[i, j] = T.exp2((s[i, j] - m_new[i]) * scale)
                T.reduce_sum(s, l_blk, dim=1)
                for i in T.Parallel(groups):
                    l_run[i] = l_run[i] * alpha[i] + l_blk[i]
                for i, j in T.Parallel(groups, D):
                    o[i, j] *= alpha[i]
                T.copy(s, p_s)
                T.copy(V_cache[BlockTable[bz, lp], :, hk, :], V_s)
                T.gemm(p_s, V_s, o, policy=T.GemmWarpPolicy.FullCol)

            for i, j in T.Parallel(groups, D):
                o[i, j] = o[i, j] / l_run[i]
            T.copy(o, O_s)
            T.copy(O_s, Out[bz, hk * groups : (hk + 1) * groups, :])

    return main


def mla_decode(B, H, S, D_latent, D_rope, block_h=64, block_n=64, stages=1, threads=256, dtype="bfloat16"):
    """Multi-head latent attention decode (DeepSeek-style, absorbed form, one token per sequence).

    Every head attends to one shared latent ``KV`` (B, S, D_latent), which is both key and value,
    plus a rope part: score = Q . KV + Q_pe . K_pe, scaled by 1 / sqrt(D_latent + D_rope);
    the output is softmax(score) KV, a D_latent-wide vector per head. A CTA holds ``block_h`` heads;
    one stage keeps its shared memory (~154 KiB) within sm_80's limit.
    """
    accum = "float32"
    scale = LOG2E / math.sqrt(D_latent + D_rope)

    @T.prim_func
    def main(
        Q: T.Tensor((B, H, D_latent), dtype),
        Q_pe: T.Tensor((B, H, D_rope), dtype),
        KV: T.Tensor((B, S, D_latent), dtype),
        K_pe: T.Tensor((B, S, D_rope), dtype),
        Out: T.Tensor((B, H, D_latent), dtype),
    ):
        with T.Kernel(H // block_h, B, threads=threads) as (hb, bz):
            Q_s = T.alloc_shared((block_h, D_latent), dtype)
            Qpe_s = T.alloc_shared((block_h, D_rope), dtype)
            KV_s = T.alloc_shared((block_n, D_latent), dtype)
            Kpe_s = T.alloc_shared((block_n, D_rope), dtype)
            p_s = T.alloc_shared((block_h, block_n), dtype)
            s = T.alloc_fragment((block_h, block_n), accum)
            o = T.alloc_fragment((block_h, D_latent), accum)
            m_new = T.alloc_fragment((block_h,), accum)
            m_old = T.alloc_fragment((block_h,), accum)
            alpha = T.alloc_fragment((block_h,), accum)
            l_blk = T.alloc_fragment((block_h,), accum)
            l_run = T.alloc_fragment((block_h,), accum)

            T.copy(Q[bz, hb * block_h : (hb + 1) * block_h, :], Q_s)
            T.copy(Q_pe[bz, hb * block_h : (hb + 1) * block_h, :], Qpe_s)
            T.fill(o, 0)
            T.fill(l_run, 0)
            T.fill(m_new, -T.infinity(accum))

            for kb in T.Pipelined(T.ceildiv(S, block_n), num_stages=stages):
                T.copy(KV[bz, kb * block_n : (kb + 1) * block_n, :], KV_s)
                T.copy(K_pe[bz, kb * block_n : (kb + 1) * block_n, :], Kpe_s)
                T.clear(s)
                T.gemm(Q_s, KV_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                T.gemm(Qpe_s, Kpe_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                T.copy(m_new, m_old)
                T.reduce_max(s, m_new, dim=1, clear=False)
                for i in T.Parallel(block_h):
                    alpha[i] = T.exp2((m_old[i] - m_new[i]) * scale)
                for i, j in T.Parallel(block_h, block_n):
                    s[i, j] = T.exp2((s[i, j] - m_new[i]) * scale)
                T.reduce_sum(s, l_blk, dim=1)
                for i in T.Parallel(block_h):
                    l_run[i] = l_run[i] * alpha[i] + l_blk[i]
                for i, j in T.Parallel(block_h, D_latent):
                    o[i, j] *= alpha[i]
                T.copy(s, p_s)
                T.gemm(p_s, KV_s, o, policy=T.GemmWarpPolicy.FullCol)

            for i, j in T.Parallel(block_h, D_latent):
                o[i, j] = o[i, j] / l_run[i]
            T.copy(o, Q_s)
            T.copy(Q_s, Out[bz, hb * block_h : (hb + 1) * block_h, :])

    return main


def alibi_attention(B, H, S, D, block_m=128, block_n=64, stages=2, threads=256, dtype="float16"):
    """Bidirectional attention with a symmetric ALiBi bias (as encoders use it):
    score(i, j) = q_i . k_j / sqrt(D) - slope_h |i - j|, slope_h = 2^(-8 (h + 1) / H), both computed
    in the kernel (nothing but Q, K, V is read); the bias is added in the exp2 domain after the GEMM.
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
            slope = T.alloc_var(accum)

            # the slope in the exp2 domain, as the scores are
            slope = T.exp2(T.cast(by + 1, accum) * (-8.0 / H)) * LOG2E
            T.copy(Q[bz, by, bx * block_m : (bx + 1) * block_m, :], Q_s)
            T.fill(o, 0)
            T.fill(l_run, 0)
            T.fill(m_new, -T.infinity(accum))

            for kb in T.Pipelined(T.ceildiv(S, block_n), num_stages=stages):
                T.copy(K[bz, by, kb * block_n : (kb + 1) * block_n, :], K_s)
                T.clear(s)
                T.gemm(Q_s, K_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_m, block_n):
                    dist = T.abs(T.cast(bx * block_m + i - (kb * block_n + j), accum))
                    s[i, j] = s[i, j] * scale - slope * dist
                T.copy(m_new, m_old)
                T.reduce_max(s, m_new, dim=1, clear=False)
                for i in T.Parallel(block_m):
                    alpha[i] = T.exp2(m_old[i] - m_new[i])
                for i, j in T.Parallel(block_m, block_n):
                    s[i, j] = T.exp2(s[i, j] - m_new[i])
                T.reduce_sum(s, l_blk, dim=1)
                for i in T.Parallel(block_m):
                    l_run[i] = l_run[i] * alpha[i] + l_blk[i]
                for i, j in T.Parallel(block_m, D):
                    o[i, j] *= alpha[i]
                T.copy(s, p)
                T.copy(V[bz, by, kb * block_n : (kb + 1) * block_n, :], V_s)
                T.gemm(p, V_s, o, policy=T.GemmWarpPolicy.FullRow)

            for i, j in T.Parallel(block_m, D):
                o[i, j] = o[i, j] / l_run[i]
            T.copy(o, O_s)
            T.copy(O_s, Out[bz, by, bx * block_m : (bx + 1) * block_m, :])

    return main


# GPU checks: seeded inputs made on the CPU and moved to ``device``, an fp32 torch reference.
# Queries are scaled up so that the softmax is peaked: the outputs are then of order 0.1 to 1 rather
# than the near-zero mean of thousands of random values, and the tolerances mean something.
Q_SCALE = 2.5


def _masked_attention(q, k, v, allowed, sm_scale, bias=None):
    """softmax(q k^T sm_scale + bias, masked where ``allowed`` is False) v in fp32."""
    import torch

    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * sm_scale
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v.float())


def _block_sparse_shape():
    return dict(B=1, H=8, S=1024, D=64, block_m=64, block_n=64)


def _check_block_sparse(kernel, device="cuda"):
    import torch

    cfg = _block_sparse_shape()
    B, H, S, D, bm, bn = cfg["B"], cfg["H"], cfg["S"], cfg["D"], cfg["block_m"], cfg["block_n"]
    gen = torch.Generator().manual_seed(0)
    q = checks.randn(gen, (B, H, S, D), torch.float16, device, Q_SCALE)
    k, v = (checks.randn(gen, (B, H, S, D), torch.float16, device) for _ in range(2))
    block_mask = torch.rand((B, H, S // bm, S // bn), generator=gen) < 0.25
    block_mask |= torch.eye(S // bm, S // bn, dtype=torch.bool)  # every query block sees one block at least
    block_mask = block_mask.to(device)
    out = torch.zeros((B, H, S, D), dtype=torch.float16, device=device)
    kernel(q, k, v, block_mask, out)
    allowed = block_mask.repeat_interleave(bm, dim=-2).repeat_interleave(bn, dim=-1)
    ref = _masked_attention(q, k, v, allowed, 1.0 / math.sqrt(D))
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)


def _sliding_window_shape():
    return dict(B=2, H=8, S=2048, D=64, window=256)


def _check_sliding_window(kernel, device="cuda"):
    import torch

    cfg = _sliding_window_shape()
    B, H, S, D, window = cfg["B"], cfg["H"], cfg["S"], cfg["D"], cfg["window"]
    gen = torch.Generator().manual_seed(1)
    q = checks.randn(gen, (B, H, S, D), torch.bfloat16, device, Q_SCALE)
    k, v = (checks.randn(gen, (B, H, S, D), torch.bfloat16, device) for _ in range(2))
    out = torch.zeros((B, H, S, D), dtype=torch.bfloat16, device=device)
    kernel(q, k, v, out)
    pos = torch.arange(S, device=device)
    dist = pos[:, None] - pos[None, :]
    allowed = (dist >= 0) & (dist < window)
    ref = _masked_attention(q, k, v, allowed, 1.0 / math.sqrt(D))
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


def _paged_shape():
    return dict(B=4, H=32, H_kv=2, D=128, page_size=64, max_pages=32)


def _check_paged_decode(kernel, device="cuda"):
    import torch

    cfg = _paged_shape()
    B, H, H_kv, D = cfg["B"], cfg["H"], cfg["H_kv"], cfg["D"]
    page_size, max_pages = cfg["page_size"], cfg["max_pages"]
    num_pages = B * max_pages
    gen = torch.Generator().manual_seed(2)
    q = checks.randn(gen, (B, H, D), torch.float16, device, Q_SCALE)
    k_cache = checks.randn(gen, (num_pages, page_size, H_kv, D), torch.float16, device)
    v_cache = checks.randn(gen, (num_pages, page_size, H_kv, D), torch.float16, device)
    # lengths that end inside a page, and pages scattered over the cache
    seq_lens = torch.tensor([max_pages * page_size, 1000, 333, 65], dtype=torch.int32)
    block_table = torch.randperm(num_pages, generator=gen).view(B, max_pages).to(torch.int32)
    out = torch.zeros((B, H, D), dtype=torch.float16, device=device)
    kernel(q, k_cache, v_cache, block_table.to(device), seq_lens.to(device), out)
    ref = torch.empty((B, H, D), dtype=torch.float32, device=device)
    for b in range(B):
        n = int(seq_lens[b])
        pages = block_table[b].long().to(device)
        k = k_cache[pages].reshape(max_pages * page_size, H_kv, D)[:n]  # (n, H_kv, D)
        v = v_cache[pages].reshape(max_pages * page_size, H_kv, D)[:n]
        k = k.permute(1, 0, 2).repeat_interleave(H // H_kv, dim=0)  # (H, n, D)
        v = v.permute(1, 0, 2).repeat_interleave(H // H_kv, dim=0)
        allowed = torch.ones((H, 1, n), dtype=torch.bool, device=device)
        ref[b] = _masked_attention(q[b][:, None, :], k, v, allowed, 1.0 / math.sqrt(D))[:, 0, :]
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)


def _mla_shape():
    return dict(B=2, H=128, S=2048, D_latent=512, D_rope=64)


def _check_mla_decode(kernel, device="cuda"):
    import torch

    cfg = _mla_shape()
    B, H, S, Dl, Dr = cfg["B"], cfg["H"], cfg["S"], cfg["D_latent"], cfg["D_rope"]
    gen = torch.Generator().manual_seed(3)
    q = checks.randn(gen, (B, H, Dl), torch.bfloat16, device, Q_SCALE)
    q_pe = checks.randn(gen, (B, H, Dr), torch.bfloat16, device, Q_SCALE)
    kv = checks.randn(gen, (B, S, Dl), torch.bfloat16, device)
    k_pe = checks.randn(gen, (B, S, Dr), torch.bfloat16, device)
    out = torch.zeros((B, H, Dl), dtype=torch.bfloat16, device=device)
    kernel(q, q_pe, kv, k_pe, out)
    keys = torch.cat([kv, k_pe], dim=-1)  # (B, S, Dl + Dr), shared by every head
    queries = torch.cat([q, q_pe], dim=-1)  # (B, H, Dl + Dr)
    allowed = torch.ones((B, H, S), dtype=torch.bool, device=device)
    ref = _masked_attention(queries, keys, kv, allowed, 1.0 / math.sqrt(Dl + Dr))
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


def _alibi_shape():
    return dict(B=2, H=16, S=2048, D=64)


def _check_alibi(kernel, device="cuda"):
    import torch

    cfg = _alibi_shape()
    B, H, S, D = cfg["B"], cfg["H"], cfg["S"], cfg["D"]
    gen = torch.Generator().manual_seed(4)
    q = checks.randn(gen, (B, H, S, D), torch.float16, device, Q_SCALE)
    k, v = (checks.randn(gen, (B, H, S, D), torch.float16, device) for _ in range(2))
    out = torch.zeros((B, H, S, D), dtype=torch.float16, device=device)
    kernel(q, k, v, out)
    pos = torch.arange(S, device=device)
    dist = (pos[:, None] - pos[None, :]).abs().float()  # |i - j|
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device=device, dtype=torch.float32) / H)
    bias = -slopes[:, None, None] * dist  # (H, S, S)
    allowed = torch.ones((S, S), dtype=torch.bool, device=device)
    ref = _masked_attention(q, k, v, allowed, 1.0 / math.sqrt(D), bias=bias)
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)


CASES = [
    Case(
        "block_sparse_attention_fwd",
        lambda: block_sparse_attention(**_block_sparse_shape()),
        features=("block_sparse", "pipelined", "online_softmax"),
        gpu=_check_block_sparse,
    ),
    Case(
        "sliding_window_attention_fwd",
        lambda: sliding_window_attention(**_sliding_window_shape()),
        features=("sliding_window", "pipelined", "online_softmax", "bf16"),
        gpu=_check_sliding_window,
    ),
    Case(
        "paged_kv_decode_gqa",
        lambda: paged_kv_decode(**_paged_shape()),
        features=("paged", "indirect_index", "runtime_trip_count", "alloc_var", "pipelined", "online_softmax"),
        gpu=_check_paged_decode,
    ),
    # A 64-head tile of the 512-wide latent needs ~154 KiB of shared memory: more than rocm's 64 KiB
    # of LDS (Tessera refuses it there), so rocm is left out.
    Case(
        "mla_decode_latent_rope",
        lambda: mla_decode(**_mla_shape()),
        features=("mla", "pipelined", "online_softmax", "bf16"),
        targets=("hopper", "ampere"),
        gpu=_check_mla_decode,
    ),
    Case(
        "alibi_attention_fwd_bidirectional",
        lambda: alibi_attention(**_alibi_shape()),
        features=("alibi", "alloc_var", "pipelined", "online_softmax"),
        gpu=_check_alibi,
    ),
]
