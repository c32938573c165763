"""Batched, grouped and MoE GEMMs as TileLang users write them: a batched GEMM with the batch in the
grid, an MoE grouped GEMM whose blocks find their expert from an int32 offsets tensor, an int8 GEMM
with per-token and per-channel dequant scales, a decode GEMV (M = 1) with a cross-thread reduction,
a SwiGLU GEMM (two weight matrices, silu(A @ W1) * (A @ W3)) and a bf16 linear layer with bias and
residual.

Written for Tessera's corpus (in a real file: @T.prim_func reads its own source).
Each program has a ``gpu=`` check against torch; the batched, grouped, int8 and SwiGLU ones have a
CPU form that runs against numpy.
"""

import numpy as np
import tilelang.language as T

from tessera_tvm._tvm import tilelang  # noqa: F401  (TileLang's TVM first)

from . import Case

# --------------------------------------------------------------------------------------------------
# Batched GEMM: C[b] = A[b] @ B[b]
# --------------------------------------------------------------------------------------------------


def batched_gemm(batch, M, N, K, block_m=128, block_n=128, block_k=32, stages=3, threads=128, dtype="float16"):
    """C[b] = A[b] @ B[b] for ``batch`` independent fp16 GEMMs: the batch index is the grid's z axis,
    the K loop a 3-stage pipeline of 2-D tiles cut out of the 3-D tensors."""

    @T.prim_func
    def main(
        A: T.Tensor((batch, M, K), dtype),
        B: T.Tensor((batch, K, N), dtype),
        C: T.Tensor((batch, M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), batch, threads=threads) as (bx, by, bz):
            a_tile = T.alloc_shared((block_m, block_k), dtype)
            b_tile = T.alloc_shared((block_k, block_n), dtype)
            acc = T.alloc_fragment((block_m, block_n), "float32")
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, block_k), num_stages=stages):
                T.copy(A[bz, by * block_m, ko * block_k], a_tile)
                T.copy(B[bz, ko * block_k, bx * block_n], b_tile)
                T.gemm(a_tile, b_tile, acc)
            T.copy(acc, C[bz, by * block_m, bx * block_n])

    return main


def cpu_batched_gemm(batch, M, N, K, block_m=32, block_n=32, block_k=16, dtype="float32"):
    """The CPU form of ``batched_gemm``: a 3-D grid of blocks, a local accumulator, a serial K loop."""

    @T.prim_func
    def main(
        A: T.Tensor((batch, M, K), dtype),
        B: T.Tensor((batch, K, N), dtype),
        C: T.Tensor((batch, M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), batch) as (bx, by, bz):
            acc = T.alloc_local((block_m, block_n), dtype)
            T.clear(acc)
            for ko in T.serial(T.ceildiv(K, block_k)):
                for i, j, kk in T.grid(block_m, block_n, block_k):
                    acc[i, j] += A[bz, by * block_m + i, ko * block_k + kk] * B[bz, ko * block_k + kk, bx * block_n + j]
            T.copy(acc, C[bz, by * block_m, bx * block_n])

    return main


def _batched_shape():
    return 4, 512, 256, 512


def _check_batched_gemm(kernel, device="cuda"):
    import torch

    batch, m, n, k = _batched_shape()
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = (torch.randn(batch, m, k, generator=gen) / k**0.5).to(device=device, dtype=torch.float16)
    b = torch.randn(batch, k, n, generator=gen).to(device=device, dtype=torch.float16)
    c = torch.zeros(batch, m, n, device=device, dtype=torch.float16)
    kernel(a, b, c)
    ref = torch.bmm(a.float(), b.float())
    torch.testing.assert_close(c.float(), ref, rtol=1e-2, atol=1e-2)


def _cpu_batched_case(batch=3, M=64, N=64, K=48):
    def run(lowered):
        rng = np.random.default_rng(1)
        a = rng.standard_normal((batch, M, K), dtype=np.float32)
        b = rng.standard_normal((batch, K, N), dtype=np.float32)
        c = np.zeros((batch, M, N), np.float32)
        lowered(a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4 * np.sqrt(K))

    return cpu_batched_gemm(batch, M, N, K), run


# --------------------------------------------------------------------------------------------------
# MoE grouped GEMM: rows sorted by expert, expert e owns rows offsets[e] .. offsets[e + 1]
# --------------------------------------------------------------------------------------------------


def moe_grouped_gemm(
    total_rows, num_experts, N, K, block_m=128, block_n=128, block_k=32, stages=2, threads=128, dtype="float16"
):
    """Grouped GEMM of an MoE layer: tokens are sorted by expert, expert e multiplies its rows
    ``offsets[e] .. offsets[e + 1]`` of X by its own weight W[e] (K x N). ``total_rows`` (the routed
    token count) may be symbolic: one kernel then serves every batch.

    Each expert's rows are tiled by ``block_m`` on their own, so a tile never mixes experts; the grid's
    y axis is an upper bound on the tile count (ceil(total / block_m) + experts) and each block walks
    the int32 offsets to find its expert and row tile. Blocks past the last tile do nothing; rows of a
    tile past its expert's end are computed but not stored.
    """
    max_tiles = T.ceildiv(total_rows, block_m) + num_experts

    @T.prim_func
    def main(
        X: T.Tensor((total_rows, K), dtype),
        W: T.Tensor((num_experts, K, N), dtype),
        offsets: T.Tensor((num_experts + 1,), "int32"),
        Y: T.Tensor((total_rows, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n), max_tiles, threads=threads) as (bx, by):
            x_tile = T.alloc_shared((block_m, block_k), dtype)
            w_tile = T.alloc_shared((block_k, block_n), dtype)
            acc = T.alloc_fragment((block_m, block_n), "float32")
            group = T.alloc_var("int32")
            tile_base = T.alloc_var("int32")
            tiles_seen = T.alloc_var("int32")
            group = 0
            tile_base = 0
            tiles_seen = 0
            for e in T.serial(num_experts):
                n_tiles = T.ceildiv(offsets[e + 1] - offsets[e], block_m)
                if by >= tiles_seen and by < tiles_seen + n_tiles:
                    group = e
                    tile_base = tiles_seen
                tiles_seen = tiles_seen + n_tiles
            if by < tiles_seen:
                row0 = offsets[group] + (by - tile_base) * block_m
                row_end = offsets[group + 1]
                T.clear(acc)
                for ko in T.Pipelined(T.ceildiv(K, block_k), num_stages=stages):
                    T.copy(X[row0, ko * block_k], x_tile)
                    T.copy(W[group, ko * block_k, bx * block_n], w_tile)
                    T.gemm(x_tile, w_tile, acc)
                for i, j in T.Parallel(block_m, block_n):
                    if row0 + i < row_end:
                        Y[row0 + i, bx * block_n + j] = T.cast(acc[i, j], dtype)

    return main


def cpu_moe_grouped_gemm(total_rows, num_experts, N, K, block_m=16, block_n=32, block_k=16, dtype="float32"):
    """The CPU form of ``moe_grouped_gemm``: the same group lookup over the offsets, a local accumulator."""
    max_tiles = T.ceildiv(total_rows, block_m) + num_experts

    @T.prim_func
    def main(
        X: T.Tensor((total_rows, K), dtype),
        W: T.Tensor((num_experts, K, N), dtype),
        offsets: T.Tensor((num_experts + 1,), "int32"),
        Y: T.Tensor((total_rows, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n), max_tiles) as (bx, by):
            acc = T.alloc_local((block_m, block_n), dtype)
            group = T.alloc_var("int32")
            tile_base = T.alloc_var("int32")
            tiles_seen = T.alloc_var("int32")
            group = 0
            tile_base = 0
            tiles_seen = 0
            for e in T.serial(num_experts):
                n_tiles = T.ceildiv(offsets[e + 1] - offsets[e], block_m)
                if by >= tiles_seen and by < tiles_seen + n_tiles:
                    group = e
                    tile_base = tiles_seen
                tiles_seen = tiles_seen + n_tiles
            if by < tiles_seen:
                row0 = offsets[group] + (by - tile_base) * block_m
                row_end = offsets[group + 1]
                T.clear(acc)
                for ko in T.serial(T.ceildiv(K, block_k)):
                    for i, j, kk in T.grid(block_m, block_n, block_k):
                        if row0 + i < row_end:
                            acc[i, j] += X[row0 + i, ko * block_k + kk] * W[group, ko * block_k + kk, bx * block_n + j]
                for i, j in T.grid(block_m, block_n):
                    if row0 + i < row_end:
                        Y[row0 + i, bx * block_n + j] = acc[i, j]

    return main


def _moe_routings():
    """Rows per expert for two batches of routed tokens: empty experts, sizes that are not multiples
    of the row tile, one that is, a single-token expert."""
    return [300, 0, 129, 443, 128], [0, 257, 64, 1, 190]


def _moe_reference(x, w, sizes):
    """Y = X @ W[e] over each expert's row range, in the inputs' array library (numpy or torch)."""
    out = []
    start = 0
    for e, size in enumerate(sizes):
        out.append(x[start : start + size] @ w[e])
        start += size
    return out


def _check_moe_grouped_gemm(kernel, device="cuda"):
    import torch

    n, k = 512, 256
    gen = torch.Generator(device="cpu").manual_seed(0)
    for sizes in _moe_routings():  # one kernel, two token counts
        total, experts = sum(sizes), len(sizes)
        x = (torch.randn(total, k, generator=gen) / k**0.5).to(device=device, dtype=torch.float16)
        w = torch.randn(experts, k, n, generator=gen).to(device=device, dtype=torch.float16)
        offsets = torch.tensor(np.cumsum([0, *sizes]), dtype=torch.int32, device=device)
        y = torch.full((total, n), float("nan"), device=device, dtype=torch.float16)
        kernel(x, w, offsets, y)
        ref = torch.cat(_moe_reference(x.float(), w.float(), sizes))
        torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2)


def _cpu_moe_case(experts=4, N=64, K=40):
    def run(lowered):
        rng = np.random.default_rng(2)
        for sizes in ([21, 0, 16, 35], [1, 40, 0, 7]):  # one build, two token counts
            total = sum(sizes)
            x = rng.standard_normal((total, K), dtype=np.float32)
            w = rng.standard_normal((experts, K, N), dtype=np.float32)
            offsets = np.cumsum([0, *sizes]).astype(np.int32)
            y = np.full((total, N), np.nan, np.float32)
            lowered(x, w, offsets, y)
            ref = np.concatenate(_moe_reference(x, w, sizes))
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * np.sqrt(K))

    return cpu_moe_grouped_gemm(T.dynamic("total_rows"), experts, N, K), run


# --------------------------------------------------------------------------------------------------
# int8 GEMM with per-token and per-channel dequant scales
# --------------------------------------------------------------------------------------------------


def gemm_int8_scaled(M, N, K, block_m=128, block_n=128, block_k=64, stages=3, threads=128, out_dtype="bfloat16"):
    """W8A8 linear layer: C = (A @ B^T) * a_scale[:, None] * b_scale[None, :], int8 A (M x K, per-token
    scale) and int8 B (N x K, per-output-channel scale), int32 accumulate, bf16 output."""

    @T.prim_func
    def main(
        A: T.Tensor((M, K), "int8"),
        B: T.Tensor((N, K), "int8"),
        a_scale: T.Tensor((M,), "float32"),
        b_scale: T.Tensor((N,), "float32"),
        C: T.Tensor((M, N), out_dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            a_tile = T.alloc_shared((block_m, block_k), "int8")
            b_tile = T.alloc_shared((block_n, block_k), "int8")
            acc = T.alloc_fragment((block_m, block_n), "int32")
            out = T.alloc_fragment((block_m, block_n), out_dtype)
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, block_k), num_stages=stages):
                T.copy(A[by * block_m, ko * block_k], a_tile)
                T.copy(B[bx * block_n, ko * block_k], b_tile)
                T.gemm(a_tile, b_tile, acc, transpose_B=True)
            for i, j in T.Parallel(block_m, block_n):
                out[i, j] = T.cast(
                    T.cast(acc[i, j], "float32") * a_scale[by * block_m + i] * b_scale[bx * block_n + j], out_dtype
                )
            T.copy(out, C[by * block_m, bx * block_n])

    return main


def cpu_gemm_int8_scaled(M, N, K, block_m=16, block_n=16, block_k=32):
    """The CPU form of ``gemm_int8_scaled``: int32 local accumulator, fp32 output."""

    @T.prim_func
    def main(
        A: T.Tensor((M, K), "int8"),
        B: T.Tensor((N, K), "int8"),
        a_scale: T.Tensor((M,), "float32"),
        b_scale: T.Tensor((N,), "float32"),
        C: T.Tensor((M, N), "float32"),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m)) as (bx, by):
            acc = T.alloc_local((block_m, block_n), "int32")
            T.clear(acc)
            for ko in T.serial(T.ceildiv(K, block_k)):
                for i, j, kk in T.grid(block_m, block_n, block_k):
                    acc[i, j] += T.cast(A[by * block_m + i, ko * block_k + kk], "int32") * T.cast(
                        B[bx * block_n + j, ko * block_k + kk], "int32"
                    )
            for i, j in T.grid(block_m, block_n):
                C[by * block_m + i, bx * block_n + j] = (
                    T.cast(acc[i, j], "float32") * a_scale[by * block_m + i] * b_scale[bx * block_n + j]
                )

    return main


def _check_gemm_int8_scaled(kernel, device="cuda"):
    import torch

    m, n, k = 512, 384, 1024
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randint(-127, 128, (m, k), generator=gen, dtype=torch.int8).to(device)
    b = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8).to(device)
    # Scales that bring a row of 1024 products of |q| < 128 back to O(1), as a calibrated layer has.
    a_scale = (torch.rand(m, generator=gen) * 0.02 + 0.01).to(device)
    b_scale = (torch.rand(n, generator=gen) * 0.002 + 0.001).to(device)
    c = torch.zeros(m, n, device=device, dtype=torch.bfloat16)
    kernel(a, b, a_scale, b_scale, c)
    # The int32 sums are exact; in float64 so is the reference before its scaling.
    ref = (a.double() @ b.double().T) * a_scale.double()[:, None] * b_scale.double()[None, :]
    torch.testing.assert_close(c.double(), ref, rtol=1.6e-2, atol=1e-2)


def _cpu_int8_case(M=48, N=32, K=96):
    def run(lowered):
        rng = np.random.default_rng(3)
        a = rng.integers(-128, 128, size=(M, K), dtype=np.int8)
        b = rng.integers(-128, 128, size=(N, K), dtype=np.int8)
        a_scale = rng.uniform(0.01, 0.03, M).astype(np.float32)
        b_scale = rng.uniform(0.001, 0.003, N).astype(np.float32)
        c = np.zeros((M, N), np.float32)
        lowered(a, b, a_scale, b_scale, c)
        exact = a.astype(np.int64) @ b.astype(np.int64).T
        np.testing.assert_allclose(c, exact * a_scale[:, None] * b_scale[None, :], rtol=1e-5, atol=1e-6)

    return cpu_gemm_int8_scaled(M, N, K), run


# --------------------------------------------------------------------------------------------------
# Decode GEMV (M = 1) with a cross-thread reduction
# --------------------------------------------------------------------------------------------------


def gemv_decode(N, K, rows_per_block=2, lanes=64, vec=8, dtype="bfloat16", accum_dtype="float32"):
    """y = x @ W^T for one decode token: x (1 x K), W (N x K) as nn.Linear stores it, y (1 x N).

    A block of (lanes, rows_per_block) threads owns ``rows_per_block`` output features; the ``lanes``
    threads of a row stride over K with ``vec``-wide vector loads, keep an fp32 partial sum each and
    combine them with a cross-thread all-reduce (64 lanes: two warps on CUDA, one wavefront on gfx942).
    """
    chunk = lanes * vec

    @T.prim_func
    def main(x: T.Tensor((1, K), dtype), W: T.Tensor((N, K), dtype), y: T.Tensor((1, N), dtype)):
        with T.Kernel(T.ceildiv(N, rows_per_block), threads=(lanes, rows_per_block)) as bn:
            tk = T.get_thread_binding(0)
            tn = T.get_thread_binding(1)
            x_reg = T.alloc_local((vec,), dtype)
            w_reg = T.alloc_local((vec,), dtype)
            partial = T.alloc_local((1,), accum_dtype)
            total = T.alloc_local((1,), accum_dtype)
            row = bn * rows_per_block + tn
            T.clear(partial)
            for ko in T.serial(T.ceildiv(K, chunk)):
                for v in T.vectorized(vec):
                    x_reg[v] = x[0, ko * chunk + tk * vec + v]
                for v in T.vectorized(vec):
                    w_reg[v] = W[row, ko * chunk + tk * vec + v]
                for v in T.serial(vec):
                    partial[0] += T.cast(x_reg[v], accum_dtype) * T.cast(w_reg[v], accum_dtype)
            with T.attr(
                T.comm_reducer(lambda a, b: a + b, [T.cast(0, accum_dtype)]),
                "reduce_scope",
                T.reinterpret(T.uint64(0), dtype="handle"),
            ):
                T.evaluate(T.tvm_thread_allreduce(T.uint32(1), partial[0], True, total[0], tk, dtype="handle"))
            if tk == 0:
                y[0, row] = T.cast(total[0], dtype)

    return main


def _check_gemv_decode(kernel, device="cuda"):
    import torch

    n, k = 2048, 4096
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(1, k, generator=gen).to(device=device, dtype=torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(device=device, dtype=torch.bfloat16)
    y = torch.zeros(1, n, device=device, dtype=torch.bfloat16)
    kernel(x, w, y)
    ref = x.float() @ w.float().T
    torch.testing.assert_close(y.float(), ref, rtol=1.6e-2, atol=1e-2)


# --------------------------------------------------------------------------------------------------
# SwiGLU GEMM: H = silu(A @ W1) * (A @ W3)
# --------------------------------------------------------------------------------------------------


def gemm_swiglu(M, N, K, block_m=128, block_n=128, block_k=32, stages=2, threads=128, dtype="float16"):
    """The gate/up projection of a SwiGLU MLP in one kernel: two accumulators share each A tile,
    and the epilogue silu(gate) * up runs in fp32 on the fragments before the fp16 store."""

    @T.prim_func
    def main(
        A: T.Tensor((M, K), dtype),
        W1: T.Tensor((K, N), dtype),
        W3: T.Tensor((K, N), dtype),
        H: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            a_tile = T.alloc_shared((block_m, block_k), dtype)
            gate_w = T.alloc_shared((block_k, block_n), dtype)
            up_w = T.alloc_shared((block_k, block_n), dtype)
            gate = T.alloc_fragment((block_m, block_n), "float32")
            up = T.alloc_fragment((block_m, block_n), "float32")
            out = T.alloc_shared((block_m, block_n), dtype)
            T.clear(gate)
            T.clear(up)
            for ko in T.Pipelined(T.ceildiv(K, block_k), num_stages=stages):
                T.copy(A[by * block_m, ko * block_k], a_tile)
                T.copy(W1[ko * block_k, bx * block_n], gate_w)
                T.copy(W3[ko * block_k, bx * block_n], up_w)
                T.gemm(a_tile, gate_w, gate)
                T.gemm(a_tile, up_w, up)
            for i, j in T.Parallel(block_m, block_n):
                out[i, j] = T.cast(gate[i, j] / (1.0 + T.exp(-gate[i, j])) * up[i, j], dtype)
            T.copy(out, H[by * block_m, bx * block_n])

    return main


def cpu_gemm_swiglu(M, N, K, block_m=16, block_n=32, block_k=16, dtype="float32"):
    """The CPU form of ``gemm_swiglu``: two local accumulators and the same epilogue."""

    @T.prim_func
    def main(
        A: T.Tensor((M, K), dtype),
        W1: T.Tensor((K, N), dtype),
        W3: T.Tensor((K, N), dtype),
        H: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m)) as (bx, by):
            gate = T.alloc_local((block_m, block_n), dtype)
            up = T.alloc_local((block_m, block_n), dtype)
            T.clear(gate)
            T.clear(up)
            for ko in T.serial(T.ceildiv(K, block_k)):
                for i, j, kk in T.grid(block_m, block_n, block_k):
                    a = A[by * block_m + i, ko * block_k + kk]
                    gate[i, j] += a * W1[ko * block_k + kk, bx * block_n + j]
                    up[i, j] += a * W3[ko * block_k + kk, bx * block_n + j]
            for i, j in T.grid(block_m, block_n):
                H[by * block_m + i, bx * block_n + j] = gate[i, j] / (1.0 + T.exp(-gate[i, j])) * up[i, j]

    return main


def _check_gemm_swiglu(kernel, device="cuda"):
    import torch

    m, n, k = 512, 768, 512
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(device=device, dtype=torch.float16)
    w1 = (torch.randn(k, n, generator=gen) / k**0.5).to(device=device, dtype=torch.float16)
    w3 = (torch.randn(k, n, generator=gen) / k**0.5).to(device=device, dtype=torch.float16)
    h = torch.zeros(m, n, device=device, dtype=torch.float16)
    kernel(a, w1, w3, h)
    ref = torch.nn.functional.silu(a.float() @ w1.float()) * (a.float() @ w3.float())
    torch.testing.assert_close(h.float(), ref, rtol=1e-2, atol=1e-2)


def _cpu_swiglu_case(M=32, N=64, K=48):
    def run(lowered):
        rng = np.random.default_rng(4)
        a = rng.standard_normal((M, K), dtype=np.float32)
        w1 = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
        w3 = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
        h = np.zeros((M, N), np.float32)
        lowered(a, w1, w3, h)
        g = a @ w1
        np.testing.assert_allclose(h, g / (1 + np.exp(-g)) * (a @ w3), rtol=1e-4, atol=1e-5)

    return cpu_gemm_swiglu(M, N, K), run


# --------------------------------------------------------------------------------------------------
# bf16 linear layer with bias and residual: C = A @ B^T + bias + R
# --------------------------------------------------------------------------------------------------


def linear_bias_residual(M, N, K, block_m=128, block_n=128, block_k=32, stages=3, threads=128):
    """An output projection as transformer blocks run it: bf16 A (M x K) times an nn.Linear weight
    B (N x K), plus a bias row and the residual stream R, stored in bf16; M is a token count that is
    not a multiple of the row tile."""
    dtype = "bfloat16"

    @T.prim_func
    def main(
        A: T.Tensor((M, K), dtype),
        B: T.Tensor((N, K), dtype),
        bias: T.Tensor((N,), dtype),
        R: T.Tensor((M, N), dtype),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            a_tile = T.alloc_shared((block_m, block_k), dtype)
            b_tile = T.alloc_shared((block_n, block_k), dtype)
            acc = T.alloc_fragment((block_m, block_n), "float32")
            res = T.alloc_fragment((block_m, block_n), dtype)
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, block_k), num_stages=stages):
                T.copy(A[by * block_m, ko * block_k], a_tile)
                T.copy(B[bx * block_n, ko * block_k], b_tile)
                T.gemm(a_tile, b_tile, acc, transpose_B=True)
            T.copy(R[by * block_m, bx * block_n], res)
            for i, j in T.Parallel(block_m, block_n):
                res[i, j] = T.cast(
                    acc[i, j] + T.cast(bias[bx * block_n + j], "float32") + T.cast(res[i, j], "float32"), dtype
                )
            T.copy(res, C[by * block_m, bx * block_n])

    return main


def _check_linear_bias_residual(kernel, device="cuda"):
    import torch

    m, n, k = 1000, 768, 512
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(device=device, dtype=torch.bfloat16)
    b = (torch.randn(n, k, generator=gen) / k**0.5).to(device=device, dtype=torch.bfloat16)
    bias = torch.randn(n, generator=gen).to(device=device, dtype=torch.bfloat16)
    r = torch.randn(m, n, generator=gen).to(device=device, dtype=torch.bfloat16)
    c = torch.zeros(m, n, device=device, dtype=torch.bfloat16)
    kernel(a, b, bias, r, c)
    ref = a.float() @ b.float().T + bias.float() + r.float()
    torch.testing.assert_close(c.float(), ref, rtol=1.6e-2, atol=2e-2)


CASES: list[Case] = [
    Case(
        "batched_gemm_fp16",
        lambda: batched_gemm(*_batched_shape()),
        ("batched", "pipelined"),
        cpu=_cpu_batched_case,
        gpu=_check_batched_gemm,
    ),
    Case(
        "moe_grouped_gemm_offsets",
        lambda: moe_grouped_gemm(T.dynamic("total_rows"), 5, 512, 256),
        ("grouped", "moe", "symbolic", "pipelined", "local_var", "masked_store"),
        cpu=_cpu_moe_case,
        gpu=_check_moe_grouped_gemm,
    ),
    Case(
        "gemm_int8_token_channel_scales",
        lambda: gemm_int8_scaled(512, 384, 1024),
        ("int8", "epilogue", "pipelined", "transpose"),
        cpu=_cpu_int8_case,
        gpu=_check_gemm_int8_scaled,
    ),
    # On rocm Tessera's source differs from tilelang.lower's: TileLang normalises the gfx942 target with
    # thread_warp_size=64 (tilelang.rocm.target.with_rocm_target_attrs), Tessera's target has none, so
    # its tl.LowerThreadAllreduce takes a warp size of 1 and reduces the last wavefront through
    # __syncthreads steps instead of wave barriers. Kept as a failing case until Tessera's rocm target matches.
    Case(
        "gemv_decode_allreduce",
        lambda: gemv_decode(2048, 4096),
        ("gemv", "thread_allreduce", "vectorized", "thread_binding"),
        gpu=_check_gemv_decode,
    ),
    Case(
        "gemm_swiglu_fused",
        lambda: gemm_swiglu(512, 768, 512),
        ("swiglu", "epilogue", "pipelined", "two_gemms"),
        cpu=_cpu_swiglu_case,
        gpu=_check_gemm_swiglu,
    ),
    Case(
        "linear_bf16_bias_residual",
        lambda: linear_bias_residual(1000, 768, 512),
        ("epilogue", "pipelined", "transpose", "bf16"),
        gpu=_check_linear_bias_residual,
    ),
]
