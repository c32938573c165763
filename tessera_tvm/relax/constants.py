"""Constants TileLang's TVM would merge: kept apart before its VM code generator pools them.

TileLang's TVM pools a Relax function's constants by structural hash, and two constants of
different values whose hashes collide come out as one: ``where(m, inf, 1.0)`` and ``where(m,
finfo(float32).min, 2.0)`` in one model both read ``inf`` (no error). The hash collides for, among
others, float32 ``inf`` and its lowest finite value, int32 ``2**31 - 1`` and ``0``, ``-2**31`` and
``+-1``, int64 ``2**63 - 1`` and ``1`` (found 2026-11-30; apache-tvm 0.27 keeps them apart).

:func:`keep_constants_apart` runs after the Relax pipeline, on the code the VM generator reads:
where constants of different values share a hash, every one but the first is stored with leading
dims of 1 (another shape, another hash) and viewed back in its shape (``vm.builtin.reshape``, no
copy) where it is used.
"""

from __future__ import annotations

from collections import defaultdict

from .._tvm import tvm

relax = tvm.relax

__all__ = ["keep_constants_apart", "merged_constants"]


def _key(const) -> tuple:
    array = const.data.numpy()
    return (str(array.dtype), array.shape, array.tobytes())


def merged_constants(func) -> list[list]:
    """The groups of ``func``'s constants that share a structural hash but not a value (one
    constant per value, first seen first)."""
    by_hash: dict[int, dict[tuple, object]] = defaultdict(dict)

    def visit(expr):
        if isinstance(expr, relax.Constant):
            by_hash[tvm.ir.structural_hash(expr)].setdefault(_key(expr), expr)

    relax.analysis.post_order_visit(func, visit)
    return [list(group.values()) for group in by_hash.values() if len(group) > 1]


def _apart(func):
    groups = merged_constants(func)
    if not groups:
        return func
    taken = set()
    relax.analysis.post_order_visit(
        func, lambda e: taken.add(tvm.ir.structural_hash(e)) if isinstance(e, relax.Constant) else None
    )
    stored: dict[tuple, tuple] = {}  # a constant's value -> (the constant stored, its shape)
    for group in groups:
        for const in group[1:]:
            array = const.data.numpy()
            lead = 1
            while True:  # leading dims of 1 until the hash is one no other constant has
                candidate = relax.const(array.reshape((1,) * lead + array.shape), str(array.dtype))
                digest = tvm.ir.structural_hash(candidate)
                if digest not in taken:
                    break
                lead += 1
            taken.add(digest)
            stored[_key(const)] = (candidate, array.shape, const.struct_info)

    @relax.expr_functor.mutator
    class Apart(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            args = []
            changed = False
            for arg in call.args:
                if isinstance(arg, relax.Constant) and _key(arg) in stored:
                    candidate, shape, sinfo = stored[_key(arg)]
                    reshape = relax.ExternFunc("vm.builtin.reshape")
                    arg = self.builder_.emit(
                        relax.Call(reshape, [candidate, relax.ShapeExpr(shape)], sinfo_args=[sinfo])
                    )
                    changed = True
                args.append(arg)
            if not changed:
                return call
            return relax.Call(call.op, args, call.attrs, call.sinfo_args, call.span)

    return Apart().visit_expr(func)


@tvm.transform.module_pass(opt_level=0, name="tessera.KeepConstantsApart")
def keep_constants_apart(mod, _ctx):
    """Every Relax function of ``mod`` with no two constants of different values sharing a hash."""
    out = mod
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            rewritten = _apart(func)
            if not rewritten.same_as(func):
                out = out if out is not mod else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
                out[gv] = rewritten
    return out
