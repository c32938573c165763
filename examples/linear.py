"""A linear layer with bias and GELU, fused into one GEMM kernel with an epilogue.

tessera compile examples/linear.py --target hopper --dump graph,sched,tile,target --out build/linear
python examples/linear.py          # compile for the CPU, run, compare with the numpy reference
"""

import tessera as ts
from tessera import Tensor, ops

#: Default shapes for `tessera compile` (override with --shapes M=...,N=...).
SHAPES = {"M": 4096, "N": 4096, "K": 4096}


@ts.kernel
def linear(
    A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16], b: Tensor["N", ts.f16]
) -> Tensor["M", "N", ts.f16]:
    return ops.gelu(ops.matmul(A, W) + b)


if __name__ == "__main__":
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((200, 96)).astype(np.float16)
    w = (rng.standard_normal((96, 130)) / 10).astype(np.float16)
    b = rng.standard_normal(130).astype(np.float16)
    print(linear.inspect_ir("graph"))
    kernel = ts.compile(linear, target="cpu")
    out = kernel(a, w, b)
    print(kernel.inspect_ir("sched"))
    err = np.abs(out.astype(np.float32) - linear.reference(a, w, b).astype(np.float32)).max()
    print(f"max |cpu - reference| = {err:.2e}")
