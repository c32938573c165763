"""tessera.FuseKernels: every binding not yet in a kernel group gets one (graph phase).

Softmax, layer/RMS norms and reductions (each with a trailing cast) and trees of element-wise ops
become groups; a matmul or attention that tessera.FuseEpilogues did not take (it was disabled) becomes
a kernel without epilogue. The groups are then ordered by their outputs and named, and the kernel
function's ``tessera.kernel_groups`` attribute lists them all.
"""

from __future__ import annotations

from ..pass_log import report_status
from ..registry import BuildContext, register_pass, tessera_module_pass
from .fusion import GROUPS_ATTR, Fuser, groups_attr, read_groups
from .nodes import flatten, kernel_functions, replace_functions


@register_pass("tessera.FuseKernels", ir="relax", doc="softmax / norms / reductions, element-wise trees")
def _fuse_kernels(ctx: BuildContext):
    def run(mod, _pass_ctx):
        funcs, before, after = {}, 0, 0
        for gv, func in kernel_functions(mod):
            flat = flatten(func, str(gv.name_hint))
            fuser = Fuser(flat)
            fuser.claim(read_groups(flat, func.attrs.get(GROUPS_ATTR)))
            before += len(fuser.groups)
            fuser.fuse_gemms(epilogue=False)  # only matmuls FuseEpilogues left alone
            fuser.fuse_attention()
            fuser.fuse_rest()
            groups = fuser.run()
            funcs[gv] = func.with_attr(GROUPS_ATTR, groups_attr(groups))
            after += len(groups)
        report_status(f"+{after - before}, {after} kernels in all")
        return replace_functions(mod, funcs)

    return tessera_module_pass(run, name="tessera.FuseKernels")
