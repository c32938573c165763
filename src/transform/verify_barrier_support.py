"""tessera.VerifyBarrierSupport: reject T.alloc_barrier on GPUs without hardware mbarriers.

Hardware mbarriers (and the Barrier type TileLang's templates emit for them) exist from sm_90 on.
On older targets nvcc fails much later with "identifier 'Barrier' is undefined"; this pass says
what is wrong, in which kernel, and what to use instead, before any code is generated.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.errors import LoweringError
from tessera_tvm.registry import BuildContext, register_pass, tessera_module_pass

_BARRIER_SCOPES = ("shared.barrier", "shared.cluster_barrier")


def _barrier_buffers(func) -> list[str]:
    found: list[str] = []

    def visit(node):
        if isinstance(node, tvm.tirx.SBlock):
            found.extend(b.name for b in node.alloc_buffers if b.scope() in _BARRIER_SCOPES)

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return found


def _compute_capability(target) -> int:
    arch = str(target.attrs.get("arch", "")) if target.kind.name == "cuda" else ""
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    return int(digits) if digits else 0


@register_pass("tessera.VerifyBarrierSupport", doc="reject T.alloc_barrier before sm_90 with a clear error")
def verify_barrier_support(ctx: BuildContext):
    capability = _compute_capability(ctx.target)

    def check(mod, _pass_ctx):
        if ctx.target.kind.name != "cuda" or capability >= 90:
            return mod
        for gv, func in mod.functions.items():
            if isinstance(func, tvm.tirx.PrimFunc):
                names = _barrier_buffers(func)
                if names:
                    raise LoweringError(
                        f"kernel {gv.name_hint!r} allocates hardware barriers ({', '.join(names)}) with "
                        f"T.alloc_barrier, which needs sm_90 or later, but target {ctx.config.name!r} is "
                        f"sm_{capability}; use T.sync_threads() or named barriers on this target"
                    )
        return mod

    return tessera_module_pass(check, name="tessera.VerifyBarrierSupport")
