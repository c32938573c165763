"""TileLang tile programs the Tenstorrent tests lower: GEMMs, epilogues, element-wise and SFPU ops.

They are real functions in a module because TileLang's ``@T.prim_func`` reads its source with
``inspect`` (and this file must not use ``from __future__ import annotations``, which would turn
the ``T.Tensor`` annotations into strings). Every program uses 32x32 blocks, the Tenstorrent tile,
and masks its edge tiles the way a GPU program does; ``tt.TilePad`` drops those masks.
"""

import math

import tilelang.language as T

from tessera_tvm._tvm import tilelang  # noqa: F401  (TileLang's TVM first)

TILE = 32
_SQRT_HALF = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu(x, form: str):
    half, one = T.float32(0.5), T.float32(1.0)
    if form == "tanh":
        return half * x * (one + T.tanh(T.float32(_SQRT_2_OVER_PI) * (x + T.float32(0.044715) * x * x * x)))
    return half * x * (one + T.erf(x * T.float32(_SQRT_HALF)))


def gemm(M, N, K, dtype="bfloat16", accum="float32", transpose_b=False):
    """C = A @ B (B given as [N, K] with ``transpose_b``): the classic tile program, 32x32 blocks."""
    b_shape = (N, K) if transpose_b else (K, N)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE)) as (bx, by):
            A_s = T.alloc_shared((TILE, TILE), dtype)
            B_s = T.alloc_shared((TILE, TILE), dtype)
            C_l = T.alloc_fragment((TILE, TILE), accum)
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, TILE), num_stages=2):
                T.copy(A[by * TILE, k * TILE], A_s)
                if transpose_b:
                    T.copy(B[bx * TILE, k * TILE], B_s)
                else:
                    T.copy(B[k * TILE, bx * TILE], B_s)
                T.gemm(A_s, B_s, C_l, transpose_B=transpose_b)
            T.copy(C_l, C[by * TILE, bx * TILE])

    return main


def gemm_bias_act(M, N, K, act="gelu", dtype="bfloat16", accum="float32"):
    """C = act(A @ B + bias[N]): the epilogue on the accumulator, the bias masked past N.

    ``act`` is ``"gelu"`` (erf form), ``"gelu_tanh"``, ``"relu"`` or ``None``.
    """

    @T.prim_func
    def main(
        A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), bias: T.Tensor((N,), dtype), C: T.Tensor((M, N), dtype)
    ):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE)) as (bx, by):
            A_s = T.alloc_shared((TILE, TILE), dtype)
            B_s = T.alloc_shared((TILE, TILE), dtype)
            C_l = T.alloc_fragment((TILE, TILE), accum)
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, TILE), num_stages=2):
                T.copy(A[by * TILE, k * TILE], A_s)
                T.copy(B[k * TILE, bx * TILE], B_s)
                T.gemm(A_s, B_s, C_l)
            for i, j in T.Parallel(TILE, TILE):
                x = C_l[i, j] + T.if_then_else(bx * TILE + j < N, T.cast(bias[bx * TILE + j], accum), T.float32(0))
                if act == "gelu":
                    C_l[i, j] = _gelu(x, "erf")
                elif act == "gelu_tanh":
                    C_l[i, j] = _gelu(x, "tanh")
                elif act == "relu":
                    C_l[i, j] = T.max(x, T.float32(0))
                else:
                    C_l[i, j] = x
            T.copy(C_l, C[by * TILE, bx * TILE])

    return main


def gemm_relu(M, N, K, dtype="bfloat16", accum="float32"):
    """C = relu(A @ B): an SFPU epilogue straight on the accumulator in DST (no bias, no spill)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE)) as (bx, by):
            A_s = T.alloc_shared((TILE, TILE), dtype)
            B_s = T.alloc_shared((TILE, TILE), dtype)
            C_l = T.alloc_fragment((TILE, TILE), accum)
            T.clear(C_l)
            for k in T.serial(T.ceildiv(K, TILE)):
                T.copy(A[by * TILE, k * TILE], A_s)
                T.copy(B[k * TILE, bx * TILE], B_s)
                T.gemm(A_s, B_s, C_l)
            for i, j in T.Parallel(TILE, TILE):
                C_l[i, j] = T.max(C_l[i, j], T.float32(0))
            T.copy(C_l, C[by * TILE, bx * TILE])

    return main


def eltwise(M, N, op="add", dtype="bfloat16"):
    """C = A op B element-wise through shared tiles (copy in, one T.Parallel, copy out)."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE)) as (bx, by):
            A_s = T.alloc_shared((TILE, TILE), dtype)
            B_s = T.alloc_shared((TILE, TILE), dtype)
            C_s = T.alloc_shared((TILE, TILE), dtype)
            T.copy(A[by * TILE, bx * TILE], A_s)
            T.copy(B[by * TILE, bx * TILE], B_s)
            for i, j in T.Parallel(TILE, TILE):
                if op == "add":
                    C_s[i, j] = A_s[i, j] + B_s[i, j]
                elif op == "sub":
                    C_s[i, j] = A_s[i, j] - B_s[i, j]
                else:
                    C_s[i, j] = A_s[i, j] * B_s[i, j]
            T.copy(C_s, C[by * TILE, bx * TILE])

    return main


def unary(M, N, op="exp", dtype="bfloat16"):
    """Y = op(X) straight from DRAM in a masked T.Parallel loop (the GPU element-wise form)."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE)) as (bx, by):
            for i, j in T.Parallel(TILE, TILE):
                if by * TILE + i < M and bx * TILE + j < N:
                    x = T.cast(X[by * TILE + i, bx * TILE + j], "float32")
                    if op == "exp":
                        Y[by * TILE + i, bx * TILE + j] = T.cast(T.exp(x), dtype)
                    elif op == "gelu":
                        Y[by * TILE + i, bx * TILE + j] = T.cast(_gelu(x, "erf"), dtype)
                    elif op == "gelu_tanh":
                        Y[by * TILE + i, bx * TILE + j] = T.cast(_gelu(x, "tanh"), dtype)
                    else:
                        Y[by * TILE + i, bx * TILE + j] = T.cast(T.max(x, T.float32(0)), dtype)

    return main


def add_relu(M, N, dtype="bfloat16"):
    """C = relu(A + B): an FPU binary op and an SFPU op on its result in one DST phase."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE)) as (bx, by):
            for i, j in T.Parallel(TILE, TILE):
                C[by * TILE + i, bx * TILE + j] = T.max(
                    A[by * TILE + i, bx * TILE + j] + B[by * TILE + i, bx * TILE + j], T.bfloat16(0)
                )

    return main


def mul_add(M, N, dtype="bfloat16"):
    """D = A * B + C: two FPU ops in a chain (the product is spilled to an intermediate CB)."""

    @T.prim_func
    def main(
        A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype), D: T.Tensor((M, N), dtype)
    ):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE)) as (bx, by):
            A_s = T.alloc_shared((TILE, TILE), dtype)
            B_s = T.alloc_shared((TILE, TILE), dtype)
            C_s = T.alloc_shared((TILE, TILE), dtype)
            T.copy(A[by * TILE, bx * TILE], A_s)
            T.copy(B[by * TILE, bx * TILE], B_s)
            T.copy(C[by * TILE, bx * TILE], C_s)
            for i, j in T.Parallel(TILE, TILE):
                C_s[i, j] = A_s[i, j] * B_s[i, j] + C_s[i, j]
            T.copy(C_s, D[by * TILE, bx * TILE])

    return main


def exp_relu(M, N, dtype="bfloat16"):
    """Y = exp(relu(X)): two SFPU ops on one DST tile (each re-initialised where the op changes)."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE)) as (bx, by):
            for i, j in T.Parallel(TILE, TILE):
                Y[by * TILE + i, bx * TILE + j] = T.exp(T.max(X[by * TILE + i, bx * TILE + j], T.bfloat16(0)))

    return main


def copy_through(M, N, dtype="bfloat16"):
    """C = A through one shared tile: T.copy in, T.copy out (the tile needs an input and an output CB)."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE)) as (bx, by):
            A_s = T.alloc_shared((TILE, TILE), dtype)
            T.copy(A[by * TILE, bx * TILE], A_s)
            T.copy(A_s, C[by * TILE, bx * TILE])

    return main


# ---------------------------------------------------------------------------------------------
# Programs the Tenstorrent target rejects (each test checks the error names the operation)
# ---------------------------------------------------------------------------------------------


def row_max(M, N, dtype="bfloat16"):
    """A row max into a (32,) fragment, broadcast back over the tile: the Tenstorrent target reduces
    into a (32, 1) accumulator (column 0 of a DST tile), so this form is refused."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), R: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE)) as (bx, by):
            A_s = T.alloc_shared((TILE, TILE), dtype)
            R_f = T.alloc_fragment((TILE,), dtype)
            T.copy(A[by * TILE, bx * TILE], A_s)
            T.reduce_max(A_s, R_f, dim=1)
            for i, j in T.Parallel(TILE, TILE):
                A_s[i, j] = R_f[i]
            T.copy(A_s, R[by * TILE, bx * TILE])

    return main


def gemm_64(M, N, K, dtype="bfloat16", accum="float32"):
    """A GEMM with 64x64 blocks: not one Tensix tile per block."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, 64), T.ceildiv(M, 64)) as (bx, by):
            A_s = T.alloc_shared((64, 32), dtype)
            B_s = T.alloc_shared((32, 64), dtype)
            C_l = T.alloc_fragment((64, 64), accum)
            T.clear(C_l)
            for k in T.serial(T.ceildiv(K, 32)):
                T.copy(A[by * 64, k * 32], A_s)
                T.copy(B[k * 32, bx * 64], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * 64, bx * 64])

    return main


def clamped(M, N, dtype="bfloat16"):
    """Y = max(X, 1): a clamp, which has no tile operation here."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE)) as (bx, by):
            for i, j in T.Parallel(TILE, TILE):
                Y[by * TILE + i, bx * TILE + j] = T.max(X[by * TILE + i, bx * TILE + j], T.bfloat16(1))

    return main


def scaled(M, N, dtype="bfloat16"):
    """Y = X * 2: a scalar multiply, the SFPU's binop with a scalar (mul_unary_tile)."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE)) as (bx, by):
            for i, j in T.Parallel(TILE, TILE):
                Y[by * TILE + i, bx * TILE + j] = X[by * TILE + i, bx * TILE + j] * T.bfloat16(2)

    return main
