"""tessera.VerifyBarrierSupport: reject T.alloc_barrier on GPUs without hardware mbarriers.

Hardware mbarriers (and the Barrier type TileLang's templates emit for them) exist from sm_90 on.
On older targets nvcc fails much later with "identifier 'Barrier' is undefined"; this pass says
what is wrong, in which kernel, and what to use instead, before any code is generated.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.errors import LoweringError
from tessera_tvm.registry import BuildContext, register_pass, tessera_module_pass

from .analysis import BARRIER_SCOPES


def _barrier_buffers(func) -> list[str]:
    found: list[str] = []

    def visit(node):
        if isinstance(node, tvm.tirx.SBlock):
            found.extend(b.name for b in node.alloc_buffers if b.scope() in BARRIER_SCOPES)

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return found


@register_pass("tessera.VerifyBarrierSupport", doc="reject T.alloc_barrier before sm_90 with a clear error")
def verify_barrier_support(ctx: BuildContext):
    arch = str(ctx.config.target_dict.get("arch", ctx.config.tvm_kind))

    def check(mod, _pass_ctx):
        if ctx.config.fact("mbarrier"):  # the config's hardware: section says the target has them
            return mod
        for gv, func in mod.functions.items():
            if isinstance(func, tvm.tirx.PrimFunc):
                names = _barrier_buffers(func)
                if names:
                    raise LoweringError(
                        f"kernel {gv.name_hint!r} allocates hardware barriers ({', '.join(names)}) with "
                        f"T.alloc_barrier, which needs hardware barriers (sm_90 or later), but target "
                        f"{ctx.config.name!r} ({arch}) has none (hardware.mbarrier is false); use "
                        "T.sync_threads() or named barriers on this target"
                    )
        return mod

    return tessera_module_pass(check, name="tessera.VerifyBarrierSupport")
