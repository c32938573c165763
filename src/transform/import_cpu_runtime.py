"""tessera.ImportCpuRuntime: ``#include <tessera/cpu.h>`` in CPU kernels that call into it.

Runs after ``tessera.LowerParallelGrid``: a kernel that uses the parallel region's ops or a
``tessera_*`` extern function gets the header through a ``pragma_import_c`` attr, which TileLang's C
codegen prints at the top of the source. Other kernels are left as they are, so their source stays
TileLang's.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, register_pass, tessera_module_pass

from . import analysis
from .parallel_region import OPS, RUNTIME_HEADER, RUNTIME_PREFIX


def uses_cpu_runtime(func) -> bool:
    """Whether ``func`` calls into tessera/cpu.h (a region op or a ``tessera_*`` extern function)."""

    def uses(node) -> bool:
        name = analysis.op_name(node)
        if name in OPS:
            return True
        if name in ("tirx.call_extern", "tirx.call_pure_extern"):
            return str(node.args[0].value).startswith(RUNTIME_PREFIX)
        return False

    return analysis.uses(func.body, uses)


def import_cpu_runtime(func):
    """``func`` with ``#include <tessera/cpu.h>`` (a ``pragma_import_c`` attr) when it uses the header."""
    if not uses_cpu_runtime(func):
        return func
    tirx = tvm.tirx
    body = tirx.AttrStmt(tirx.StringImm("tessera"), "pragma_import_c", tirx.StringImm(RUNTIME_HEADER), func.body)
    return func.with_body(body)


@register_pass("tessera.ImportCpuRuntime", doc="include tessera/cpu.h in CPU kernels that call into it")
def _import_cpu_runtime(ctx: BuildContext):
    def run(mod, _pass_ctx):
        out = mod.clone()
        for gv, func in analysis.device_kernels(mod):
            if analysis.is_cpu_kernel(func):
                out[gv] = import_cpu_runtime(func)
        return out

    return tessera_module_pass(run, name="tessera.ImportCpuRuntime")
