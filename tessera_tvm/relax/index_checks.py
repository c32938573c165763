"""Indices read from data are checked before TVM uses them.

TVM imports ``nn.Embedding``, ``index_select``, ``x[idx]`` and ``x[:, idx]`` as ``R.take(...,
mode="fast")``, ``gather`` and ``cross_entropy``'s decomposition as ``R.gather_elements``,
``scatter`` as ``R.scatter_elements`` and ``F.nll_loss``/``cross_entropy`` (imported whole) as
``R.nn.nll_loss``; all four read memory at the index they are given. A token id past the vocabulary
crashed the process (SIGSEGV) or, a little past it, read other memory into the result, where torch
raises ``IndexError``.

:func:`check_indices` (run last by ``partition_for_tessera``) gives each such call whose indices are
not constants a small TIR function before it: it passes the indices through unchanged and raises
``IndexError`` (naming the op, its function and the valid range) when one is out of range. Negative
indices of a ``take`` count from the end, as in torch's indexing (the check turns them into
``i + n``); ``gather_elements`` and ``scatter_elements`` take ``[0, n)``, as torch's ``gather`` and
``scatter``; ``nll_loss`` takes ``[0, C)`` and its ``ignore_index``. Constant indices are checked
here, at partition time. ``take`` in ``mode="clip"`` or ``"wrap"`` never reads out of range and is
left alone.

On the CPU the check raises from compiled code (a TIR assert, no Python needed). CUDA kernels cannot
raise: on the GPU configs the check prints the message from the device and traps, which stops the
launch with a CUDA error, as torch's device-side asserts do (and, as there, the CUDA context is
unusable after it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._tvm import tvm
from ..errors import TesseraError

relax = tvm.relax

__all__ = ["CHECK_ATTR", "check_indices"]

#: Attribute of the check functions (its value: the op whose indices it checks).
CHECK_ATTR = "tessera.index_check"


def check_indices(mod, *, gpu: bool = False) -> tuple[Any, dict[str, int]]:
    """``mod`` with the indices of every data-dependent ``take``/``gather_elements``/
    ``scatter_elements``/``nll_loss`` checked at run time (module docstring), and how many calls of
    each op got a check. Constant indices out of range raise :class:`TesseraError` here. Calls already
    checked (a second partition) are left as they are."""
    counts: dict[str, int] = {}
    checker = _Checker(mod, gpu, counts)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            checker.function = str(gv.name_hint)
            before = sum(counts.values())
            new = checker.visit_expr(func)
            if checker.errors:
                raise TesseraError(checker.errors[0])
            if sum(counts.values()) != before:  # the casts and reshapes the checks repeated are dead
                checker.builder_.update_func(gv, relax.analysis.remove_all_unused(new))
    if not counts:
        return mod, counts
    return checker.builder_.get(), counts


def _rule(call):
    """``(op, position of the indices among the arguments, size of the axis they index, kind,
    ignore_index)`` for a call whose indices need a check, or None. ``kind``: "wrap" (negative indices
    count from the end) or "strict" (``[0, n)``)."""
    if not isinstance(call.op, tvm.ir.Op):
        return None
    name = call.op.name
    if name == "relax.take":
        if str(call.attrs.mode) != "fast":
            return None
        data = call.args[0]
        shape = _static_or_symbolic_shape(data)
        if shape is None:
            return None
        if call.attrs.axis is None:
            size = _product(shape)
        else:
            size = shape[int(call.attrs.axis) % len(shape)]
        return "take", 1, size, "wrap", None
    if name in ("relax.gather_elements", "relax.scatter_elements"):
        shape = _static_or_symbolic_shape(call.args[0])
        if shape is None or not shape:
            return None
        return name.split(".")[1], 1, shape[int(call.attrs.axis) % len(shape)], "strict", None
    if name == "relax.nn.nll_loss":
        shape = _static_or_symbolic_shape(call.args[0])
        if shape is None or not shape:
            return None
        classes = shape[1] if len(shape) > 1 else shape[0]
        return "nll_loss", 1, classes, "strict", int(call.attrs.ignore_index)
    return None


#: Ops that move indices without changing them (followed back to the indices' origin).
_SHAPE_ONLY = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten", "relax.permute_dims")


def _static_or_symbolic_shape(expr):
    info = expr.struct_info
    if not isinstance(info, relax.TensorStructInfo) or not isinstance(info.shape, relax.ShapeExpr):
        return None
    return list(info.shape.values)


def _product(dims):
    out = tvm.tirx.IntImm("int64", 1)
    for d in dims:
        out = out * d
    return out


@relax.expr_functor.mutator
class _Checker(relax.PyExprMutator):
    def __init__(self, mod, gpu: bool, counts: dict[str, int]) -> None:
        super().__init__(mod)
        self.gpu = gpu
        self.counts = counts
        self.function = ""
        self.errors: list[str] = []
        self.checks: dict[str, Any] = {}  # PrimFunc text -> its GlobalVar (one function per distinct check)
        # the check functions' names: those added here and those of an earlier partition
        self.check_names = {
            str(gv.name_hint)
            for gv, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and CHECK_ATTR in f.attrs
        }

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.index_tensor":
            return self._index_tensor(call)
        rule = _rule(call)
        if rule is None:
            return call
        op, position, size, kind, ignore = rule
        checked = self._checked(call.args[position], op, size, kind, ignore, _describe(call, op, self.function))
        if checked is None:
            return call
        args = list(call.args)
        args[position] = checked
        return relax.Call(call.op, args, call.attrs, call.sinfo_args, call.span)

    def _index_tensor(self, call):
        """``x[i, j, ...]`` (index tensors for the leading axes, broadcast together): each index checked
        against its own axis, ``[0, n)``."""
        data, indices = call.args
        shape = _static_or_symbolic_shape(data)
        if isinstance(indices, relax.Var):
            indices = self.lookup_binding(indices)
        if shape is None or not isinstance(indices, relax.Tuple):
            return call
        fields, changed = [], False
        for axis, index in enumerate(indices.fields):
            where = (
                f"R.index_tensor of a tensor of shape {_shape_text(shape)}, the index for axis {axis}, "
                f"in function {self.function!r} (x[i, j])"
            )
            # strict: the import already counted negative indices from the end (frontend_fixes._index),
            # so one still negative was below -n
            checked = self._checked(index, "index_tensor", shape[axis], "strict", None, where)
            fields.append(index if checked is None else checked)
            changed |= checked is not None
        if not changed:
            return call
        return relax.Call(call.op, [data, relax.Tuple(fields)], call.attrs, call.sinfo_args, call.span)

    def _checked(self, indices, op, size, kind, ignore, where):
        """``indices`` through a check (a new expression), or None where none is added."""
        if isinstance(indices, relax.Constant):
            error = _constant_out_of_range(indices, size, kind, ignore, where)
            if error:  # raised by check_indices: an exception inside the mutator reaches Python as a RuntimeError
                self.errors.append(error)
            return None
        source, chain = self._origin(indices)
        if self._already_checked(source):
            return None
        info = source.struct_info
        if not isinstance(info, relax.TensorStructInfo) or not isinstance(info.shape, relax.ShapeExpr):
            return None  # no shape to give the check's output (an import never makes one)
        dtype = str(info.dtype)
        if not dtype.startswith(("int", "uint")):
            return None
        static = isinstance(size, tvm.tirx.IntImm)
        text = _check_source(
            op, where, len(info.shape.values), dtype, kind, int(size) if static else None, ignore, self.gpu
        )
        gv = self.checks.get(text)
        if gv is None:
            gv = self.builder_.add_func(_parse(text), f"tessera_check_{op}_indices")
            self.checks[text] = gv
            self.check_names.add(str(gv.name_hint))
        tir_vars = None if static else relax.ShapeExpr([size])
        checked = self.builder_.emit(relax.call_tir(gv, [source], info, tir_vars=tir_vars), name_hint="checked")
        for step in chain:  # the casts and reshapes between the indices' origin and the op, again
            checked = self.builder_.emit(relax.Call(step.op, [checked, *step.args[1:]], step.attrs, step.sinfo_args))
        self.counts[op] = self.counts.get(op, 0) + 1
        return checked

    def _origin(self, indices):
        """The tensor the indices come from through integer casts and reshapes (TVM's embedding
        import casts int64 token ids to int32 first, which would wrap 2**32 + 1 round to 1), and those
        steps, first to last. The check reads the origin's values."""
        chain = []
        while isinstance(indices, relax.Var):
            bound = self.lookup_binding(indices)
            if not isinstance(bound, relax.Call) or not isinstance(bound.op, tvm.ir.Op):
                break
            name = bound.op.name
            if name == "relax.astype":
                source = bound.args[0].struct_info
                if not (isinstance(source, relax.TensorStructInfo) and str(source.dtype).startswith("int")):
                    break
            elif name not in _SHAPE_ONLY:
                break
            chain.append(bound)
            indices = bound.args[0]
        return indices, chain[::-1]

    def _already_checked(self, indices) -> bool:
        bound = self.lookup_binding(indices) if isinstance(indices, relax.Var) else None
        if not isinstance(bound, relax.Call) or not isinstance(bound.op, tvm.ir.Op):
            return False
        if bound.op.name != "relax.call_tir" or not isinstance(bound.args[0], relax.GlobalVar):
            return False
        return str(bound.args[0].name_hint) in self.check_names


#: What users write that becomes each op (named in the error).
_WRITTEN_AS = {
    "take": "an nn.Embedding lookup, index_select or x[indices]",
    "gather_elements": "torch.gather",
    "scatter_elements": "scatter",
    "nll_loss": "the targets of nll_loss or cross_entropy",
}


def _shape_text(dims) -> str:
    return str(tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in dims))


def _describe(call, op: str, function: str) -> str:
    shape = _shape_text(_static_or_symbolic_shape(call.args[0]))
    axis = getattr(call.attrs, "axis", None)
    along = "" if op == "nll_loss" else (" flattened" if axis is None else f" along axis {int(axis)}")
    return f"R.{'nn.' if op == 'nll_loss' else ''}{op} of a tensor of shape {shape}{along} in function {function!r} ({_WRITTEN_AS[op]})"


def _parse(text: str):
    from tvm.script import tirx as T  # noqa: N812

    return tvm.script.from_source(text, extra_vars={"T": T})


def _valid_range(size: str, kind: str, ignore: int | None) -> str:
    if kind == "wrap":
        return f"[-{size}, {size})"
    return f"[0, {size})" + ("" if ignore is None else f" or {ignore} (ignore_index)")


def _constant_out_of_range(indices, size, kind: str, ignore: int | None, where: str) -> str | None:
    """The error for constant ``indices`` with one out of range, or None."""
    if not isinstance(size, tvm.tirx.IntImm):
        return None
    n = int(size)
    values = indices.data.numpy()
    if not np.issubdtype(values.dtype, np.integer):
        return None
    low = -n if kind == "wrap" else 0
    bad = (values < low) | (values >= n)
    if ignore is not None:
        bad &= values != ignore
    if bad.any():
        shown = ", ".join(str(v) for v in np.unique(values[bad])[:4])
        return (
            f"{where}: constant index {shown} is out of range for an axis of size {n}; "
            f"expected indices in {_valid_range(str(n), kind, ignore)}"
        )
    return None


def _check_source(op, where, rank, dtype, kind, size, ignore, gpu) -> str:
    """TVMScript of the check: ``B = A`` (negative indices of a "wrap" check plus n), raising
    ``IndexError`` (CPU) or trapping (GPU: TVM's default GPU schedule binds its loops) when an index is
    out of range."""
    dims = [f"d{i}" for i in range(rank)]
    shape = f"({', '.join(dims)}{',' if rank == 1 else ''})"
    n = "n" if size is None else f"T.int64({size})"
    message = (
        f"index out of range: {where}; every index must be in "
        f"{_valid_range('n' if size is None else str(size), kind, ignore)}"
    )
    at = ", ".join(f"v{i}" for i in range(rank)) if rank else "()"
    a, b = f"A[{at}]", f"B[{at}]"
    value = f"T.Cast('int64', {a})"
    low = f"-{n}" if kind == "wrap" else "T.int64(0)"
    ok = f"{low} <= {value} and {value} < {n}"
    if ignore is not None:
        ok = f"({ok}) or {value} == T.int64({ignore})"
    result = f"T.if_then_else({a} < T.{dtype}(0), {a} + T.Cast({dtype!r}, {n}), {a})" if kind == "wrap" else a
    if gpu:
        fail = [
            f"if not ({ok}):",
            f"    T.evaluate(T.call_extern('int32', 'printf', {('Tessera: ' + message + chr(10))!r}))",
            "    T.evaluate(T.call_extern('void', '__trap'))",
        ]
    else:
        fail = [f"T.Assert({ok}, {message!r}, 'IndexError')"]
    axes = [f"{at} = T.axis.remap({'S' * rank!r}, [{', '.join(f'i{i}' for i in range(rank))}])"] if rank else []
    block = ["with T.sblock('check'):", *(f"    {line}" for line in [*axes, *fail, f"{b} = {result}"])]
    if rank:
        block = [f"for {', '.join(f'i{i}' for i in range(rank))} in T.grid({', '.join(dims)}):"] + [
            f"    {line}" for line in block
        ]
    lines = [
        "@T.prim_func(private=True)",
        f"def check(a: T.handle, b: T.handle{', n: T.int64' if size is None else ''}):",
        # op_pattern 8 (opaque): FuseOps leaves the check a function of its own
        f"    T.func_attr({{'tir.noalias': True, 'op_pattern': 8, {CHECK_ATTR!r}: {op!r}}})",
        *(f"    {d} = T.int64()" for d in dims),
        f"    A = T.match_buffer(a, {shape}, {dtype!r})",
        f"    B = T.match_buffer(b, {shape}, {dtype!r})",
        *(f"    {line}" for line in block),
    ]
    return "\n".join(lines) + "\n"
