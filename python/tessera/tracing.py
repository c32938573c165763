"""Tracing: a kernel body runs once on :class:`TracedTensor` s and records Graph IR.

A traced tensor carries its Graph IR handle (built through ``tessera_tvm.graph``) and, for error
messages, each dim's name and value where known: values come from ``shapes=`` at compile time or
from each argument's own array at call time, so an op can say which dims disagree and by how much.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from tessera_tvm.graph import GraphBuilder, GraphBuildError

from .errors import DTypeError, KernelError, ShapeError, user_frame
from .types import DType, TensorType
from .types import dtype as as_dtype

__all__ = ["Dim", "Trace", "TracedTensor", "current_trace", "is_traced"]


class Dim(NamedTuple):
    """One dim of a traced tensor: its symbol name (None for a literal) and its value (None if unknown)."""

    name: str | None
    value: int | None

    def text(self) -> str:
        return self.name if self.name is not None else str(self.value)


_CURRENT: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("tessera_trace", default=None)


def current_trace() -> Trace | None:
    return _CURRENT.get()


def is_traced(*values: Any) -> bool:
    return any(isinstance(v, TracedTensor) for v in values)


class TracedTensor:
    """A tensor inside a kernel being traced: shape, dtype and a Graph IR value; no data."""

    __slots__ = ("_trace", "_value", "dims", "dtype", "label")

    def __init__(self, trace: Trace, value, dims: tuple[Dim, ...], dtype: DType, label: str) -> None:
        self._trace = trace
        self._value = value
        self.dims = dims
        self.dtype = dtype
        self.label = label

    @property
    def shape(self) -> tuple[int | str, ...]:
        """Each dim's value where known, else its name."""
        return tuple(d.value if d.value is not None else d.name for d in self.dims)

    @property
    def ndim(self) -> int:
        return len(self.dims)

    def __repr__(self) -> str:
        return f"<TracedTensor {self.label}: {describe_dims(self.dims)} {self.dtype}>"

    # Python operators: the same ops as tessera.ops ------------------------------------------
    def __add__(self, other):
        from . import ops

        return ops.add(self, other)

    def __radd__(self, other):
        from . import ops

        return ops.add(other, self)

    def __sub__(self, other):
        from . import ops

        return ops.sub(self, other)

    def __rsub__(self, other):
        from . import ops

        return ops.sub(other, self)

    def __mul__(self, other):
        from . import ops

        return ops.mul(self, other)

    def __rmul__(self, other):
        from . import ops

        return ops.mul(other, self)

    def __truediv__(self, other):
        from . import ops

        return ops.div(self, other)

    def __rtruediv__(self, other):
        from . import ops

        return ops.div(other, self)

    def __neg__(self):
        from . import ops

        return ops.neg(self)

    def __matmul__(self, other):
        from . import ops

        return ops.matmul(self, other)

    def astype(self, dtype) -> TracedTensor:
        from . import ops

        return ops.cast(self, dtype)

    def __bool__(self) -> bool:
        raise KernelError(
            f"{self.label} is a traced tensor: it has no value while the kernel is traced, so it "
            "cannot be used in `if`/`while`/`and`/`or`; use tensor ops instead"
        )

    def __array__(self, *args, **kwargs):
        raise KernelError(
            f"{self.label} is a traced tensor, not data: numpy functions cannot run on it; use tessera.ops"
        )

    __hash__ = object.__hash__


def describe_dims(dims: tuple[Dim, ...]) -> str:
    """``[M, K] = [128, 64]`` (names, then values where any symbol's value is known)."""
    names = "[" + ", ".join(d.text() for d in dims) + "]"
    if any(d.name is not None and d.value is not None for d in dims):
        values = "[" + ", ".join("?" if d.value is None else str(d.value) for d in dims) + "]"
        return f"{names} = {values}"
    return names


def tensor_name(t: TracedTensor) -> str:
    """The user's variable name for ``t`` when the calling frame has one, else its label."""
    frame = user_frame()
    if frame is not None:
        for name, value in frame.f_locals.items():
            if value is t:
                return name
    return t.label


def describe(t: TracedTensor) -> str:
    """``A is [M, K] = [128, 64]``."""
    return f"{tensor_name(t)} is {describe_dims(t.dims)}"


class Trace:
    """One tracing of a kernel: the graph builder and the values known for symbolic dims."""

    def __init__(self, name: str, env: dict[str, int] | None = None) -> None:
        self.name = name
        self.env = dict(env or {})
        self.builder = GraphBuilder(name)

    @contextmanager
    def active(self) -> Iterator[Trace]:
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    def param(self, name: str, ttype: TensorType, values: tuple[int, ...] | None = None) -> TracedTensor:
        """A parameter; dim values from ``values`` (its array's shape) or else the bound symbols."""
        dims = []
        for i, d in enumerate(ttype.dims):
            if isinstance(d, int):
                dims.append(Dim(None, d))
            else:
                dims.append(Dim(d, values[i] if values is not None else self.env.get(d)))
        value = self.builder.param(name, ttype.dims, ttype.dtype.tvm)
        return TracedTensor(self, value, tuple(dims), ttype.dtype, name)

    def constant(self, value: float | int, dtype: DType):
        return self.builder.constant(value, dtype.tvm)

    def emit(
        self,
        op: str,
        graph_op: str,
        inputs: list[Any],
        dims: tuple[Dim, ...],
        dtype: DType,
        label: str,
        /,
        **attrs: Any,
    ) -> TracedTensor:
        """Record ``graph_op`` on ``inputs`` (TracedTensors or builder constants) as ``op`` (for errors)."""
        values = []
        for t in inputs:
            if isinstance(t, TracedTensor):
                if t._trace is not self:
                    raise KernelError(f"{t.label} belongs to another kernel's trace; pass it as an argument", op=op)
                values.append(t._value)
            else:
                values.append(t)
        try:
            result = self.builder.emit(graph_op, *values, **attrs)
            inferred = result.shape
        except GraphBuildError as exc:
            raise KernelError(str(exc), op=op) from None
        if result.dtype != dtype.tvm or len(inferred) != len(dims):
            raise KernelError(
                f"internal: Relax inferred {result.shape} {result.dtype}, Tessera expected "
                f"{describe_dims(dims)} {dtype} (please report)",
                op=op,
            )
        return TracedTensor(self, result, dims, dtype, label)


# ---------------------------------------------------------------------------------------------
# Checks shared by the ops
# ---------------------------------------------------------------------------------------------


def require_tensor(op: str, what: str, value: Any) -> TracedTensor:
    if not isinstance(value, TracedTensor):
        raise KernelError(f"{what} must be a tensor, found {type(value).__name__} {value!r}", op=op)
    return value


def require_float(op: str, *tensors: TracedTensor) -> None:
    for t in tensors:
        if not t.dtype.is_float:
            raise DTypeError(
                f"{tensor_name(t)} is {t.dtype}; {op} needs a floating-point tensor "
                f"(cast first: ops.cast({tensor_name(t)}, ts.f32))",
                op=op,
            )


def require_same_dtype(op: str, *tensors: TracedTensor) -> DType:
    first = tensors[0]
    for t in tensors[1:]:
        if t.dtype != first.dtype:
            raise DTypeError(
                f"{tensor_name(first)} is {first.dtype} but {tensor_name(t)} is {t.dtype}; "
                f"cast one of them (ops.cast({tensor_name(t)}, ts.{first.dtype}))",
                op=op,
            )
    return first.dtype


def require_rank(op: str, t: TracedTensor, ranks: tuple[int, ...] | int, what: str = "") -> None:
    ranks_t = (ranks,) if isinstance(ranks, int) else ranks
    if t.ndim not in ranks_t:
        expected = " or ".join(map(str, ranks_t))
        raise ShapeError(f"{describe(t)} (rank {t.ndim}); expected rank {expected}{what}", op=op)


def dims_agree(a: Dim, b: Dim) -> bool | None:
    """True/False when the dims are known to be equal/different; None when it cannot be told yet."""
    if a.value is not None and b.value is not None:
        return a.value == b.value
    if a.name is not None and a.name == b.name:
        return True
    return None


def same_symbol(a: Dim, b: Dim) -> bool:
    """Whether Graph IR sees the two dims as one (same name, or the same literal)."""
    return (a.name is not None and a.name == b.name) or (a.name is None and b.name is None and a.value == b.value)


def differs(a: Dim, b: Dim) -> str:
    """``K differs (64 vs 32)`` / ``K and K2 differ (64 vs 32)``."""
    if a.name is not None and a.name == b.name:
        return f"{a.name} differs ({a.value} vs {b.value})"
    return f"{a.text()} and {b.text()} differ ({a.value} vs {b.value})"


def broadcast_dims(op: str, a: TracedTensor, b: TracedTensor) -> tuple[Dim, ...]:
    """numpy broadcasting of ``a`` and ``b``'s dims, with Graph IR's rule that matching dims share a name."""
    out: list[Dim] = []
    da, db = list(a.dims), list(b.dims)
    n = max(len(da), len(db))
    da = [None] * (n - len(da)) + da
    db = [None] * (n - len(db)) + db
    for i, (x, y) in enumerate(zip(da, db, strict=True)):
        if x is None or (x.name is None and x.value == 1 and y is not None):
            out.append(y)
            continue
        if y is None or (y.name is None and y.value == 1):
            out.append(x)
            continue
        axis = i - n
        if dims_agree(x, y) is False:
            raise ShapeError(
                f"{describe(a)} but {describe(b)}: they do not broadcast, dim {axis}: {differs(x, y)}", op=op
            )
        if not same_symbol(x, y):
            raise ShapeError(
                f"{describe(a)} but {describe(b)}: dim {axis} is {x.text()} in one and {y.text()} in "
                f"the other; dims that must match need the same name (or a literal 1 to broadcast)",
                op=op,
            )
        out.append(x if x.value is not None else y)
    return tuple(out)


def as_dtype_arg(op: str, value: Any) -> DType:
    try:
        return as_dtype(value)
    except TypeError as exc:
        raise DTypeError(str(exc), op=op) from None


def normalize_axis(op: str, t: TracedTensor, axis: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int) or not -t.ndim <= axis < t.ndim:
        raise ShapeError(
            f"axis {axis!r} is out of range for {describe(t)} (rank {t.ndim}); expected an int in "
            f"[{-t.ndim}, {t.ndim - 1}]",
            op=op,
        )
    return axis % t.ndim
