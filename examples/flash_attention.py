"""Causal flash attention with grouped-query attention (8 query heads share 2 K/V heads).

tessera compile examples/flash_attention.py --target hopper --dump graph,sched,tile,target --out build/fa
python examples/flash_attention.py
"""

import tessera as ts
from tessera import Tensor, ops

SHAPES = {"B": 2, "H": 32, "H_kv": 8, "S": 4096, "D": 128}


@ts.kernel
def flash_attention(
    Q: Tensor["B", "H", "S", "D", ts.bf16],
    K: Tensor["B", "H_kv", "S", "D", ts.bf16],
    V: Tensor["B", "H_kv", "S", "D", ts.bf16],
) -> Tensor["B", "H", "S", "D", ts.bf16]:
    return ops.flash_attention(Q, K, V, causal=True)


if __name__ == "__main__":
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 100, 64)).astype(ml_dtypes.bfloat16)
    k = rng.standard_normal((1, 2, 100, 64)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((1, 2, 100, 64)).astype(ml_dtypes.bfloat16)
    kernel = ts.compile(flash_attention, target="cpu")
    out = kernel(q, k, v)
    print(kernel.inspect_ir("sched"))
    ref = flash_attention.reference(q, k, v)
    print(f"max |cpu - reference| = {np.abs(out.astype(np.float32) - ref.astype(np.float32)).max():.2e}")
