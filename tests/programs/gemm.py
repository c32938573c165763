"""TileLang tile programs the tests lower (in a real file: @T.prim_func reads its own source)."""

import tilelang.language as T

from tessera_tvm._tvm import tilelang  # noqa: F401  (TileLang's TVM first)


def gemm(M, N, K, block_m=128, block_n=128, block_k=32, dtype="float16", accum_dtype="float32", stages=3, threads=128):
    """C = A @ B with shared-memory tiles, a fragment accumulator and a pipelined K loop."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
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

    return main


def gemm_bias_relu(
    M, N, K, block_m=128, block_n=128, block_k=32, dtype="float16", accum_dtype="float32", stages=2, threads=128
):
    """C = relu(A @ B^T + bias): transposed B operand and an element-wise epilogue on the fragment."""

    @T.prim_func
    def main(
        A: T.Tensor((M, K), dtype), B: T.Tensor((N, K), dtype), bias: T.Tensor((N,), dtype), C: T.Tensor((M, N), dtype)
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_m, block_k), dtype)
            B_s = T.alloc_shared((block_n, block_k), dtype)
            C_l = T.alloc_fragment((block_m, block_n), accum_dtype)
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, block_k), num_stages=stages):
                T.copy(A[by * block_m, k * block_k], A_s)
                T.copy(B[bx * block_n, k * block_k], B_s)
                T.gemm(A_s, B_s, C_l, transpose_B=True)
            for i, j in T.Parallel(block_m, block_n):
                C_l[i, j] = T.max(C_l[i, j] + T.cast(bias[bx * block_n + j], accum_dtype), 0)
            T.copy(C_l, C[by * block_m, bx * block_n])

    return main


def softmax_rows(M, N, block_m=32, dtype="float32", threads=128):
    """Row softmax with fragment reductions (T.reduce_max / T.reduce_sum), N held in one block."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            x = T.alloc_fragment((block_m, N), dtype)
            row_max = T.alloc_fragment((block_m,), dtype)
            row_sum = T.alloc_fragment((block_m,), dtype)
            T.copy(X[bx * block_m, 0], x)
            T.reduce_max(x, row_max, dim=1)
            for i, j in T.Parallel(block_m, N):
                x[i, j] = T.exp(x[i, j] - row_max[i])
            T.reduce_sum(x, row_sum, dim=1)
            for i, j in T.Parallel(block_m, N):
                x[i, j] = x[i, j] / row_sum[i]
            T.copy(x, Y[bx * block_m, 0])

    return main


def elementwise_add(M, N, block_m=64, block_n=64, dtype="float32", threads=128):
    """C = A + B, one tile per block, with no shared memory."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            for i, j in T.Parallel(block_m, block_n):
                C[by * block_m + i, bx * block_n + j] = (
                    A[by * block_m + i, bx * block_n + j] + B[by * block_m + i, bx * block_n + j]
                )

    return main


def cpu_gemm(M, N, K, block_m=64, block_n=64, block_k=32, dtype="float32", accum_dtype="float32"):
    """The CPU form of a GEMM: a local accumulator and a serial K loop (no fragments on CPU)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m)) as (bx, by):
            C_l = T.alloc_local((block_m, block_n), accum_dtype)
            T.clear(C_l)
            for k in T.serial(T.ceildiv(K, block_k)):
                for i, j, kk in T.grid(block_m, block_n, block_k):
                    C_l[i, j] += A[by * block_m + i, k * block_k + kk] * B[k * block_k + kk, bx * block_n + j]
            T.copy(C_l, C[by * block_m, bx * block_n])

    return main


def cpu_gemm_bias(M, N, K, block_m=32, block_n=32, block_k=16, dtype="float32"):
    """CPU GEMM with a bias vector: the bias parameter sorts after C in the C kernel's signature."""

    @T.prim_func
    def main(
        A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), bias: T.Tensor((N,), dtype), C: T.Tensor((M, N), dtype)
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m)) as (bx, by):
            C_l = T.alloc_local((block_m, block_n), dtype)
            T.clear(C_l)
            for k in T.serial(T.ceildiv(K, block_k)):
                for i, j, kk in T.grid(block_m, block_n, block_k):
                    C_l[i, j] += A[by * block_m + i, k * block_k + kk] * B[k * block_k + kk, bx * block_n + j]
            for i, j in T.grid(block_m, block_n):
                C_l[i, j] = C_l[i, j] + bias[bx * block_n + j]
            T.copy(C_l, C[by * block_m, bx * block_n])

    return main


def dynamic_row_scale(threads=128):
    """Y = 2 X, one row per block staged through shared memory sized by the symbolic row length N."""
    M, N = T.dynamic("M"), T.dynamic("N")

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(M, threads=threads) as bx:
            row = T.alloc_shared((N,), "float32")
            T.copy(X[bx, 0:N], row)
            for j in T.Parallel(N):
                Y[bx, j] = row[j] * 2.0

    return main


def row_stage(M, N, block_m=1, threads=128):
    """Y = 2 X with block_m whole rows staged through shared memory (no GEMM: a shared-memory row kernel)."""

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            rows = T.alloc_shared((block_m, N), "float32")
            T.copy(X[bx * block_m, 0], rows)
            for i, j in T.Parallel(block_m, N):
                Y[bx * block_m + i, j] = rows[i, j] * 2.0

    return main


def thread_indexed_copy(M=64, N=64, threads=128):
    """B = A with per-thread indexing (T.get_thread_binding): SIMT, which Tenstorrent has not."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=threads) as _:
            tx = T.get_thread_binding()
            for i in T.serial(M * N // threads):
                B[(i * threads + tx) // N, (i * threads + tx) % N] = A[(i * threads + tx) // N, (i * threads + tx) % N]

    return main
