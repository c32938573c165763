"""Tessera for TVM Relax users: Tessera kernels and pipelines inside ``tvm.compile``.

    import tessera_tvm
    mod, report = tessera_tvm.partition_for_tessera(mod, "cpu")   # offload; report says what and why
    with report.target:
        ex = tvm.compile(mod, report.target, relax_pipeline=report.relax_pipeline,
                         tir_pipeline=report.tir_pipeline)                # "tessera.cpu"
    vm = tessera_tvm.relax.load_vm(ex, "cpu")                      # CPU: relax.VirtualMachine

    built = tessera_tvm.relax.build(mod, "cpu")                    # the same in one call
    built.run("main", x, w)                                        # numpy in, numpy out

    mod, gv = tessera_tvm.relax.add_kernel(mod, my_kernel, shapes={...})   # Tessera -> Relax
    kernel = tessera_tvm.relax.from_relax(mod["main"])                     # Relax -> ts.compile
    bwd = tessera_tvm.relax.grad(my_kernel, shapes={...})                  # backward via Gradient

Importing this package registers the TIR pipelines ``tessera.<config>`` with TVM, and puts right
what TileLang's torch frontend imports wrong (``torch_frontend.py`` lists each case).
"""

from __future__ import annotations

from .._tvm import tvm
from ..frontend_fixes import patch_exported_program_importer
from .autodiff import Backward, grad  # noqa: F401
from .build import (  # noqa: F401
    RelaxBuild,
    build,
    compile_module,
    device_sources,
    export_library,
    export_options,
    kernel_sources,
    load_vm,
)
from .interop import NotInOpSet, add_kernel, from_relax, kernel_function  # noqa: F401
from .offload import LeftToTVM, Offloaded, OffloadReport, partition_for_tessera  # noqa: F401
from .patterns import OffloadRejected  # noqa: F401
from .pipeline import PipelineError, ensure_registered, pipeline_name, tessera_tir_pipeline  # noqa: F401
from .torch_frontend import patch_torch_frontend

ensure_registered()
patch_torch_frontend()
patch_exported_program_importer(tvm)
