"""tessera.FuseEpilogues: each matmul with its transposes and epilogue, each attention with its
layout permutes, as kernel groups (graph phase).

The groups are written to the kernel function's ``tessera.kernel_groups`` attribute, where
tessera.FuseKernels adds the rest. Disabled, every matmul becomes a GEMM kernel of its own and its
epilogue ops element-wise kernels.
"""

from __future__ import annotations

from ..pass_log import report_status
from ..registry import BuildContext, register_pass, tessera_module_pass
from .fusion import GROUPS_ATTR, Fuser, groups_attr
from .nodes import flatten, kernel_functions, replace_functions


@register_pass("tessera.FuseEpilogues", ir="relax", doc="matmul + transposes + epilogue; attention + permutes")
def _fuse_epilogues(ctx: BuildContext):
    def run(mod, _pass_ctx):
        funcs, kernels = {}, 0
        for gv, func in kernel_functions(mod):
            fuser = Fuser(flatten(func, str(gv.name_hint)))
            fuser.fuse_gemms()
            fuser.fuse_attention()
            funcs[gv] = func.with_attr(GROUPS_ATTR, groups_attr(fuser.groups))
            kernels += len(fuser.groups)
        report_status(f"{kernels} kernel{'s' if kernels != 1 else ''}")
        return replace_functions(mod, funcs)

    return tessera_module_pass(run, name="tessera.FuseEpilogues")
