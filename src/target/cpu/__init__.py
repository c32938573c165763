"""The CPU backend (codegen kind ``c``): g++ builds of TileLang's C source, run in-process with ctypes.

:mod:`.build` drives g++ (and the precompiled prelude), :mod:`.loader` loads the library and checks
numpy arguments, :mod:`.lowered` is what ``tessera_tvm.lower`` calls through the manifest in
:mod:`.backend`. The names below are the public API, importable from ``tessera_tvm.target.cpu``.
"""

from .build import (  # noqa: F401
    DEFAULT_CPU_FLAGS,
    PRELUDE,
    PRELUDE_INCLUDE,
    RUNTIME_INCLUDE_DIR,
    _intact_preludes,
    _prelude_identity,
    aligned_local_arrays,
    compile_cpu,
    cpu_build_command,
    precompiled_prelude,
    with_spec_pragmas,
)
from .loader import (  # noqa: F401
    ArgumentError,
    CpuKernel,
    KernelParam,
    KernelRuntimeError,
    ParamSpecError,
    load_cpu_kernel,
    numpy_dtype,
)

__all__ = [
    "DEFAULT_CPU_FLAGS",
    "RUNTIME_INCLUDE_DIR",
    "ArgumentError",
    "CpuKernel",
    "KernelParam",
    "KernelRuntimeError",
    "ParamSpecError",
    "aligned_local_arrays",
    "compile_cpu",
    "cpu_build_command",
    "load_cpu_kernel",
    "numpy_dtype",
    "precompiled_prelude",
]
