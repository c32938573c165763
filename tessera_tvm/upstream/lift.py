"""Tensor constants stay in the user's process: lifted to parameters before the module travels.

A model imported with ``keep_params_as_input=False`` holds its weights as constants (``tvm.ir.expr.Constant``), which
TVMScript prints as ``metadata[...]`` references whose JSON neither TVM reads from the other. So
before the module is printed, every non-scalar constant a call reads becomes a parameter of its
function (``tessera_const_<i>``), and when the partitioned module comes back ``BindParams`` binds
each one to its constant again: the weights never cross the process boundary. Scalars print inline
and travel as they are. Written against apache-tvm 0.27's Python API (``ty``, ``ret_ty``).
"""

from __future__ import annotations

from typing import Any

PREFIX = "tessera_const_"


def lift_constants(mod) -> tuple[Any, dict[str, dict[str, Any]]]:
    """``mod`` with the tensor constants of its Relax functions as extra parameters, and for each
    function the constants by parameter name (for :func:`bind_constants`)."""
    import tvm
    from tvm import relax

    lifted: dict[str, dict[str, Any]] = {}

    @relax.expr_functor.mutator
    class Lift(relax.PyExprMutator):
        def __init__(self, mod_) -> None:
            super().__init__(mod_)
            self.params: list[Any] = []
            self.values: dict[str, Any] = {}

        def _lift(self, arg):
            value = getattr(arg, "value", None) if isinstance(arg, tvm.ir.expr.Constant) else None
            if isinstance(value, tvm.runtime.Tensor) and len(value.shape) > 0:
                name = f"{PREFIX}{len(self.params)}"
                var = relax.Var(name, arg.ty)
                self.params.append(var)
                self.values[name] = arg.value
                return var
            return arg

        def visit_call_(self, call):
            call = super().visit_call_(call)
            args = [self._lift(a) for a in call.args]
            if all(a.same_as(b) for a, b in zip(args, call.args, strict=True)):
                return call
            return relax.Call(call.op, args, call.attrs, call.ty_args)

    out = tvm.IRModule({}, attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            out[gv] = func
            continue
        lift = Lift(mod)
        body = lift.visit_expr(func.body)
        if lift.params:
            func = relax.Function([*func.params, *lift.params], body, func.ret_ty, func.is_pure, func.attrs)
            lifted[str(gv.name_hint)] = lift.values
        out[gv] = func
    return out, lifted


def bind_constants(mod, lifted: dict[str, dict[str, Any]]):
    """The lifted parameters of each function bound to their constants again."""
    from tvm import relax

    for name, values in lifted.items():
        mod = relax.transform.BindParams(name, values)(mod)
    return mod
