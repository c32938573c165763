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


def _by_hash(func) -> dict[int, list]:
    """Every constant of ``func`` (each occurrence), by structural hash."""
    by_hash: dict[int, list] = defaultdict(list)

    def visit(expr):
        if isinstance(expr, relax.Constant):
            by_hash[tvm.ir.structural_hash(expr)].append(expr)

    relax.analysis.post_order_visit(func, visit)
    return by_hash


def _collisions(by_hash: dict[int, list]) -> list[dict[tuple, list]]:
    """The hashes shared by constants of different values: each as {value: its occurrences}, in the
    order first seen (only these constants are read back as arrays)."""
    out = []
    for occurrences in by_hash.values():
        if len(occurrences) > 1:
            values: dict[tuple, list] = defaultdict(list)
            for const in occurrences:
                values[_key(const)].append(const)
            if len(values) > 1:
                out.append(values)
    return out


def merged_constants(func) -> list[list]:
    """The groups of ``func``'s constants that share a structural hash but not a value (one
    constant per value, first seen first)."""
    return [[consts[0] for consts in values.values()] for values in _collisions(_by_hash(func))]


def _apart(func):
    by_hash = _by_hash(func)
    collisions = _collisions(by_hash)
    if not collisions:
        return func
    taken = set(by_hash)
    stored = {}  # each occurrence of a value kept apart -> (the constant stored, its shape, its struct info)
    for values in collisions:
        for consts in list(values.values())[1:]:
            array = consts[0].data.numpy()
            lead = 1
            while True:  # leading dims of 1 until the hash is one no other constant has
                candidate = relax.const(array.reshape((1,) * lead + array.shape), str(array.dtype))
                digest = tvm.ir.structural_hash(candidate)
                if digest not in taken:
                    break
                lead += 1
            taken.add(digest)
            for const in consts:
                stored[const] = (candidate, array.shape, const.struct_info)

    @relax.expr_functor.mutator
    class Apart(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not any(arg in stored for arg in call.args):
                return call
            args = []
            for arg in call.args:
                if arg in stored:
                    candidate, shape, sinfo = stored[arg]
                    reshape = relax.ExternFunc("vm.builtin.reshape")
                    arg = self.builder_.emit(
                        relax.Call(reshape, [candidate, relax.ShapeExpr(shape)], sinfo_args=[sinfo])
                    )
                args.append(arg)
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
