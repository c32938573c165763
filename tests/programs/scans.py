"""Scans, atomics and data movement as TileLang users write them: a row-wise prefix sum, a histogram
through shared-memory atomics, a tiled transpose, a column sum split over blocks, an embedding
gather, a row-wise argmax and a scatter-add of rows (an embedding's backward).

Written for Tessera's corpus (in a real file: @T.prim_func reads its own source).
"""

import numpy as np
import tilelang.language as T

from tessera_tvm._tvm import tilelang  # noqa: F401  (TileLang's TVM first)

from . import Case

# ---------------------------------------------------------------------------------------------
# Row-wise inclusive prefix sum


def cumsum_rows(M, N, block_m=8, dtype="float32", threads=128):
    """Y[i, :] = cumsum(X[i, :]): a block of whole rows staged in shared memory and scanned by
    ``T.cumsum`` along the row."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            rows = T.alloc_shared((block_m, N), dtype)
            T.copy(X[bx * block_m, 0], rows)
            T.cumsum(rows, dim=1)
            T.copy(rows, Y[bx * block_m, 0])

    return main


def cpu_cumsum_rows(M, N, dtype="float32"):
    """The CPU form: one running sum per row in a local scalar, the rows walked serially."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(1, 1) as (bx, by):
            run = T.alloc_local((1,), dtype)
            for i in T.serial(M):
                run[0] = 0
                for j in T.serial(N):
                    run[0] = run[0] + X[i, j]
                    Y[i, j] = run[0]

    return main


def _cpu_cumsum_case(M=24, N=100):
    def run(lowered):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((M, N), dtype=np.float32)
        y = np.zeros((M, N), np.float32)
        lowered(x, y)
        np.testing.assert_allclose(y, np.cumsum(x, axis=1), rtol=1e-5, atol=1e-4)

    return cpu_cumsum_rows(M, N), run


def _cumsum_check(M, N):
    def check(kernel, device="cuda"):
        import torch

        g = torch.Generator().manual_seed(0)
        x = torch.randn(M, N, generator=g).to(device)
        y = torch.zeros(M, N, device=device)
        kernel(x, y)
        torch.testing.assert_close(y, torch.cumsum(x, dim=1), rtol=1e-4, atol=1e-3)

    return check


# ---------------------------------------------------------------------------------------------
# Histogram (bincount) through shared-memory atomics


def histogram(N, bins=256, block=4096, threads=256):
    """Hist[b] += #{i : X[i] == b}: each block counts its slice of X into a shared histogram with
    shared-memory atomics, then adds its counts to the global one with global atomics (the caller
    zeroes Hist)."""

    @T.prim_func
    def main(X: T.Tensor((N,), "int32"), Hist: T.Tensor((bins,), "int32")):
        with T.Kernel(T.ceildiv(N, block), threads=threads) as bx:
            local_hist = T.alloc_shared((bins,), "int32")
            T.clear(local_hist)
            for i in T.Parallel(block):
                if bx * block + i < N:
                    T.atomic_add(local_hist[X[bx * block + i]], 1)
            for b in T.Parallel(bins):
                if local_hist[b] > 0:
                    T.atomic_add(Hist[b], local_hist[b])

    return main


def cpu_histogram(N, bins):
    """The CPU form: one pass over X bumping a counter per value (no atomics on one thread)."""

    @T.prim_func
    def main(X: T.Tensor((N,), "int32"), Hist: T.Tensor((bins,), "int32")):
        with T.Kernel(1, 1) as (bx, by):
            for b in T.serial(bins):
                Hist[b] = 0
            for i in T.serial(N):
                Hist[X[i]] = Hist[X[i]] + 1

    return main


def _cpu_histogram_case(N=1000, bins=32):
    def run(lowered):
        rng = np.random.default_rng(0)
        x = rng.integers(0, bins, size=N, dtype=np.int32)
        hist = np.full(bins, -7, np.int32)
        lowered(x, hist)
        np.testing.assert_array_equal(hist, np.bincount(x, minlength=bins))

    return cpu_histogram(N, bins), run


def _histogram_check(N, bins):
    def check(kernel, device="cuda"):
        import torch

        g = torch.Generator().manual_seed(0)
        # Skewed counts: a few hot bins take many atomics from the same block.
        x = (torch.randn(N, generator=g).abs() * bins / 4).to(torch.int32).clamp_(0, bins - 1).to(device)
        hist = torch.zeros(bins, dtype=torch.int32, device=device)
        kernel(x, hist)
        torch.testing.assert_close(hist, torch.bincount(x, minlength=bins).to(torch.int32), rtol=0, atol=0)

    return check


# ---------------------------------------------------------------------------------------------
# Tiled transpose


def transpose(M, N, block_m=64, block_n=64, dtype="float16", threads=128):
    """Y = X^T: a (block_m, block_n) tile is read row-major into shared memory and written out as
    the (block_n, block_m) tile of Y, so both global accesses stay coalesced."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((N, M), dtype)):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            tile = T.alloc_shared((block_m, block_n), dtype)
            out = T.alloc_fragment((block_n, block_m), dtype)
            T.copy(X[by * block_m, bx * block_n], tile)
            for j, i in T.Parallel(block_n, block_m):
                out[j, i] = tile[i, j]
            T.copy(out, Y[bx * block_n, by * block_m])

    return main


def _transpose_check(M, N):
    def check(kernel, device="cuda"):
        import torch

        g = torch.Generator().manual_seed(0)
        x = torch.randn(M, N, generator=g).to(device=device, dtype=torch.float16)
        y = torch.zeros(N, M, device=device, dtype=torch.float16)
        kernel(x, y)
        torch.testing.assert_close(y, x.t().contiguous(), rtol=0, atol=0)

    return check


# ---------------------------------------------------------------------------------------------
# Column sums split over row blocks


def column_sum(M, N, block_m=128, block_n=128, dtype="bfloat16", threads=128):
    """S[j] = sum_i X[i, j] in fp32: each block reduces a (block_m, block_n) tile over its rows
    with ``T.reduce_sum(dim=0)`` and adds the partial sums to S with atomics (the caller zeroes S)."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), S: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            x = T.alloc_fragment((block_m, block_n), "float32")
            part = T.alloc_fragment((block_n,), "float32")
            for i, j in T.Parallel(block_m, block_n):
                x[i, j] = T.cast(X[by * block_m + i, bx * block_n + j], "float32")
            T.reduce_sum(x, part, dim=0)
            for j in T.Parallel(block_n):
                T.atomic_add(S[bx * block_n + j], part[j])

    return main


def _column_sum_check(M, N):
    def check(kernel, device="cuda"):
        import torch

        g = torch.Generator().manual_seed(0)
        x = torch.randn(M, N, generator=g).to(device=device, dtype=torch.bfloat16)
        s = torch.zeros(N, device=device)
        kernel(x, s)
        # fp32 atomics add the row blocks' partial sums in any order.
        torch.testing.assert_close(s, x.float().sum(dim=0), rtol=1e-4, atol=1e-3)

    return check


# ---------------------------------------------------------------------------------------------
# Embedding gather


def embedding_gather(V, D, B, block_b=16, block_d=256, dtype="bfloat16", threads=128):
    """Out[b, :] = Table[Ids[b], :]: rows of a (V, D) table gathered by an int32 index tensor, one
    (block_b, block_d) tile of the output per block."""

    @T.prim_func
    def main(Ids: T.Tensor((B,), "int32"), Table: T.Tensor((V, D), dtype), Out: T.Tensor((B, D), dtype)):
        with T.Kernel(T.ceildiv(D, block_d), T.ceildiv(B, block_b), threads=threads) as (bx, by):
            for i, j in T.Parallel(block_b, block_d):
                Out[by * block_b + i, bx * block_d + j] = Table[Ids[by * block_b + i], bx * block_d + j]

    return main


def cpu_embedding_gather(V, D, B, block_b=8, dtype="float32"):
    """The CPU form: one block of token rows per program instance, a serial copy per row."""

    @T.prim_func
    def main(Ids: T.Tensor((B,), "int32"), Table: T.Tensor((V, D), dtype), Out: T.Tensor((B, D), dtype)):
        with T.Kernel(T.ceildiv(B, block_b)) as bx:
            for i, j in T.grid(block_b, D):
                if bx * block_b + i < B:
                    Out[bx * block_b + i, j] = Table[Ids[bx * block_b + i], j]

    return main


def _cpu_embedding_case(V=50, D=24, B=30):
    def run(lowered):
        rng = np.random.default_rng(0)
        ids = rng.integers(0, V, size=B, dtype=np.int32)
        table = rng.standard_normal((V, D), dtype=np.float32)
        out = np.zeros((B, D), np.float32)
        lowered(ids, table, out)
        np.testing.assert_array_equal(out, table[ids])

    return cpu_embedding_gather(V, D, B), run


def _embedding_check(V, D, B):
    def check(kernel, device="cuda"):
        import torch

        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, V, (B,), generator=g, dtype=torch.int32).to(device)
        table = torch.randn(V, D, generator=g).to(device=device, dtype=torch.bfloat16)
        out = torch.zeros(B, D, device=device, dtype=torch.bfloat16)
        kernel(ids, table, out)
        torch.testing.assert_close(out, torch.nn.functional.embedding(ids.long(), table), rtol=0, atol=0)

    return check


# ---------------------------------------------------------------------------------------------
# Row-wise argmax


def argmax_rows(M, N, block_m=16, block_n=256, dtype="float16", threads=128):
    """Idx[i] = argmax_j X[i, j], the first index on ties (as torch.argmax). The row is walked in
    column chunks: per chunk a max reduction, then a min reduction over the column indices that hit
    the chunk's max; a running (max, index) pair takes a chunk's only when it is strictly larger."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Idx: T.Tensor((M,), "int32")):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            x = T.alloc_fragment((block_m, block_n), "float32")
            hit = T.alloc_fragment((block_m, block_n), "int32")
            chunk_max = T.alloc_fragment((block_m,), "float32")
            chunk_idx = T.alloc_fragment((block_m,), "int32")
            best = T.alloc_fragment((block_m,), "float32")
            best_idx = T.alloc_fragment((block_m,), "int32")
            T.fill(best, -T.infinity("float32"))
            T.fill(best_idx, 0)
            for k in T.serial(T.ceildiv(N, block_n)):
                for i, j in T.Parallel(block_m, block_n):
                    x[i, j] = T.cast(X[bx * block_m + i, k * block_n + j], "float32")
                T.reduce_max(x, chunk_max, dim=1)
                for i, j in T.Parallel(block_m, block_n):
                    hit[i, j] = T.if_then_else(x[i, j] == chunk_max[i], k * block_n + j, N)
                T.reduce_min(hit, chunk_idx, dim=1)
                # Selects, not `if chunk_max[i] > best[i]:` over both stores: TileLang 0.1.15 splits a
                # two-store `if` into two guarded stores that each re-test the condition, and the
                # second then sees the first's write (tile-ai/tilelang#2745), so no index is kept.
                for i in T.Parallel(block_m):
                    best_idx[i] = T.if_then_else(chunk_max[i] > best[i], chunk_idx[i], best_idx[i])
                    best[i] = T.max(best[i], chunk_max[i])
            for i in T.Parallel(block_m):
                Idx[bx * block_m + i] = best_idx[i]

    return main


def cpu_argmax_rows(M, N, dtype="float32"):
    """The CPU form: a serial walk per row keeping the best value and its index in locals."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Idx: T.Tensor((M,), "int32")):
        with T.Kernel(1, 1) as (bx, by):
            best = T.alloc_local((1,), dtype)
            best_idx = T.alloc_local((1,), "int32")
            for i in T.serial(M):
                best[0] = X[i, 0]
                best_idx[0] = 0
                for j in T.serial(1, N):
                    if X[i, j] > best[0]:
                        best[0] = X[i, j]
                        best_idx[0] = j
                Idx[i] = best_idx[0]

    return main


def _cpu_argmax_case(M=40, N=75):
    def run(lowered):
        rng = np.random.default_rng(0)
        x = rng.integers(-20, 20, size=(M, N)).astype(np.float32)  # ties: the first must win
        idx = np.full(M, -1, np.int32)
        lowered(x, idx)
        np.testing.assert_array_equal(idx, np.argmax(x, axis=1))

    return cpu_argmax_rows(M, N), run


def _argmax_check(M, N):
    def check(kernel, device="cuda"):
        import torch

        g = torch.Generator().manual_seed(0)
        # Integers in a small range make ties common: the first of them must win.
        x = torch.randint(-50, 50, (M, N), generator=g).to(device=device, dtype=torch.float16)
        idx = torch.full((M,), -1, dtype=torch.int32, device=device)
        kernel(x, idx)
        torch.testing.assert_close(idx, torch.argmax(x.float(), dim=1).to(torch.int32), rtol=0, atol=0)

    return check


# ---------------------------------------------------------------------------------------------
# Scatter-add of rows (index_add_, an embedding's backward)


def scatter_add_rows(B, V, D, block_b=8, block_d=128, dtype="float32", threads=128):
    """Out[Idx[b], :] += Src[b, :]: rows scattered into a (V, D) table by an int32 index tensor
    that repeats, so different blocks add into the same rows with atomics (the caller initialises
    Out, e.g. zeroes it)."""

    @T.prim_func
    def main(Idx: T.Tensor((B,), "int32"), Src: T.Tensor((B, D), dtype), Out: T.Tensor((V, D), dtype)):
        with T.Kernel(T.ceildiv(D, block_d), T.ceildiv(B, block_b), threads=threads) as (bx, by):
            src = T.alloc_shared((block_b, block_d), dtype)
            T.copy(Src[by * block_b, bx * block_d], src)
            for i, j in T.Parallel(block_b, block_d):
                T.atomic_add(Out[Idx[by * block_b + i], bx * block_d + j], src[i, j])

    return main


def _scatter_add_check(B, V, D):
    def check(kernel, device="cuda"):
        import torch

        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, V, (B,), generator=g, dtype=torch.int32).to(device)
        src = torch.randn(B, D, generator=g).to(device)
        base = torch.randn(V, D, generator=g).to(device)
        out = base.clone()
        kernel(idx, src, out)
        torch.testing.assert_close(out, base.index_add(0, idx.long(), src), rtol=1e-5, atol=1e-4)

    return check


CUMSUM = (2048, 512)
HIST = (1 << 20, 256)
TRANSPOSE = (2048, 4096)
COLSUM = (4096, 1024)
EMBED = (32000, 1024, 4096)
ARGMAX = (1024, 2048)
SCATTER = (4096, 1024, 512)

CASES: list[Case] = [
    Case(
        "cumsum_rows",
        lambda: cumsum_rows(*CUMSUM),
        ("cumsum", "scan", "shared"),
        cpu=_cpu_cumsum_case,
        gpu=_cumsum_check(*CUMSUM),
    ),
    Case(
        "histogram_shared_atomic",
        lambda: histogram(*HIST),
        ("atomic", "shared", "histogram"),
        cpu=_cpu_histogram_case,
        gpu=_histogram_check(*HIST),
    ),
    Case(
        "transpose_shared",
        lambda: transpose(*TRANSPOSE),
        ("transpose", "shared"),
        gpu=_transpose_check(*TRANSPOSE),
    ),
    Case(
        "column_sum_atomic",
        lambda: column_sum(*COLSUM),
        ("reduce", "atomic", "bf16"),
        gpu=_column_sum_check(*COLSUM),
    ),
    Case(
        "embedding_gather",
        lambda: embedding_gather(*EMBED),
        ("gather", "bf16"),
        cpu=_cpu_embedding_case,
        gpu=_embedding_check(*EMBED),
    ),
    Case(
        "argmax_rows",
        lambda: argmax_rows(*ARGMAX),
        ("reduce", "argmax"),
        cpu=_cpu_argmax_case,
        gpu=_argmax_check(*ARGMAX),
    ),
    Case(
        "scatter_add_rows",
        lambda: scatter_add_rows(*SCATTER),
        ("atomic", "scatter", "shared"),
        gpu=_scatter_add_check(*SCATTER),
    ),
]
