"""Layer normalisation over the last axis with a learned scale and shift.

tessera compile examples/layer_norm.py --target ampere --dump graph,sched,tile,target --out build/ln
python examples/layer_norm.py
"""

import tessera as ts
from tessera import Tensor, ops

SHAPES = {"M": 4096, "N": 4096}


@ts.kernel
def layer_norm(
    x: Tensor["M", "N", ts.f16], weight: Tensor["N", ts.f16], bias: Tensor["N", ts.f16]
) -> Tensor["M", "N", ts.f16]:
    return ops.layer_norm(x, weight, bias, eps=1e-5)


if __name__ == "__main__":
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 257)).astype(np.float16)
    w = rng.standard_normal(257).astype(np.float16)
    b = rng.standard_normal(257).astype(np.float16)
    kernel = ts.compile(layer_norm, target="cpu")
    out = kernel(x, w, b)
    print(kernel.inspect_ir("sched"))
    err = np.abs(out.astype(np.float32) - layer_norm.reference(x, w, b).astype(np.float32)).max()
    print(f"max |cpu - reference| = {err:.2e}")
