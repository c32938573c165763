"""Kernel specs: what one fused device kernel computes, independent of how it is tiled.

The frontend maps each fused group of its graph onto one spec; ``build_tile_program(spec, schedule,
target_kind)`` turns the spec into a TileLang PrimFunc. Every spec is a frozen, hashable dataclass
whose ``params()`` (= ``inputs() + outputs()``) is the PrimFunc's parameter order, so a caller knows
how to pass arrays:

    spec = GemmSpec(4096, 4096, 4096, dtype_a="float16", dtype_out="float16",
                    epilogue=(EpilogueOp("bias", operand="bias"), EpilogueOp("gelu_tanh")))
    spec.inputs()   # [TensorArg('A', (4096, 4096), 'float16'), TensorArg('B', ...), TensorArg('bias', (4096,), 'float16')]
    spec.outputs()  # [TensorArg('C', (4096, 4096), 'float16')]

All arithmetic happens on an fp32 (``dtype_acc`` / ``dtype_compute``) value; inputs are cast up when
loaded and results cast down when stored. ``TileSchedule`` holds the tiling knobs, with defaults
from a target config's ``schedule:`` section, and ``smem_bytes`` estimates a schedule's shared memory
so an override that cannot fit is rejected before lowering (``validate_schedule``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar, NamedTuple

from ..errors import ResourceError, TesseraError

__all__ = [
    "DTYPES",
    "AttentionSpec",
    "Binary",
    "Const",
    "ElementwiseSpec",
    "EpilogueOp",
    "Expr",
    "GemmSpec",
    "Input",
    "KernelSpec",
    "NormSpec",
    "ReduceSpec",
    "SoftmaxSpec",
    "SpecError",
    "TensorArg",
    "TileSchedule",
    "Unary",
    "dtype_bytes",
    "local_bytes",
    "smem_bytes",
    "validate_schedule",
]


class SpecError(TesseraError, ValueError):
    """A kernel spec or tile schedule is malformed or cannot be built for the target."""


#: TVM dtype strings a spec may use, with their size in bytes.
DTYPES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "int32": 4,
}

#: Target kinds the generators accept (``c`` is the CPU path).
TARGET_KINDS = ("cuda", "hip", "c")


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype``."""
    return DTYPES[dtype]


class TensorArg(NamedTuple):
    """One PrimFunc parameter: its name, static shape and TVM dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------


def _fail(spec: str, message: str) -> SpecError:
    return SpecError(f"{spec}: {message}")


def _check_dtype(spec: str, field: str, dtype: Any) -> None:
    if dtype not in DTYPES:
        raise _fail(spec, f"{field} is {dtype!r}; expected one of {', '.join(DTYPES)}")


def _check_name(spec: str, field: str, name: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise _fail(spec, f"{field} is {name!r}; expected a C identifier (it becomes a kernel parameter name)")


def _check_dims(spec: str, field: str, dims: Any, *, allow_empty: bool = True) -> tuple[int, ...]:
    if isinstance(dims, int) and not isinstance(dims, bool):
        dims = (dims,)
    try:
        dims = tuple(dims)
    except TypeError:
        raise _fail(spec, f"{field} is {dims!r}; expected a tuple of positive ints") from None
    if not allow_empty and not dims:
        raise _fail(spec, f"{field} is (); expected at least one dimension")
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
            raise _fail(spec, f"{field} is {dims!r}; every dimension must be a positive int, found {d!r}")
    return dims


def _check_positive(spec: str, field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _fail(spec, f"{field} is {value!r}; expected a positive int")


def _norm_axis(spec: str, axis: int, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int) or not -ndim <= axis < ndim:
        raise _fail(spec, f"axis is {axis!r}; expected an int in [{-ndim}, {ndim - 1}] for a rank-{ndim} tensor")
    return axis % ndim


def _fingerprint(obj: Any) -> str:
    import hashlib

    return hashlib.sha256(repr(obj).encode()).hexdigest()[:16]


def _set(obj: Any, field: str, value: Any) -> None:
    object.__setattr__(obj, field, value)


def _broadcasts_to(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    """numpy broadcasting: ``src`` aligned right against ``dst``, each dim equal or 1."""
    if len(src) > len(dst):
        return False
    return all(s in (1, d) for s, d in zip(reversed(src), reversed(dst), strict=False))


# ---------------------------------------------------------------------------------------------
# Expressions (element-wise kernels)
# ---------------------------------------------------------------------------------------------

UNARY_OPS = (
    "exp",
    "tanh",
    "relu",
    "gelu_erf",
    "gelu_tanh",
    "silu",
    "sigmoid",
    "neg",
    "sqrt",
    "rsqrt",
    "abs",
    "log",
    "cast",
)
BINARY_OPS = ("add", "sub", "mul", "div", "max", "min", "pow")


@dataclass(frozen=True)
class Input:
    """The value of input ``name`` at the current element (broadcast to the output shape)."""

    name: str


@dataclass(frozen=True)
class Const:
    """A scalar constant."""

    value: float


@dataclass(frozen=True)
class Unary:
    """``op(x)``; ``cast`` rounds to ``dtype`` (then computation continues in the compute dtype)."""

    op: str
    x: Expr
    dtype: str | None = None

    def __post_init__(self) -> None:
        if self.op not in UNARY_OPS:
            raise SpecError(f"Unary: op is {self.op!r}; expected one of {', '.join(UNARY_OPS)}")
        if self.op == "cast":
            _check_dtype("Unary(cast)", "dtype", self.dtype)


@dataclass(frozen=True)
class Binary:
    """``op(x, y)``."""

    op: str
    x: Expr
    y: Expr

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise SpecError(f"Binary: op is {self.op!r}; expected one of {', '.join(BINARY_OPS)}")


Expr = Input | Const | Unary | Binary


def expr_nodes(expr: Expr) -> Iterator[Expr]:
    """Every node of ``expr``, parents before children."""
    yield expr
    if isinstance(expr, Unary):
        yield from expr_nodes(expr.x)
    elif isinstance(expr, Binary):
        yield from expr_nodes(expr.x)
        yield from expr_nodes(expr.y)


def expr_text(expr: Expr) -> str:
    """A readable one-line form of ``expr`` (for schedule/tile dumps)."""
    if isinstance(expr, Input):
        return expr.name
    if isinstance(expr, Const):
        return repr(expr.value)
    if isinstance(expr, Unary):
        return f"cast<{expr.dtype}>({expr_text(expr.x)})" if expr.op == "cast" else f"{expr.op}({expr_text(expr.x)})"
    return f"{expr.op}({expr_text(expr.x)}, {expr_text(expr.y)})"


# ---------------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------------

EPILOGUE_KINDS = (
    "bias",
    "residual",
    "scale",
    "add_scalar",
    "relu",
    "gelu_erf",
    "gelu_tanh",
    "silu",
    "tanh",
    "exp",
    "sigmoid",
    "cast",
)


@dataclass(frozen=True)
class EpilogueOp:
    """One step applied, in order, to a GEMM's fp32 accumulator before it is stored.

    ``bias`` adds the per-column vector ``operand`` ([N]); ``residual`` adds ``operand`` of the
    output's shape; ``scale`` multiplies by ``value``; ``add_scalar`` adds ``value``; ``cast``
    rounds to ``dtype`` (e.g. to reproduce a graph that casts before an activation). ``dtype`` of a
    bias/residual operand defaults to the GEMM's ``dtype_out``.
    """

    kind: str
    operand: str | None = None
    value: float | None = None
    dtype: str | None = None

    def __post_init__(self) -> None:
        where = f"EpilogueOp({self.kind!r})"
        if self.kind not in EPILOGUE_KINDS:
            raise SpecError(f"{where}: kind is {self.kind!r}; expected one of {', '.join(EPILOGUE_KINDS)}")
        if self.kind in ("bias", "residual"):
            _check_name(where, "operand", self.operand)
        elif self.operand is not None:
            raise _fail(where, f"takes no operand, found operand={self.operand!r}")
        if self.kind in ("scale", "add_scalar"):
            if isinstance(self.value, bool) or not isinstance(self.value, int | float):
                raise _fail(where, f"needs a number value=..., found {self.value!r}")
        if self.kind == "cast" or (self.dtype is not None):
            _check_dtype(where, "dtype", self.dtype)


class KernelSpec:
    """Common interface of the specs: ``family``, ``inputs()``, ``outputs()``, ``params()``."""

    family: ClassVar[str]  # gemm, elementwise, reduce, softmax, norm or attention

    def inputs(self) -> list[TensorArg]:
        raise NotImplementedError

    def outputs(self) -> list[TensorArg]:
        raise NotImplementedError

    def params(self) -> list[TensorArg]:
        """The PrimFunc's parameters in order: inputs, then outputs."""
        return self.inputs() + self.outputs()

    def fingerprint(self) -> str:
        """A hash of the spec that is stable across processes (``hash()`` of a str is not)."""
        return _fingerprint(self)

    def _check_unique_names(self) -> None:
        names = [p.name for p in self.params()]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise _fail(type(self).__name__, f"parameter names must be distinct, {dup} appear(s) more than once")


@dataclass(frozen=True)
class GemmSpec(KernelSpec):
    """``out[*batch, M, N] = epilogue(A @ B)`` with fp32 (``dtype_acc``) accumulation.

    A is ``[*batch_a, M, K]`` (``[*batch_a, K, M]`` with ``transpose_a``), B is ``[*batch_b, K, N]``
    (``[*batch_b, N, K]`` with ``transpose_b``). ``batch_a``/``batch_b`` default to ``batch`` and
    may be any shape that broadcasts to it (numpy rules), e.g. ``batch_b=()`` for a shared weight.
    """

    family: ClassVar[str] = "gemm"
    M: int
    N: int
    K: int
    _: KW_ONLY
    batch: tuple[int, ...] = ()
    transpose_a: bool = False
    transpose_b: bool = False
    dtype_a: str = "float16"
    dtype_b: str | None = None  # None: dtype_a
    dtype_out: str | None = None  # None: dtype_a
    dtype_acc: str = "float32"
    epilogue: tuple[EpilogueOp, ...] = ()
    batch_a: tuple[int, ...] | None = None  # None: batch
    batch_b: tuple[int, ...] | None = None  # None: batch
    name_a: str = "A"
    name_b: str = "B"
    name_out: str = "C"

    def __post_init__(self) -> None:
        where = "GemmSpec"
        for f in ("M", "N", "K"):
            _check_positive(where, f, getattr(self, f))
        _set(self, "batch", _check_dims(where, "batch", self.batch))
        for f in ("batch_a", "batch_b"):
            value = getattr(self, f)
            value = self.batch if value is None else _check_dims(where, f, value)
            if not _broadcasts_to(value, self.batch):
                raise _fail(where, f"{f} {value} does not broadcast to batch {self.batch}")
            _set(self, f, value)
        _set(self, "dtype_b", self.dtype_b or self.dtype_a)
        _set(self, "dtype_out", self.dtype_out or self.dtype_a)
        for f in ("dtype_a", "dtype_b", "dtype_out", "dtype_acc"):
            _check_dtype(where, f, getattr(self, f))
        _set(self, "epilogue", tuple(self.epilogue))
        for op in self.epilogue:
            if not isinstance(op, EpilogueOp):
                raise _fail(where, f"epilogue holds {op!r}; expected EpilogueOp objects")
        for f in ("name_a", "name_b", "name_out"):
            _check_name(where, f, getattr(self, f))
        self._check_unique_names()

    @property
    def shape_a(self) -> tuple[int, ...]:
        return self.batch_a + ((self.K, self.M) if self.transpose_a else (self.M, self.K))

    @property
    def shape_b(self) -> tuple[int, ...]:
        return self.batch_b + ((self.N, self.K) if self.transpose_b else (self.K, self.N))

    @property
    def shape_out(self) -> tuple[int, ...]:
        return self.batch + (self.M, self.N)

    def epilogue_operands(self) -> list[TensorArg]:
        """Operands of bias/residual epilogue steps, in epilogue order (each name once)."""
        seen: dict[str, TensorArg] = {}
        for op in self.epilogue:
            if op.operand is None or op.operand in seen:
                continue
            shape = (self.N,) if op.kind == "bias" else self.shape_out
            seen[op.operand] = TensorArg(op.operand, shape, op.dtype or self.dtype_out)
        return list(seen.values())

    def inputs(self) -> list[TensorArg]:
        return [
            TensorArg(self.name_a, self.shape_a, self.dtype_a),
            TensorArg(self.name_b, self.shape_b, self.dtype_b),
            *self.epilogue_operands(),
        ]

    def outputs(self) -> list[TensorArg]:
        return [TensorArg(self.name_out, self.shape_out, self.dtype_out)]

    @property
    def flops(self) -> int:
        return 2 * math.prod(self.batch) * self.M * self.N * self.K


@dataclass(frozen=True)
class ElementwiseSpec(KernelSpec):
    """``out[shape] = expr(operands...)``; operands broadcast to ``shape`` with numpy rules.

    ``operands`` lists the inputs as ``(name, shape, dtype)`` (the PrimFunc's input order); ``expr``
    refers to them with ``Input(name)``. Each input is cast to ``dtype_compute`` when loaded, the
    expression is evaluated in ``dtype_compute`` and the result cast to ``dtype_out``.
    """

    family: ClassVar[str] = "elementwise"
    shape: tuple[int, ...]
    operands: tuple[TensorArg, ...]
    expr: Expr
    dtype_out: str = "float32"
    _: KW_ONLY
    dtype_compute: str = "float32"
    name_out: str = "out"

    def __post_init__(self) -> None:
        where = "ElementwiseSpec"
        _set(self, "shape", _check_dims(where, "shape", self.shape, allow_empty=False))
        ops = []
        for item in self.operands:
            try:
                name, shape, dtype = item
            except (TypeError, ValueError):
                raise _fail(where, f"operands holds {item!r}; expected (name, shape, dtype) triples") from None
            _check_name(where, "operand name", name)
            _check_dtype(where, f"dtype of {name}", dtype)
            shape = _check_dims(where, f"shape of {name}", shape, allow_empty=False)
            if not _broadcasts_to(shape, self.shape):
                raise _fail(where, f"operand {name} of shape {shape} does not broadcast to {self.shape}")
            ops.append(TensorArg(name, shape, dtype))
        _set(self, "operands", tuple(ops))
        _check_dtype(where, "dtype_out", self.dtype_out)
        _check_dtype(where, "dtype_compute", self.dtype_compute)
        _check_name(where, "name_out", self.name_out)
        known = {op.name for op in ops}
        for node in expr_nodes(self.expr):
            if not isinstance(node, Input | Const | Unary | Binary):
                raise _fail(where, f"expr holds {node!r}; expected Input/Const/Unary/Binary nodes")
            if isinstance(node, Input) and node.name not in known:
                raise _fail(where, f"expr reads Input({node.name!r}) but operands are {sorted(known)}")
        self._check_unique_names()

    def inputs(self) -> list[TensorArg]:
        return list(self.operands)

    def outputs(self) -> list[TensorArg]:
        return [TensorArg(self.name_out, self.shape, self.dtype_out)]


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


@dataclass(frozen=True)
class ReduceSpec(KernelSpec):
    """``out = kind(x, axis)`` for ``kind`` sum / max / mean, accumulated in fp32.

    ``axis`` is an int or a tuple of consecutive axes (e.g. ``(1, 2)``); reducing every axis
    without ``keepdims`` gives a ``(1,)`` output (kernels have no rank-0 buffers).
    """

    family: ClassVar[str] = "reduce"
    shape: tuple[int, ...]
    axis: int | tuple[int, ...]
    kind: str = "sum"
    keepdims: bool = False
    dtype_in: str = "float32"
    dtype_out: str | None = None  # None: dtype_in
    _: KW_ONLY
    name_in: str = "x"
    name_out: str = "out"

    REDUCE_KINDS: ClassVar[tuple[str, ...]] = ("sum", "max", "mean")

    def __post_init__(self) -> None:
        where = "ReduceSpec"
        _set(self, "shape", _check_dims(where, "shape", self.shape, allow_empty=False))
        axes = (self.axis,) if isinstance(self.axis, int) else tuple(self.axis)
        axes = tuple(sorted({_norm_axis(where, a, len(self.shape)) for a in axes}))
        if not axes:
            raise _fail(where, "axis is empty; expected at least one axis to reduce")
        if axes != tuple(range(axes[0], axes[-1] + 1)):
            raise _fail(
                where, f"axis {self.axis!r} is not a run of consecutive axes; transpose first (or reduce twice)"
            )
        _set(self, "axis", axes)
        if self.kind not in self.REDUCE_KINDS:
            raise _fail(where, f"kind is {self.kind!r}; expected one of {', '.join(self.REDUCE_KINDS)}")
        _set(self, "dtype_out", self.dtype_out or self.dtype_in)
        _check_dtype(where, "dtype_in", self.dtype_in)
        _check_dtype(where, "dtype_out", self.dtype_out)
        _check_name(where, "name_in", self.name_in)
        _check_name(where, "name_out", self.name_out)
        self._check_unique_names()

    @property
    def out_shape(self) -> tuple[int, ...]:
        return _reduced_shape(self.shape, self.axis, self.keepdims) or (1,)

    def inputs(self) -> list[TensorArg]:
        return [TensorArg(self.name_in, self.shape, self.dtype_in)]

    def outputs(self) -> list[TensorArg]:
        return [TensorArg(self.name_out, self.out_shape, self.dtype_out)]


@dataclass(frozen=True)
class SoftmaxSpec(KernelSpec):
    """``out = exp(x - max(x)) / sum(exp(x - max(x)))`` along ``axis`` (any axis), in fp32."""

    family: ClassVar[str] = "softmax"
    shape: tuple[int, ...]
    axis: int = -1
    dtype_in: str = "float32"
    dtype_out: str | None = None  # None: dtype_in
    _: KW_ONLY
    name_in: str = "x"
    name_out: str = "out"

    def __post_init__(self) -> None:
        where = "SoftmaxSpec"
        _set(self, "shape", _check_dims(where, "shape", self.shape, allow_empty=False))
        _set(self, "axis", _norm_axis(where, self.axis, len(self.shape)))
        _set(self, "dtype_out", self.dtype_out or self.dtype_in)
        _check_dtype(where, "dtype_in", self.dtype_in)
        _check_dtype(where, "dtype_out", self.dtype_out)
        _check_name(where, "name_in", self.name_in)
        _check_name(where, "name_out", self.name_out)
        self._check_unique_names()

    def inputs(self) -> list[TensorArg]:
        return [TensorArg(self.name_in, self.shape, self.dtype_in)]

    def outputs(self) -> list[TensorArg]:
        return [TensorArg(self.name_out, self.shape, self.dtype_out)]


@dataclass(frozen=True)
class NormSpec(KernelSpec):
    """layer_norm / rms_norm over the last dimension, statistics in fp32.

    layer_norm: ``(x - mean) / sqrt(var + eps) * weight + bias`` (biased variance, as PyTorch);
    rms_norm: ``x / sqrt(mean(x^2) + eps) * weight (+ bias)``. ``weight`` and ``bias`` are
    ``[shape[-1]]`` vectors of ``dtype_weight`` (default ``dtype_in``).
    """

    family: ClassVar[str] = "norm"
    kind: str
    shape: tuple[int, ...]
    axis: int = -1
    eps: float = 1e-5
    has_weight: bool = True
    has_bias: bool = False
    dtype_in: str = "float32"
    dtype_out: str | None = None  # None: dtype_in
    _: KW_ONLY
    dtype_weight: str | None = None  # None: dtype_in
    name_in: str = "x"
    name_weight: str = "weight"
    name_bias: str = "bias"
    name_out: str = "out"

    NORM_KINDS: ClassVar[tuple[str, ...]] = ("layer_norm", "rms_norm")

    def __post_init__(self) -> None:
        where = "NormSpec"
        if self.kind not in self.NORM_KINDS:
            raise _fail(where, f"kind is {self.kind!r}; expected one of {', '.join(self.NORM_KINDS)}")
        _set(self, "shape", _check_dims(where, "shape", self.shape, allow_empty=False))
        axis = _norm_axis(where, self.axis, len(self.shape))
        if axis != len(self.shape) - 1:
            raise _fail(
                where,
                f"axis is {self.axis}; only the last axis ({len(self.shape) - 1} or -1) is "
                "normalised (move the axis last first)",
            )
        _set(self, "axis", axis)
        if isinstance(self.eps, bool) or not isinstance(self.eps, int | float) or self.eps < 0:
            raise _fail(where, f"eps is {self.eps!r}; expected a non-negative float")
        _set(self, "dtype_out", self.dtype_out or self.dtype_in)
        _set(self, "dtype_weight", self.dtype_weight or self.dtype_in)
        for f in ("dtype_in", "dtype_out", "dtype_weight"):
            _check_dtype(where, f, getattr(self, f))
        for f in ("name_in", "name_weight", "name_bias", "name_out"):
            _check_name(where, f, getattr(self, f))
        self._check_unique_names()

    def inputs(self) -> list[TensorArg]:
        n = self.shape[-1]
        args = [TensorArg(self.name_in, self.shape, self.dtype_in)]
        if self.has_weight:
            args.append(TensorArg(self.name_weight, (n,), self.dtype_weight))
        if self.has_bias:
            args.append(TensorArg(self.name_bias, (n,), self.dtype_weight))
        return args

    def outputs(self) -> list[TensorArg]:
        return [TensorArg(self.name_out, self.shape, self.dtype_out)]


@dataclass(frozen=True)
class AttentionSpec(KernelSpec):
    """Flash attention forward: ``O = softmax(scale * Q K^T + mask) V`` on ``[B, H, S, D]``.

    Q/O are ``[B, H, S_q, D]``, K/V ``[B, H_kv, S_kv, D]``; query head ``h`` reads kv head
    ``h // (H // H_kv)`` (grouped-query attention). ``scale`` defaults to ``1/sqrt(D)``. With
    ``causal``, query ``i`` sees keys ``j <= i + offset`` where offset is 0 for ``causal_align=
    "top_left"`` (PyTorch ``is_causal``) and ``S_kv - S_q`` for ``"bottom_right"`` (flash-attn);
    a query that sees no key gets a zero output row. Online softmax with fp32 running max and sum.
    """

    family: ClassVar[str] = "attention"
    B: int
    H: int
    H_kv: int
    S_q: int
    S_kv: int
    D: int
    causal: bool = False
    scale: float | None = None  # None: 1/sqrt(D)
    dtype_in: str = "float16"
    dtype_out: str | None = None  # None: dtype_in
    _: KW_ONLY
    causal_align: str = "top_left"
    name_q: str = "Q"
    name_k: str = "K"
    name_v: str = "V"
    name_out: str = "O"

    def __post_init__(self) -> None:
        where = "AttentionSpec"
        for f in ("B", "H", "H_kv", "S_q", "S_kv", "D"):
            _check_positive(where, f, getattr(self, f))
        if self.H % self.H_kv:
            raise _fail(
                where,
                f"H={self.H} is not a multiple of H_kv={self.H_kv}; grouped-query attention "
                "needs every kv head shared by the same number of query heads",
            )
        if self.scale is None:
            _set(self, "scale", 1.0 / math.sqrt(self.D))
        if isinstance(self.scale, bool) or not isinstance(self.scale, int | float):
            raise _fail(where, f"scale is {self.scale!r}; expected a float")
        _set(self, "scale", float(self.scale))
        if self.causal_align not in ("top_left", "bottom_right"):
            raise _fail(where, f"causal_align is {self.causal_align!r}; expected 'top_left' or 'bottom_right'")
        _set(self, "dtype_out", self.dtype_out or self.dtype_in)
        _check_dtype(where, "dtype_in", self.dtype_in)
        _check_dtype(where, "dtype_out", self.dtype_out)
        for f in ("name_q", "name_k", "name_v", "name_out"):
            _check_name(where, f, getattr(self, f))
        self._check_unique_names()

    @property
    def groups(self) -> int:
        """Query heads per kv head."""
        return self.H // self.H_kv

    @property
    def causal_offset(self) -> int:
        """Query ``i`` sees keys ``j <= i + causal_offset`` (when causal)."""
        return self.S_kv - self.S_q if self.causal_align == "bottom_right" else 0

    def inputs(self) -> list[TensorArg]:
        q = (self.B, self.H, self.S_q, self.D)
        kv = (self.B, self.H_kv, self.S_kv, self.D)
        return [
            TensorArg(self.name_q, q, self.dtype_in),
            TensorArg(self.name_k, kv, self.dtype_in),
            TensorArg(self.name_v, kv, self.dtype_in),
        ]

    def outputs(self) -> list[TensorArg]:
        return [TensorArg(self.name_out, (self.B, self.H, self.S_q, self.D), self.dtype_out)]


SPEC_FAMILIES = ("gemm", "elementwise", "reduce", "softmax", "norm", "attention")


# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TileSchedule:
    """How a spec is tiled. What each field means per kernel kind:

    - gemm: an output tile of ``block_m x block_n``, a K step of ``block_k``, ``stages`` buffers in the
      pipelined K loop, ``threads`` per block, ``rasterize`` (L2 swizzle panel width, 0 = off).
    - attention: ``block_m`` query rows per block, ``block_n`` keys per step; ``stages`` K/V buffers.
    - softmax / norm / reduce: ``block_m`` rows per block, ``block_n`` columns per step along the
      reduced axis.
    - elementwise: a ``block_m x block_n`` tile of the output viewed as [rows, last dim].

    On the CPU target (``c``) the blocks run in parallel over the cores (one OpenMP region), a block's
    body is serial code; ``threads`` and ``stages`` are ignored.
    """

    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    stages: int = 2
    threads: int = 128
    rasterize: int = 0
    mma: tuple[int, int, int] | None = None  # the target's MMA instruction shape (informational)

    def __post_init__(self) -> None:
        for f in ("block_m", "block_n", "block_k", "stages", "threads"):
            _check_positive("TileSchedule", f, getattr(self, f))
        if isinstance(self.rasterize, bool) or not isinstance(self.rasterize, int) or self.rasterize < 0:
            raise _fail("TileSchedule", f"rasterize is {self.rasterize!r}; expected an int >= 0 (0 = off)")
        if self.mma is not None:
            _set(self, "mma", tuple(int(x) for x in self.mma))

    def replace(self, **changes: Any) -> TileSchedule:
        """A copy with ``changes`` (e.g. a user override)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            names = ", ".join(f.name for f in dataclasses.fields(self))
            raise _fail("TileSchedule", f"unknown field(s) {unknown}; fields are {names}")
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain values (JSON-serialisable); ``TileSchedule(**d)`` rebuilds it."""
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """A hash of the schedule that is stable across processes."""
        return _fingerprint(self)

    @classmethod
    def from_config(cls, config: Any, kind: str | KernelSpec = "gemm") -> TileSchedule:
        """Defaults for ``kind`` (a spec family name or a spec) on ``config`` (a TargetConfig or its name).

        GEMMs take the config's ``schedule:`` section as is; other kinds derive theirs from it (a
        config may also hold a per-kind mapping, e.g. ``schedule: {attention: {block_m: 64}}``).
        With a spec, blocks larger than the problem are shrunk (a 1 x 8 softmax gets no 64-row block).
        """
        from ..config import load_config

        config = load_config(config)
        spec = kind if isinstance(kind, KernelSpec) else None
        kind = spec.family if spec is not None else kind
        if kind not in SPEC_FAMILIES:
            raise _fail("TileSchedule.from_config", f"kind is {kind!r}; expected one of {', '.join(SPEC_FAMILIES)}")
        raw = dict(config.schedule)
        per_kind = {k: dict(v) for k, v in raw.items() if k in SPEC_FAMILIES}
        base = {k: v for k, v in raw.items() if k not in SPEC_FAMILIES and k in _FIELDS}
        target_kind = config.target_kind
        values = {**_kind_defaults(kind, target_kind, base), **per_kind.get(kind, {})}
        schedule = cls(**{k: v for k, v in values.items() if k in _FIELDS})
        if spec is None:
            return schedule
        schedule = fit_schedule(spec, schedule, target_kind)
        if _dynamic_pipeline_unsupported(spec, config):
            schedule = schedule.replace(stages=1)
        return _fit_shared_memory(spec, schedule, config)


_FIELDS = {f.name for f in dataclasses.fields(TileSchedule)}


def _kind_defaults(kind: str, target_kind: str, base: dict[str, Any]) -> dict[str, Any]:
    """Per-kind defaults derived from the config's GEMM defaults."""
    gpu = target_kind != "c"
    if kind == "gemm":
        return base
    if kind == "attention":
        # 64 query rows x 64 keys per step keep S, P and O in registers for D <= 128 on every GPU.
        return (
            {**base, "block_m": 64, "block_n": 64, "stages": min(base.get("stages", 2), 2), "threads": 128}
            if gpu
            # CPU: 192 queries (6 x the micro-kernel's 32 columns in S^T = K Q^T; every query block
            # reads all of K and V, so fewer blocks read them less: +15% at S=2048 over 96), 112 keys
            # (8 x its 14 rows).
            else {**base, "block_m": 192, "block_n": 112}
        )
    if kind in ("softmax", "norm", "reduce"):
        # A few rows per block, a wide step along the reduced axis (coalesced loads on GPU).
        return {**base, "block_m": 4, "block_n": 256, "threads": 128} if gpu else {**base, "block_m": 8, "block_n": 256}
    return {**base, "block_m": 16, "block_n": 128, "threads": 128} if gpu else {**base, "block_m": 16, "block_n": 256}


#: A CPU GEMM smaller than this (multiply-adds) runs in fewer blocks than cores rather than pay for
#: waking threads (~10 us each) to share a few microseconds of work.
CPU_GEMM_SPREAD_MIN_WORK = 1 << 22


def _spread_cpu_gemm(spec: GemmSpec, block_m: int, block_n: int) -> tuple[int, int]:
    """CPU GEMM blocks that give every core work: at least as many blocks as cores (when the GEMM is
    large enough), and blocks of nearly equal size (1024 rows in 224-row blocks: 5 blocks of 210, not
    4 of 224 and one of 128), rounded to the micro-kernel's register tile."""
    from .gemm import CPU_MICRO_TILE

    tile_m, tile_n = CPU_MICRO_TILE
    batch = math.prod(spec.batch)
    rows, cols = math.ceil(spec.M / block_m), math.ceil(spec.N / block_n)
    if spec.M * spec.N * spec.K * batch >= CPU_GEMM_SPREAD_MIN_WORK:
        cores = os.cpu_count() or 1
        while rows * cols * batch < cores:
            can_rows, can_cols = spec.M >= (rows + 1) * tile_m, spec.N >= (cols + 1) * tile_n
            if can_rows and (not can_cols or spec.M / rows / tile_m >= spec.N / cols / tile_n):
                rows += 1
            elif can_cols:
                cols += 1
            else:
                break
    even_m = _round_up(math.ceil(spec.M / rows), tile_m)
    even_n = _round_up(math.ceil(spec.N / cols), tile_n)
    return min(block_m, even_m) if rows > 1 else block_m, min(block_n, even_n) if cols > 1 else block_n


def _spread_cpu_attention(spec: AttentionSpec, block_m: int) -> int:
    """CPU attention query blocks that give every core a block where the queries allow (smaller
    blocks, in multiples of the micro-kernel's 32 columns, until the (query block, head, batch) grid
    has as many blocks as cores), then evened out (for 8 cores, 1000 queries: 8 blocks of 128 (the last
    104), where 192-query blocks would leave two cores idle)."""
    from .gemm import CPU_MICRO_TILE

    tile = CPU_MICRO_TILE[1]
    heads = spec.B * spec.H
    cores = os.cpu_count() or 1
    while math.ceil(spec.S_q / block_m) * heads < cores and block_m > tile:
        block_m = max(tile, (block_m - 1) // tile * tile)
    blocks = math.ceil(spec.S_q / block_m)
    return min(block_m, _round_up(math.ceil(spec.S_q / blocks), tile)) if blocks > 1 else block_m


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, 1 << max(0, (n - 1).bit_length()))


def fit_schedule(spec: KernelSpec, schedule: TileSchedule, target_kind: str) -> TileSchedule:
    """Shrink blocks that are larger than the problem, keeping what the GPU's MMA needs.

    On GPUs a GEMM block keeps at least one 16 x 16 MMA tile per warp, and an attention block
    at least 16 query rows per warp (each warp owns whole rows of the scores); Hopper's wgmma
    keeps 64-row blocks.
    """
    gpu = target_kind != "c"
    warps = max(1, schedule.threads // 32)
    wgmma = gpu and target_kind == "cuda" and schedule.mma is not None and schedule.mma[0] == 64
    changes: dict[str, int] = {}
    if isinstance(spec, GemmSpec):
        floor = 16 if gpu else 1
        block_m = min(schedule.block_m, _pow2_at_least(spec.M, floor))
        block_n = min(schedule.block_n, _pow2_at_least(spec.N, floor))
        if wgmma:
            block_m = max(block_m, 64)
        while gpu and block_m * block_n < warps * 16 * 16:
            if block_n <= block_m:
                block_n *= 2
            else:
                block_m *= 2
        if not gpu:
            block_m, block_n = _spread_cpu_gemm(spec, block_m, block_n)
        changes.update(block_m=block_m, block_n=block_n, block_k=min(schedule.block_k, _pow2_at_least(spec.K, floor)))
    elif isinstance(spec, AttentionSpec):
        floor = 16 if gpu else 1
        block_m = min(schedule.block_m, _pow2_at_least(spec.S_q, floor))
        if gpu:
            block_m = max(block_m, 16 * warps, 64 if wgmma else 16)
        else:
            block_m = _spread_cpu_attention(spec, block_m)
        changes.update(block_m=block_m, block_n=min(schedule.block_n, _pow2_at_least(spec.S_kv, floor)))
    elif isinstance(spec, SoftmaxSpec | NormSpec | ReduceSpec):
        rows, cols = _rows_cols(spec)
        changes["block_m"] = min(schedule.block_m, _pow2_at_least(rows, 1))
        changes["block_n"] = min(schedule.block_n, _pow2_at_least(cols, 32 if gpu else 1))
    elif isinstance(spec, ElementwiseSpec):
        changes["block_n"] = min(schedule.block_n, _pow2_at_least(spec.shape[-1], 32 if gpu else 1))
        rows = math.prod(spec.shape[:-1])
        changes["block_m"] = min(schedule.block_m, _pow2_at_least(rows, 1))
    return schedule.replace(**changes) if changes else schedule


def _dynamic_pipeline_unsupported(spec: KernelSpec, config: Any) -> bool:
    """Causal attention's key loop has a per-block trip count; TileLang 0.1.15's cp.async pipeline
    then emits a non-constant ``cp.async.wait_group`` that the CUDA codegen rejects. Hopper's
    warp-specialised TMA pipeline and ROCm handle it."""
    return (
        isinstance(spec, AttentionSpec)
        and spec.causal
        and config.target_kind == "cuda"
        and not config.feature("warp_specialization")
    )


def _fit_shared_memory(spec: KernelSpec, schedule: TileSchedule, config: Any) -> TileSchedule:
    """Fewer stages, then smaller K/key steps, until the schedule fits the config's shared memory."""
    limit = config.resource_limits.get("shared_memory_per_block")
    target_kind = config.target_kind
    if limit is None or target_kind == "c":
        return schedule
    while smem_bytes(spec, schedule, target_kind) > limit:
        if schedule.stages > 1:
            schedule = schedule.replace(stages=schedule.stages - 1)
        elif isinstance(spec, GemmSpec) and schedule.block_k > 16:
            schedule = schedule.replace(block_k=schedule.block_k // 2)
        elif isinstance(spec, AttentionSpec) and schedule.block_n > 16:
            schedule = schedule.replace(block_n=schedule.block_n // 2)
        elif schedule.block_m > 16:
            schedule = schedule.replace(block_m=schedule.block_m // 2)
        else:
            break
    return schedule


def _rows_cols(spec: KernelSpec) -> tuple[int, int]:
    """(independent rows, reduced length) of a reduction-like spec."""
    if isinstance(spec, NormSpec):
        return math.prod(spec.shape[:-1]), spec.shape[-1]
    if isinstance(spec, SoftmaxSpec):
        return math.prod(spec.shape) // spec.shape[spec.axis], spec.shape[spec.axis]
    if isinstance(spec, ReduceSpec):
        reduced = math.prod(spec.shape[a] for a in spec.axis)
        return math.prod(spec.shape) // reduced, reduced
    raise TypeError(spec)


# ---------------------------------------------------------------------------------------------
# Resource estimates
# ---------------------------------------------------------------------------------------------


def smem_bytes(spec: KernelSpec, schedule: TileSchedule, target_kind: str = "cuda") -> int:
    """Shared memory (bytes per block) the generated kernel allocates, estimated before lowering.

    Counts the tiles the generator places in shared memory times the pipeline stages, plus the
    reduction workspace TileLang adds for cross-thread reductions. The CPU target (``c``) has no
    shared memory and returns 0 (see :func:`local_bytes`).
    """
    if target_kind == "c":
        return 0
    s = schedule
    if isinstance(spec, GemmSpec):
        return s.stages * (
            s.block_m * s.block_k * dtype_bytes(spec.dtype_a) + s.block_k * s.block_n * dtype_bytes(spec.dtype_b)
        )
    if isinstance(spec, AttentionSpec):
        size = dtype_bytes(spec.dtype_in)
        probs = s.block_m * s.block_n * 4 if spec.dtype_in == "float32" else 0  # fp32 P is staged in smem
        return s.block_m * spec.D * size + s.stages * 2 * s.block_n * spec.D * size + probs  # Q + stages x (K + V)
    if isinstance(spec, SoftmaxSpec | NormSpec | ReduceSpec):
        # Cross-thread all-reduce workspace: one fp32 per thread for each reduction in flight.
        return 2 * 4 * s.threads
    return 0


def local_bytes(spec: KernelSpec, schedule: TileSchedule, target_kind: str = "c") -> int:
    """Bytes of local (stack) arrays one CPU block allocates; compare with ``local_memory_per_kernel``."""
    s = schedule
    if isinstance(spec, GemmSpec):
        from .gemm import cpu_gemm_packs, cpu_pack_elements  # the packed A/B panels of the micro-kernel

        packed = sum(cpu_pack_elements(s.block_m, s.block_n, s.block_k)) * 4 if cpu_gemm_packs(spec) else 0
        return s.block_m * s.block_n * dtype_bytes(spec.dtype_acc) + packed
    if isinstance(spec, AttentionSpec):
        from .gemm import cpu_pack_elements, cpu_pack_suffix  # packed K, Q^T, P and V panels

        packed = 0
        if cpu_pack_suffix(spec.dtype_in) is not None:
            packed = sum(cpu_pack_elements(s.block_n, s.block_m, spec.D)) + sum(
                cpu_pack_elements(s.block_m, spec.D, s.block_n)
            )
        return 4 * (s.block_m * spec.D + s.block_m * s.block_n + 4 * s.block_m + packed)
    if isinstance(spec, SoftmaxSpec | NormSpec | ReduceSpec):
        from .common import CPU_LANES

        return 4 * (CPU_LANES + 2)
    return 0


def validate_schedule(spec: KernelSpec, schedule: TileSchedule, config: Any) -> None:
    """Raise if ``schedule`` cannot be built for ``spec`` on ``config`` (before any lowering).

    Checks the thread count, MMA-compatible block sizes on GPUs, shared memory against
    ``resources.shared_memory_per_block`` and CPU local arrays against ``local_memory_per_kernel``.
    """
    from ..config import load_config

    config = load_config(config)
    limits = config.resource_limits
    target_kind = config.target_kind
    name = f"{spec.family} kernel"
    s = schedule
    if target_kind != "c":
        max_threads = limits.get("threads_per_block")
        if max_threads and s.threads > max_threads:
            raise ResourceError(
                name, "threads per block", s.threads, max_threads, config.name, "lower schedule.threads"
            )
        if s.threads % 32:
            raise _fail(name, f"threads is {s.threads}; expected a multiple of 32 (whole warps)")
        if isinstance(spec, GemmSpec | AttentionSpec):
            warps = s.threads // 32
            if isinstance(spec, GemmSpec):
                fp8 = {"float8_e4m3fn", "float8_e5m2"}
                if spec.dtype_a != spec.dtype_b and not {spec.dtype_a, spec.dtype_b} <= fp8:
                    raise _fail(
                        name,
                        f"dtype_a is {spec.dtype_a} but dtype_b is {spec.dtype_b}; GPU MMA instructions "
                        "take one input dtype (fp8 e4m3 x e5m2 excepted): cast one operand first",
                    )
                k_step = 32 if dtype_bytes(spec.dtype_a) == 1 else 16
                if s.block_k % k_step:
                    raise _fail(
                        name,
                        f"block_k is {s.block_k}; the MMA instructions for {spec.dtype_a} need a multiple of {k_step}",
                    )
            if s.block_m % 16 or s.block_n % 16:
                raise _fail(
                    name,
                    f"block_m x block_n is {s.block_m} x {s.block_n}; the MMA tile needs multiples "
                    "of 16 (try 64 x 64 or 128 x 128)",
                )
            if isinstance(spec, AttentionSpec) and s.block_m % (16 * warps):
                raise _fail(
                    name,
                    f"block_m is {s.block_m}; attention gives each of the {warps} warps whole rows of 16, so "
                    f"block_m must be a multiple of {16 * warps} (or use fewer threads)",
                )
            if s.block_m * s.block_n < warps * 16 * 16:
                raise _fail(
                    name,
                    f"block_m x block_n = {s.block_m} x {s.block_n} is too small for {warps} warps "
                    f"(each warp needs a 16 x 16 MMA tile); lower threads or raise the block",
                )
            if target_kind == "cuda" and (s.mma or (0,))[0] == 64 and s.block_m % 64:
                raise _fail(name, f"block_m is {s.block_m}; Hopper wgmma needs a multiple of 64")
        if _dynamic_pipeline_unsupported(spec, config) and s.stages > 1:
            raise _fail(
                name,
                f"stages is {s.stages}; causal attention on {config.name!r} (cp.async pipeline, no warp "
                "specialisation) needs stages=1: TileLang 0.1.15 cannot pipeline its per-block key loop",
            )
        smem = smem_bytes(spec, s, target_kind)
        limit = limits.get("shared_memory_per_block")
        if limit is not None and smem > limit:
            raise ResourceError(
                name, "bytes of shared memory", smem, limit, config.name, "lower stages or block_m/block_n/block_k"
            )
    else:
        local = local_bytes(spec, s, target_kind)
        limit = limits.get("local_memory_per_kernel")
        if limit is not None and local > limit:
            raise ResourceError(name, "bytes of local arrays", local, limit, config.name, "lower block_m/block_n")
