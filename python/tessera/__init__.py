"""Tessera: a tile-centric kernel language lowered through TVM/TileLang.

    import tessera as ts
    from tessera import Tensor, ops

    @ts.kernel
    def linear(A: Tensor["M", "K", ts.f16], W: Tensor["K", "N", ts.f16], b: Tensor["N", ts.f16]) \\
            -> Tensor["M", "N", ts.f16]:
        return ops.gelu(ops.matmul(A, W) + b)

    linear.inspect_ir("graph")
    k = ts.compile(linear, target="hopper", shapes={"M": 4096, "N": 4096, "K": 4096})
    k.inspect_ir("sched"); k.source; k.artifacts; k.metadata; k.pass_log
    out = ts.compile(linear, target="cpu")(a, w, b)
    ts.autotune(linear, target="cpu", shapes={"M": 512, "N": 512, "K": 512})   # or ts.compile(..., autotune=True)
    with ts.trace("trace.json"): ...   # compiles and calls as a Chrome trace (or TESSERA_TRACE=trace.json)
    with ts.metrics("calls.jsonl"): ...  # one row per call (or TESSERA_METRICS=calls.jsonl); `tessera metrics`
    kernel = ts.from_relax(mod["main"])  # a Relax function of Tessera's op set as a kernel
"""

from tessera_tvm.metrics import metrics  # noqa: E402
from tessera_tvm.trace import tracing as trace  # noqa: E402
from tessera_tvm.version import __version__  # noqa: E402

from . import ops, reference  # noqa: E402
from .compiler import CompiledKernel, compile  # noqa: E402
from .distributed import CollectiveError, Mesh, Replicate, Split, shard  # noqa: E402
from .errors import (  # noqa: E402
    ArgumentError,
    AutotuneError,
    DTypeError,
    KernelError,
    NotRunnableError,
    ResourceError,
    ScheduleError,
    ShapeError,
    TesseraError,
)
from .kernel import Kernel  # noqa: E402
from .relax_import import from_relax  # noqa: E402  (also registers tessera_tvm.relax.from_relax)
from .repro import pack_repro  # noqa: E402
from .repro_replay import replay  # noqa: E402
from .schedule import Schedule  # noqa: E402
from .tuning import AutotuneResult, autotune  # noqa: E402
from .types import DTYPES, DType, Tensor, TensorType, bf16, dtype, f16, f32, fp8_e4m3, fp8_e5m2, int8, int32  # noqa: E402

__all__ = [
    "__version__",
    "metrics",
    "trace",
    "ops",
    "reference",
    "kernel",
    "schedule",
    "compile",
    "autotune",
    "shard",
    "Mesh",
    "Split",
    "Replicate",
    "CollectiveError",
    "pack_repro",
    "from_relax",
    "replay",
    "AutotuneResult",
    "CompiledKernel",
    "Kernel",
    "Schedule",
    "Tensor",
    "TensorType",
    "DType",
    "DTYPES",
    "dtype",
    "f32",
    "f16",
    "bf16",
    "fp8_e4m3",
    "fp8_e5m2",
    "int8",
    "int32",
    "TesseraError",
    "KernelError",
    "ShapeError",
    "DTypeError",
    "ArgumentError",
    "ScheduleError",
    "ResourceError",
    "NotRunnableError",
    "AutotuneError",
]

# `ts.kernel` / `ts.schedule` are the decorators, not the submodules of the same names (importing a
# submodule sets the package attribute): use `from tessera.schedule import Schedule` for the module.
from .kernel import kernel, schedule  # noqa: E402
