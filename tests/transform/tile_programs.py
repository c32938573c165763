"""TileLang tile programs shared by the tests of Tessera's passes, and the helpers that lower them.

They live in a real module because TileLang's ``@T.prim_func`` reads its source with ``inspect``.
Each factory returns a PrimFunc; ``lower(name, config)`` runs LowerAndLegalize + OptimizeForTarget
on one (cached, so test files share lowerings); ``with_tessera_passes`` gives a config whose
pipeline holds Tessera's passes where they belong, whether or not the shipped YAML has them yet.
"""

from __future__ import annotations

import copy
import functools
from importlib import resources

import tilelang.language as T
import yaml

from tessera_tvm._tvm import tilelang, tvm  # noqa: F401  (TileLang's TVM first)
from tessera_tvm.config import TargetConfig, load_config, parse_config
from tessera_tvm.pipeline import LowerAndLegalize, OptimizeForTarget
from tests.programs import gemm as programs

FIRST_IN_LOWER_AND_LEGALIZE = ["tessera.RecordTileInfo"]
LAST_IN_OPTIMIZE_FOR_TARGET = ["tessera.AnnotateKernelMetadata", "tessera.VerifyResources"]


def _names(entries) -> list[str]:
    return [entry if isinstance(entry, str) else entry["pass"] for entry in entries]


def with_tessera_passes(name: str, **resource_limits: int) -> TargetConfig:
    """Config ``name`` with RecordTileInfo first in LowerAndLegalize and AnnotateKernelMetadata +
    VerifyResources last in OptimizeForTarget (added only where missing); ``resource_limits``
    replace entries of its ``resources``."""
    config = load_config(name)
    data = copy.deepcopy(dict(config.raw))
    pipeline = dict(data["pipeline"])
    first = pipeline.get("lower_and_legalize", "shared")
    if first == "shared":
        shared = resources.files("tessera_tvm.configs").joinpath("shared/lower_and_legalize.yaml")
        first = yaml.safe_load(shared.read_text())["passes"]
    missing = [p for p in FIRST_IN_LOWER_AND_LEGALIZE if p not in _names(first)]
    pipeline["lower_and_legalize"] = missing + list(first)
    last = list(pipeline["optimize_for_target"])
    pipeline["optimize_for_target"] = last + [p for p in LAST_IN_OPTIMIZE_FOR_TARGET if p not in _names(last)]
    data["pipeline"] = pipeline
    data["resources"] = {**data.get("resources", {}), **resource_limits}
    return parse_config(data, f"{config.source} (test: with Tessera's passes)")


def lower(program: str, config: str, **resource_limits: int):
    """A tile program of this module (``"matmul"``, ``"matmul_cpu"``, ...) lowered for ``config``."""
    return _lower(program, config, tuple(sorted(resource_limits.items())))


@functools.cache
def _lower(program: str, config: str, resource_limits: tuple):
    func = PROGRAMS[program]()
    target = with_tessera_passes(config, **dict(resource_limits))
    return OptimizeForTarget(LowerAndLegalize(tvm.IRModule({"main": func}), target), target)


def matmul(M, N, K, block_m, block_n, block_k, dtype="float16", accum="float32", stages=3, threads=128):
    """C = A @ B with one shared-memory tile per operand and an fp32 fragment accumulator."""
    return programs.gemm(
        M, N, K, block_m, block_n, block_k, dtype=dtype, accum_dtype=accum, stages=stages, threads=threads
    )


def matmul_cpu(M, N, K, block_m, block_n, block_k, dtype="float32", accum="float32"):
    """The CPU form of ``matmul``: local accumulator, one shared.dyn operand tile (see DESIGN.md 3)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=1) as (bx, by):
            A_s = T.alloc_shared((block_m, block_k), dtype)
            B_l = T.alloc_local((block_k, block_n), dtype)
            C_l = T.alloc_local((block_m, block_n), accum)
            T.clear(C_l)
            for k in T.serial(T.ceildiv(K, block_k)):
                T.copy(A[by * block_m, k * block_k], A_s)
                T.copy(B[k * block_k, bx * block_n], B_l)
                T.gemm(A_s, B_l, C_l)
            T.copy(C_l, C[by * block_m, bx * block_n])

    return main


def linear(
    M, N, K, block_m, block_n, block_k, activation="gelu", dtype="float16", accum="float32", stages=3, threads=128
):
    """D = activation(A @ B + bias): the GEMM with an element-wise epilogue on the accumulator.

    ``activation`` is ``"gelu"`` (erf form), ``"gelu_tanh"``, ``"relu"`` or ``None``. The result is
    cast to ``dtype`` in its own loop (an explicit narrowing cast, so the epilogue ends with "cast").
    """

    @T.prim_func
    def main(
        A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), bias: T.Tensor((N,), dtype), D: T.Tensor((M, N), dtype)
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_m, block_k), dtype)
            B_s = T.alloc_shared((block_k, block_n), dtype)
            C_l = T.alloc_fragment((block_m, block_n), accum)
            D_l = T.alloc_fragment((block_m, block_n), dtype)
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, block_k), num_stages=stages):
                T.copy(A[by * block_m, k * block_k], A_s)
                T.copy(B[k * block_k, bx * block_n], B_s)
                T.gemm(A_s, B_s, C_l)
            for i, j in T.Parallel(block_m, block_n):
                C_l[i, j] = C_l[i, j] + T.Cast(accum, bias[bx * block_n + j])
            if activation == "gelu":
                for i, j in T.Parallel(block_m, block_n):
                    C_l[i, j] = 0.5 * C_l[i, j] * (1.0 + T.erf(C_l[i, j] * 0.7071067811865476))
            elif activation == "gelu_tanh":
                for i, j in T.Parallel(block_m, block_n):
                    x = C_l[i, j]
                    C_l[i, j] = 0.5 * x * (1.0 + T.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
            elif activation == "relu":
                for i, j in T.Parallel(block_m, block_n):
                    C_l[i, j] = T.max(C_l[i, j], 0.0)
            for i, j in T.Parallel(block_m, block_n):
                D_l[i, j] = T.Cast(dtype, C_l[i, j])
            T.copy(D_l, D[by * block_m, bx * block_n])

    return main


def copy_with_barrier(N, block=128, dtype="float32"):
    """B = A through shared memory, synchronised with a hardware mbarrier (T.alloc_barrier: sm_90+)."""

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            bar = T.alloc_barrier(block)
            A_s = T.alloc_shared((block,), dtype)
            T.copy(A[bx * block], A_s)
            T.barrier_arrive(bar[0])
            T.barrier_wait(bar[0], 0)
            T.copy(A_s, B[bx * block])

    return main


def matmul_bias_relu_transposed(with_tile_info=False, epilogue=None):
    """relu(A @ B^T + bias), 64x64x32 tiles, 2 stages. ``with_tile_info`` adds, as TVM expects from
    RecordTileInfo, the attr it records; ``epilogue`` sets the frontend's ``tessera.epilogue``."""
    M, N, K = 256, 256, 128

    @T.prim_func
    def main(
        A: T.Tensor((M, K), "float16"),
        B: T.Tensor((N, K), "float16"),
        bias: T.Tensor((N,), "float16"),
        C: T.Tensor((M, N), "float16"),
    ):
        if epilogue is not None:
            T.func_attr({"tessera.epilogue": epilogue})
        if with_tile_info:
            T.func_attr(
                {
                    "tessera.tile_info": {
                        "tile": {"M": 64, "N": 64, "K": 32},
                        "stages": 2,
                        "dtype_in": "float16",
                        "dtype_acc": "float32",
                        "threads": 128,
                        "epilogue": ["bias", "relu"],
                        "buffers": [
                            "shared.dyn A_s 64x32 float16 (4096 B)",
                            "shared.dyn B_s 64x32 float16 (4096 B)",
                            "local.fragment C_l 64x64 float32 (16384 B)",
                        ],
                    }
                }
            )
        with T.Kernel(T.ceildiv(N, 64), T.ceildiv(M, 64), threads=128) as (bx, by):
            A_s = T.alloc_shared((64, 32), "float16")
            B_s = T.alloc_shared((64, 32), "float16")
            C_l = T.alloc_fragment((64, 64), "float32")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, 32), num_stages=2):
                T.copy(A[by * 64, k * 32], A_s)
                T.copy(B[bx * 64, k * 32], B_s)
                T.gemm(A_s, B_s, C_l, transpose_B=True)
            for i, j in T.Parallel(64, 64):
                C_l[i, j] = T.max(C_l[i, j] + T.Cast("float32", bias[bx * 64 + j]), 0.0)
            T.copy(C_l, C[by * 64, bx * 64])

    return main


def matmul_transposed_a(M=256, N=128, K=64):
    """C = A^T @ B with A stored K x M: the tile's K is A's first axis."""

    @T.prim_func
    def main(A: T.Tensor((K, M), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, 128), T.ceildiv(M, 64), threads=256) as (bx, by):
            A_s = T.alloc_shared((16, 64), "float16")
            B_s = T.alloc_shared((16, 128), "float16")
            C_l = T.alloc_fragment((64, 128), "float32")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, 16), num_stages=4):
                T.copy(A[k * 16, by * 64], A_s)
                T.copy(B[k * 16, bx * 128], B_s)
                T.gemm(A_s, B_s, C_l, transpose_A=True)
            T.copy(C_l, C[by * 64, bx * 128])

    return main


def matmul_residual(M=256, N=256, K=128):
    """C = A @ B + R: R is global but indexed by row and column, a residual and not a bias."""

    @T.prim_func
    def main(
        A: T.Tensor((M, K), "float16"),
        B: T.Tensor((K, N), "float16"),
        R: T.Tensor((M, N), "float32"),
        C: T.Tensor((M, N), "float32"),
    ):
        with T.Kernel(T.ceildiv(N, 64), T.ceildiv(M, 64), threads=128) as (bx, by):
            A_s = T.alloc_shared((64, 32), "float16")
            B_s = T.alloc_shared((32, 64), "float16")
            C_l = T.alloc_fragment((64, 64), "float32")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, 32), num_stages=2):
                T.copy(A[by * 64, k * 32], A_s)
                T.copy(B[k * 32, bx * 64], B_s)
                T.gemm(A_s, B_s, C_l)
            for i, j in T.Parallel(64, 64):
                C_l[i, j] = C_l[i, j] + R[by * 64 + i, bx * 64 + j]
            T.copy(C_l, C[by * 64, bx * 64])

    return main


def matmul_one_k_tile(M=256, N=256, K=32):
    """relu(A @ B) where K fits one tile: the gemm sits in no loop."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "bfloat16"), B: T.Tensor((K, N), "bfloat16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, 64), T.ceildiv(M, 64), threads=128) as (bx, by):
            A_s = T.alloc_shared((64, K), "bfloat16")
            B_s = T.alloc_shared((K, 64), "bfloat16")
            C_l = T.alloc_fragment((64, 64), "float32")
            T.copy(A[by * 64, 0], A_s)
            T.copy(B[0, bx * 64], B_s)
            T.gemm(A_s, B_s, C_l, clear_accum=True)
            for i, j in T.Parallel(64, 64):
                C_l[i, j] = T.max(C_l[i, j], 0.0)
            T.copy(C_l, C[by * 64, bx * 64])

    return main


def residual_add(M=256, N=256, block=64):
    """C = A + R with no gemm: RecordTileInfo finds threads only."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), R: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block), T.ceildiv(M, block), threads=64) as (bx, by):
            for i, j in T.Parallel(block, block):
                row, col = by * block + i, bx * block + j
                C[row, col] = A[row, col] + R[row, col]

    return main


#: The programs ``lower`` knows, at the sizes the tests use.
PROGRAMS = {
    "matmul": lambda: matmul(1024, 1024, 1024, 128, 128, 32),
    "matmul_cpu": lambda: matmul_cpu(1024, 1024, 1024, 64, 64, 32),
    "linear": lambda: linear(1024, 1024, 1024, 128, 128, 32),
}
