"""A numerically stable softmax over the last axis.

tessera compile examples/softmax.py --target rocm --dump graph,sched,tile,target --out build/softmax
python examples/softmax.py
"""

import tessera as ts
from tessera import Tensor, ops

SHAPES = {"M": 4096, "N": 4096}


@ts.kernel
def softmax(x: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.softmax(x, axis=-1)


if __name__ == "__main__":
    import numpy as np

    x = np.random.default_rng(0).standard_normal((300, 1000)).astype(np.float32) * 10
    kernel = ts.compile(softmax, target="cpu")
    out = kernel(x)
    print(kernel.inspect_ir("sched"))
    print(f"max |cpu - reference| = {np.abs(out - softmax.reference(x)).max():.2e}")
