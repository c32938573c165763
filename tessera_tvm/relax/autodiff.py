"""Graph-level autodiff: backward kernels of a Tessera kernel through Relax's ``Gradient`` pass.

    bwd = tessera_tvm.relax.grad(linear, shapes={"M": 64, "K": 32, "N": 48})
    built = tessera_tvm.relax.build(bwd.module, "cpu")
    loss, (dA, dW, db) = built.run(bwd.function, a, w, b, dout)

``grad`` writes the vector-Jacobian product as a Relax function, ``<kernel>_vjp(inputs..., dout) =
sum(kernel(inputs...) * dout)``, and runs ``relax.transform.Gradient`` on it: the adjoint
``<kernel>_vjp_adjoint`` returns ``(loss, (d input_1, ...))``, the gradient of each input for the
upstream gradient ``dout``. Compiling the module with Tessera offloads the backward's matmuls,
softmaxes and norms like any Relax code.

What Relax's Gradient covers, and what ``grad`` adds (each documented at its definition):
- matmul, add/sub/mul/div, relu, silu, sigmoid, exp, tanh, astype, softmax, sum, mean: Relax's rules.
- layer_norm: decomposed by TVM's ``DecomposeOpsForTraining`` into ops that have rules.
- rms_norm: decomposed here (``x / sqrt(mean(x*x) + eps) * weight``), Relax has no rule.
- gelu (erf and tanh forms): Relax has no rule; Tessera registers the closed-form derivative for
  ``relax.nn.gelu`` / ``relax.nn.gelu_tanh`` when none is registered.
- attention and max: no rule and no decomposition here; ``grad`` says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import op_table
from .._tvm import tvm
from ..errors import TesseraError
from ..graph.nodes import call_with, flatten
from .interop import kernel_function

relax = tvm.relax

#: Relax ops with neither a gradient rule nor a decomposition here (the op table's).
NO_GRADIENT = tuple(op.relax[0] for op in op_table.ANCHORS if op.gradient == "none")


@dataclass(frozen=True)
class Backward:
    """The module holding the forward VJP and its adjoint, and how to call the adjoint."""

    module: object  # tvm.IRModule with `<name>_vjp` and `<name>_vjp_adjoint`
    function: str  # the adjoint: (inputs..., dout) -> (loss, (d input, ...))
    inputs: tuple[str, ...]  # parameter names, in order (then dout)
    wrt: tuple[str, ...]  # the inputs whose gradients the adjoint returns, in order


def grad(kernel, *, shapes: dict[str, int] | None = None, wrt: list[str] | tuple[str, ...] | None = None) -> Backward:
    """Backward of a ``@tessera.kernel`` (or a single-output ``relax.Function``) via Relax's Gradient.

    ``wrt`` names the inputs to differentiate (default: every floating-point input).
    """
    register_missing_gradients()
    func = kernel if isinstance(kernel, relax.Function) else kernel_function(kernel, shapes)
    name = str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else "kernel"
    flat = flatten(func, name)
    if flat.tuple_output or len(flat.outputs) != 1:
        raise TesseraError(f"grad: {name} returns {len(flat.outputs)} tensors; grad takes single-output kernels")
    for node in flat.nodes:
        if node.op in NO_GRADIENT:
            raise TesseraError(
                f"grad: {name} uses R.{node.op} ({node.name}), which Relax's Gradient pass has no rule for "
                "(and Tessera no decomposition)"
            )
    names = tuple(str(p.name_hint) for p in flat.params)
    floats = tuple(n for n, p in zip(names, flat.params, strict=True) if "float" in str(p.struct_info.dtype))
    wrt = tuple(wrt) if wrt is not None else floats
    unknown = [w for w in wrt if w not in names]
    if unknown:
        raise TesseraError(f"grad: {name} has no input(s) {unknown}; its inputs are {list(names)}")
    vjp = f"{name}_vjp"
    mod = tvm.IRModule({tvm.ir.GlobalVar(vjp): _vjp_function(flat, vjp)})
    mod = relax.transform.DecomposeOpsForTraining(vjp)(mod)
    params = mod[vjp].params
    required = [p for p in params if str(p.name_hint) in wrt]
    mod = relax.transform.Gradient(vjp, require_grads=required)(mod)
    return Backward(mod, f"{vjp}_adjoint", names, tuple(str(p.name_hint) for p in required))


def _vjp_function(flat, name: str):
    """``name(inputs..., dout) = sum(f(inputs...) * dout)``, f's operators inlined (rms_norm decomposed)."""
    bb = relax.BlockBuilder()
    out = flat.outputs[0]
    dout = relax.Var("dout", relax.TensorStructInfo(out.struct_info.shape, out.struct_info.dtype))
    params = [relax.Var(str(p.name_hint), p.struct_info) for p in flat.params]
    subst = dict(zip(flat.params, params, strict=True))
    with bb.function(name, [*params, dout]):
        with bb.dataflow():
            for node in flat.nodes:
                args = [subst.get(a, a) if isinstance(a, relax.Var) else a for a in node.args]
                if node.op in _DECOMPOSED:
                    subst[node.var] = _DECOMPOSED[node.op](bb, node, args)
                else:
                    subst[node.var] = bb.emit(call_with(node, args), name_hint=node.name)
            y = subst.get(out, out)
            loss = bb.emit_output(relax.op.sum(relax.op.multiply(y, dout)), name_hint="loss")
        bb.emit_func_output(loss)
    return bb.get()[name]


def _rms_norm(bb, node, args):
    """rms_norm has no gradient rule: ``x / sqrt(mean(x * x, -1) + eps) * weight``, in ops that do."""
    x, weight = args
    dtype = str(node.var.struct_info.dtype)
    mean_square = bb.emit(relax.op.mean(relax.op.multiply(x, x), axis=[-1], keepdims=True))
    eps = relax.const(float(node.attrs["epsilon"]), dtype)
    normed = bb.emit(relax.op.divide(x, relax.op.sqrt(relax.op.add(mean_square, eps))))
    return bb.emit(relax.op.multiply(normed, weight), name_hint=node.name)


#: How each anchor the op table says Tessera decomposes (``gradient="decompose"``) is decomposed,
#: by Relax op (a KeyError at import: the table names one this module does not decompose).
_DECOMPOSITIONS = {"rms_norm": _rms_norm}
_DECOMPOSED = {op.relax[0]: _DECOMPOSITIONS[op.name] for op in op_table.ANCHORS if op.gradient == "decompose"}


# ---------------------------------------------------------------------------------------------
# Gradient rules Relax lacks for Tessera's op set (registered only where none exists)
# ---------------------------------------------------------------------------------------------

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_CUBIC = 0.044715


def _gelu_grad(orig_var, orig_call, output_grad, ctx):
    """d/dx gelu(x) = Phi(x) + x phi(x) = 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)."""
    x = orig_call.args[0]
    dtype = str(x.struct_info.dtype)

    def c(v):
        return relax.const(v, dtype)

    op = relax.op
    cdf = op.multiply(c(0.5), op.add(c(1.0), op.erf(op.multiply(x, c(1.0 / math.sqrt(2.0))))))
    pdf = op.multiply(c(1.0 / math.sqrt(2.0 * math.pi)), op.exp(op.multiply(c(-0.5), op.multiply(x, x))))
    return [op.multiply(output_grad, op.add(cdf, op.multiply(x, pdf)))]


def _gelu_tanh_grad(orig_var, orig_call, output_grad, ctx):
    """gelu_tanh(x) = 0.5 x (1 + t), t = tanh(u), u = sqrt(2/pi) (x + 0.044715 x^3):
    d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)."""
    x = orig_call.args[0]
    dtype = str(x.struct_info.dtype)

    def c(v):
        return relax.const(v, dtype)

    op = relax.op
    x2 = op.multiply(x, x)
    u = op.multiply(c(_SQRT_2_OVER_PI), op.add(x, op.multiply(c(_GELU_TANH_CUBIC), op.multiply(x2, x))))
    t = op.tanh(u)
    du = op.multiply(c(_SQRT_2_OVER_PI), op.add(c(1.0), op.multiply(c(3 * _GELU_TANH_CUBIC), x2)))
    term = op.multiply(op.multiply(c(0.5), x), op.multiply(op.subtract(c(1.0), op.multiply(t, t)), du))
    return [op.multiply(output_grad, op.add(op.multiply(c(0.5), op.add(c(1.0), t)), term))]


#: Tessera's rules for the ops the op table gives one (``gradient="rule"``), by Relax op.
_RULE_OF = {"gelu_erf": _gelu_grad, "gelu_tanh": _gelu_tanh_grad}
_RULES = {f"relax.{op.relax}": _RULE_OF[op.name] for op in op_table.OPS if op.gradient == "rule"}


def register_missing_gradients() -> list[str]:
    """Register Tessera's rules for the ops in ``_RULES`` that have none; return the ops registered."""
    added = []
    for op_name, rule in _RULES.items():
        if tvm.ir.Op.get(op_name).get_attr("FPrimalGradient") is None:
            relax.op.register_gradient(op_name, rule)
            added.append(op_name)
    return added
