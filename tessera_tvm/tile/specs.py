"""Kernel specs: what one fused device kernel computes, independent of how it is tiled.

The frontend maps each fused group of its graph onto one spec (``GemmSpec`` with its ``EpilogueOp``
steps, ``ElementwiseSpec``, ``ReduceSpec``, ``SoftmaxSpec``, ``NormSpec``, ``AttentionSpec``);
``build_tile_program(spec, schedule, codegen_kind)`` turns the spec into a TileLang PrimFunc. Every
spec is a frozen, hashable dataclass whose ``params()`` (= ``inputs() + outputs()``) is the
PrimFunc's parameter order, so a caller knows how to pass arrays. All arithmetic happens on an fp32
(``dtype_acc`` / ``dtype_compute``) value; inputs are cast up when loaded and results cast down when
stored:

    spec = GemmSpec(4096, 4096, 4096, dtype_a="float16", dtype_out="float16",
                    epilogue=(EpilogueOp("bias", operand="bias"), EpilogueOp("gelu_tanh")))
    spec.inputs()   # [TensorArg('A', (4096, 4096), 'float16'), TensorArg('B', ...), TensorArg('bias', (4096,), 'float16')]
    spec.outputs()  # [TensorArg('C', (4096, 4096), 'float16')]
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass
from typing import ClassVar

from .. import op_table
from .base import (
    SpecError,
    TensorArg,
    _broadcasts_to,
    _check_dims,
    _check_dtype,
    _check_name,
    _check_positive,
    _fail,
    _fingerprint,
    _norm_axis,
    _set,
    is_symbolic,
)
from .expr import Binary, Const, Expr, Input, Unary, expr_nodes
from .panels import PackedPanels

EPILOGUE_KINDS = (
    "bias",
    "residual",
    "gate",
    "scale",
    "add_scalar",
    "max_scalar",
    "min_scalar",
    *(op.name for op in op_table.epilogue_activations()),
    "cast",
)


#: Epilogue steps with a number ``value``.
SCALAR_KINDS = ("scale", "add_scalar", "max_scalar", "min_scalar")
#: Epilogue steps that read a tensor operand.
OPERAND_KINDS = ("bias", "residual", "gate")


@dataclass(frozen=True)
class EpilogueOp:
    """One step applied, in order, to a GEMM's fp32 accumulator before it is stored.

    ``bias`` adds the per-column vector ``operand`` ([N]); ``residual`` adds ``operand`` of the
    output's shape; ``gate`` multiplies by ``operand`` of the output's shape (SwiGLU's
    ``silu(x W1) * (x W3)``); ``scale`` multiplies by ``value``; ``add_scalar`` adds ``value``; ``max_scalar`` / ``min_scalar``
    bound it below / above by ``value`` (a clip, ReLU6, is the two of them); ``cast``
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
        if self.kind in OPERAND_KINDS:
            _check_name(where, "operand", self.operand)
        elif self.operand is not None:
            raise _fail(where, f"takes no operand, found operand={self.operand!r}")
        if self.kind in SCALAR_KINDS:
            # A scale may be +-inf: the graph's x / 0 (x * inf in IEEE: +-inf, NaN for 0 and NaN).
            number = not isinstance(self.value, bool) and isinstance(self.value, int | float)
            if not number or math.isnan(self.value) or (self.kind != "scale" and math.isinf(self.value)):
                raise _fail(where, f"needs a finite number value=... (scale: or +-inf), found {self.value!r}")
        if self.kind == "cast" or (self.dtype is not None):
            _check_dtype(where, "dtype", self.dtype)


def _checked_epilogue(where: str, epilogue) -> tuple[EpilogueOp, ...]:
    """``epilogue`` as a tuple, each step an EpilogueOp (a GEMM's or a convolution's)."""
    epilogue = tuple(epilogue)
    for op in epilogue:
        if not isinstance(op, EpilogueOp):
            raise _fail(where, f"epilogue holds {op!r}; expected EpilogueOp objects")
    return epilogue


def _epilogue_operands(epilogue, bias_shape: tuple, out_shape: tuple, dtype_out: str) -> list[TensorArg]:
    """The tensor operands ``epilogue`` reads, in order, each name once: a bias of ``bias_shape``,
    a residual or gate of ``out_shape``; each in its own dtype, else ``dtype_out``."""
    seen: dict[str, TensorArg] = {}
    for op in epilogue:
        if op.operand is None or op.operand in seen:
            continue
        shape = bias_shape if op.kind == "bias" else out_shape
        seen[op.operand] = TensorArg(op.operand, shape, op.dtype or dtype_out)
    return list(seen.values())


def _check_in_out(spec, where: str) -> None:
    """A one-input spec's ``dtype_in``, ``dtype_out`` (default: ``dtype_in``), ``name_in`` and
    ``name_out``."""
    _set(spec, "dtype_out", spec.dtype_out or spec.dtype_in)
    _check_dtype(where, "dtype_in", spec.dtype_in)
    _check_dtype(where, "dtype_out", spec.dtype_out)
    _check_name(where, "name_in", spec.name_in)
    _check_name(where, "name_out", spec.name_out)
    spec._check_unique_names()


def _check_image(spec, where: str, dims: tuple[str, ...], what: str, windows: tuple[tuple[str, int, int], ...]) -> None:
    """An NCHW op's fixed ``dims`` (positive ints; only the batch N may be symbolic, checked by the
    caller) and its window ``(field, length, lowest value)`` tuples of ints, stored as tuples."""
    for f in dims:
        value = getattr(spec, f)
        if is_symbolic(value):
            raise _fail(where, f"{f} is the symbolic dim {value}; {what} takes a symbolic batch N only")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _fail(where, f"{f} is {value!r}; expected a positive int")
    for f, size, low in windows:
        value = tuple(getattr(spec, f))
        if len(value) != size or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in value):
            raise _fail(where, f"{f} is {getattr(spec, f)!r}; expected {size} ints >= {low}")
        _set(spec, f, value)


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
    ``packed_b``: B comes packed ahead in the CPU micro-kernel's panels (a constant weight, packed when
    a Relax module is built: tile/panels.py), ``[*batch_b, packed_b.elements(N, K)]`` float32; its
    blocks must be the schedule's.
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
    packed_b: PackedPanels | None = None

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
        _set(self, "epilogue", _checked_epilogue(where, self.epilogue))
        for f in ("name_a", "name_b", "name_out"):
            _check_name(where, f, getattr(self, f))
        if self.packed_b is not None:
            if not isinstance(self.packed_b, PackedPanels):
                raise _fail(where, f"packed_b is {self.packed_b!r}; expected a PackedPanels or None")
            if self.dtype_b != "float32" or self.transpose_b or is_symbolic(self.N) or is_symbolic(self.K):
                raise _fail(
                    where,
                    "packed_b takes B as fp32 panels of a static N x K (dtype_b float32, transpose_b False); "
                    f"found dtype_b {self.dtype_b}, transpose_b {self.transpose_b}, N {self.N}, K {self.K}",
                )
        self._check_unique_names()

    @property
    def shape_a(self) -> tuple[int, ...]:
        return self.batch_a + ((self.K, self.M) if self.transpose_a else (self.M, self.K))

    @property
    def shape_b(self) -> tuple[int, ...]:
        if self.packed_b is not None:
            return (*self.batch_b, self.packed_b.elements(self.N, self.K))
        return self.batch_b + ((self.N, self.K) if self.transpose_b else (self.K, self.N))

    @property
    def shape_out(self) -> tuple[int, ...]:
        return self.batch + (self.M, self.N)

    def epilogue_operands(self) -> list[TensorArg]:
        """Operands of bias/residual/gate epilogue steps, in epilogue order (each name once)."""
        return _epilogue_operands(self.epilogue, (self.N,), self.shape_out, self.dtype_out)

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
    expression is evaluated in ``dtype_compute`` and the result cast to ``dtype_out``; integer values
    compute in int32 instead, each op's result wrapped to its dtype (tile/elementwise.py).
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

    REDUCE_KINDS: ClassVar[tuple[str, ...]] = tuple(op.kind for op in op_table.anchors("reduce"))

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
        _check_in_out(self, where)

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
        _check_in_out(self, where)

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

    NORM_KINDS: ClassVar[tuple[str, ...]] = tuple(op.kind for op in op_table.anchors("norm"))

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


def _clamp(index, extent):
    """``index`` kept below ``extent`` (a TIR min; unchanged for an extent of 1)."""
    from .._tvm import T

    return index if isinstance(extent, int) and extent == 1 else T.min(index, extent - 1)


@dataclass(frozen=True)
class AttentionSpec(KernelSpec):
    """Flash attention forward: ``O = softmax(scale * Q K^T + mask) V`` on ``[B, H, S, D]``.

    Q/O are ``[B, H, S_q, D]``, K/V ``[B, H_kv, S_kv, D]``; query head ``h`` reads kv head
    ``h // (H // H_kv)`` (grouped-query attention). ``scale`` defaults to ``1/sqrt(D)``. With
    ``causal``, query ``i`` sees keys ``j <= i + offset`` where offset is 0 for ``causal_align=
    "top_left"`` (PyTorch ``is_causal``) and ``S_kv - S_q`` for ``"bottom_right"`` (flash-attn);
    a query that sees no key gets a zero output row. Online softmax with fp32 running max and sum.

    ``bias`` (the shape of an additive score bias, Relax's attention ``bias`` and torch SDPA's float
    ``attn_mask``) is ``[B, H, S_q, S_kv]`` with any dim 1 where it is broadcast: a padding mask is
    ``[B, 1, 1, S_kv]``, ALiBi ``[1, H, S_q, S_kv]``. It is added after the scale, before the causal
    mask; ``-inf`` entries mask a key (a query whose keys are all masked gets a zero row).
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
    bias: tuple | None = None  # the bias's shape, [B|1, H|1, S_q|1, S_kv|1]; None: no bias
    dtype_bias: str | None = None  # None: dtype_in
    name_q: str = "Q"
    name_k: str = "K"
    name_v: str = "V"
    name_bias: str = "bias"
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
        if self.bias is not None:
            self._check_bias(where)
        for f in ("name_q", "name_k", "name_v", "name_bias", "name_out"):
            _check_name(where, f, getattr(self, f))
        self._check_unique_names()

    def _check_bias(self, where: str) -> None:
        full = (self.B, self.H, self.S_q, self.S_kv)
        bias = tuple(self.bias) if isinstance(self.bias, tuple | list) else None
        if bias is None or len(bias) != 4:
            raise _fail(where, f"bias is {self.bias!r}; expected the shape [B|1, H|1, S_q|1, S_kv|1]")
        for name, b, f in zip(("B", "H", "S_q", "S_kv"), bias, full, strict=True):
            same = b is f or (is_symbolic(b) and is_symbolic(f) and b.same_as(f))
            if not (same or (isinstance(b, int) and b in (1, f))):
                raise _fail(
                    where, f"bias {list(bias)} has {b} for {name}; expected {f} or 1 (a dim broadcast over {name})"
                )
        _set(self, "bias", bias)
        _set(self, "dtype_bias", self.dtype_bias or self.dtype_in)
        _check_dtype(where, "dtype_bias", self.dtype_bias)
        if not self.dtype_bias.startswith(("float", "bfloat")):
            raise _fail(where, f"bias dtype is {self.dtype_bias}; expected a float dtype (an additive bias)")

    def bias_index(self, batch, head, query, key, *, clamp: bool = True) -> tuple:
        """The bias element of score (batch, head, query, key): 0 on its broadcast dims; query and key
        clamped to the last row and column (a tile's edge lanes read in bounds, and are masked),
        unless the caller's loops stay in bounds (``clamp=False``)."""
        picks = (batch, head, _clamp(query, self.S_q), _clamp(key, self.S_kv)) if clamp else (batch, head, query, key)
        return tuple(0 if isinstance(b, int) and b == 1 else x for b, x in zip(self.bias, picks, strict=True))

    @property
    def groups(self) -> int:
        """Query heads per kv head."""
        return self.H // self.H_kv

    @property
    def causal_offset(self) -> int:
        """Query ``i`` sees keys ``j <= i + causal_offset`` (when causal)."""
        if self.causal_align != "bottom_right":
            return 0
        if is_symbolic(self.S_kv) and is_symbolic(self.S_q) and self.S_kv.same_as(self.S_q):
            return 0  # one symbolic length for queries and keys
        return self.S_kv - self.S_q  # a TIR expression when a length is symbolic

    def inputs(self) -> list[TensorArg]:
        q = (self.B, self.H, self.S_q, self.D)
        kv = (self.B, self.H_kv, self.S_kv, self.D)
        bias = [] if self.bias is None else [TensorArg(self.name_bias, self.bias, self.dtype_bias)]
        return [
            TensorArg(self.name_q, q, self.dtype_in),
            TensorArg(self.name_k, kv, self.dtype_in),
            TensorArg(self.name_v, kv, self.dtype_in),
            *bias,
        ]

    def outputs(self) -> list[TensorArg]:
        return [TensorArg(self.name_out, (self.B, self.H, self.S_q, self.D), self.dtype_out)]


@dataclass(frozen=True)
class Conv2dSpec(KernelSpec):
    """``Y[N, O, OH, OW] = epilogue(conv2d(X[N, C, H, W], W[O, C/groups, R, S]))``, NCHW / OIHW, fp32
    accumulation.

    Computed as the implicit GEMM ``[N*OH*OW, C*R*S] x [C*R*S, O]`` (one per group):
    :meth:`as_gemm` is that GEMM, which the schedule and resource estimates read. A depthwise
    convolution (one input channel per group) runs as a direct program instead (tile/conv.py).
    ``padding`` is (top, left, bottom, right).
    The epilogue takes GemmSpec's steps; a ``bias`` operand is ``[1, O, 1, 1]`` (how a Relax model
    adds a conv's bias), a residual or gate operand has the output's shape.
    """

    family: ClassVar[str] = "conv2d"
    N: int
    C: int
    H: int
    W: int
    O: int  # noqa: E741  (the output channels, as in OIHW)
    R: int
    S: int
    _: KW_ONLY
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    dtype_in: str = "float32"
    dtype_w: str | None = None  # None: dtype_in
    dtype_out: str | None = None  # None: dtype_in
    dtype_acc: str = "float32"
    epilogue: tuple[EpilogueOp, ...] = ()
    name_x: str = "X"
    name_w: str = "W"
    name_out: str = "Y"

    def __post_init__(self) -> None:
        where = "Conv2dSpec"
        _check_positive(where, "N", self.N)  # the batch may be symbolic (a Relax model's dynamic batch)
        windows = (("stride", 2, 1), ("padding", 4, 0), ("dilation", 2, 1))
        _check_image(self, where, ("C", "H", "W", "O", "R", "S"), "a convolution", windows)
        if isinstance(self.groups, bool) or not isinstance(self.groups, int) or self.groups <= 0:
            raise _fail(where, f"groups is {self.groups!r}; expected a positive int")
        if self.C % self.groups or self.O % self.groups:
            raise _fail(where, f"groups={self.groups} does not divide C={self.C} and O={self.O}")
        if self.OH <= 0 or self.OW <= 0:
            raise _fail(
                where,
                f"a {self.R}x{self.S} kernel (dilation {self.dilation}) does not fit the {self.H}x{self.W} "
                f"input padded by {self.padding}",
            )
        _set(self, "dtype_w", self.dtype_w or self.dtype_in)
        _set(self, "dtype_out", self.dtype_out or self.dtype_in)
        for f in ("dtype_in", "dtype_w", "dtype_out", "dtype_acc"):
            _check_dtype(where, f, getattr(self, f))
        _set(self, "epilogue", _checked_epilogue(where, self.epilogue))
        for f in ("name_x", "name_w", "name_out"):
            _check_name(where, f, getattr(self, f))
        self._check_unique_names()

    @property
    def OH(self) -> int:
        top, _, bottom, _ = self.padding
        return (self.H + top + bottom - self.dilation[0] * (self.R - 1) - 1) // self.stride[0] + 1

    @property
    def OW(self) -> int:
        _, left, _, right = self.padding
        return (self.W + left + right - self.dilation[1] * (self.S - 1) - 1) // self.stride[1] + 1

    @property
    def shape_out(self) -> tuple[int, ...]:
        return (self.N, self.O, self.OH, self.OW)

    @property
    def depthwise(self) -> bool:
        """One input channel per group (MobileNet's, ConvNeXt's): the direct program runs it."""
        return self.C == self.groups

    def as_gemm(self) -> GemmSpec:
        """One group's implicit GEMM: rows are output pixels, columns the group's output channels,
        depth its C/groups*R*S."""
        return GemmSpec(
            self.N * self.OH * self.OW,
            self.O // self.groups,
            self.C // self.groups * self.R * self.S,
            transpose_b=True,
            dtype_a=self.dtype_in,
            dtype_b=self.dtype_w,
            dtype_out=self.dtype_out,
            dtype_acc=self.dtype_acc,
        )

    def epilogue_operands(self) -> list[TensorArg]:
        """Operands of bias/residual/gate epilogue steps, in epilogue order (each name once)."""
        return _epilogue_operands(self.epilogue, (1, self.O, 1, 1), self.shape_out, self.dtype_out)

    def inputs(self) -> list[TensorArg]:
        return [
            TensorArg(self.name_x, (self.N, self.C, self.H, self.W), self.dtype_in),
            TensorArg(self.name_w, (self.O, self.C // self.groups, self.R, self.S), self.dtype_w),
            *self.epilogue_operands(),
        ]

    def outputs(self) -> list[TensorArg]:
        return [TensorArg(self.name_out, self.shape_out, self.dtype_out)]

    @property
    def flops(self) -> int:
        return 2 * self.N * self.OH * self.OW * self.O * self.C // self.groups * self.R * self.S


@dataclass(frozen=True)
class Pool2dSpec(KernelSpec):
    """``Y[N, C, OH, OW] = pool(X[N, C, H, W])`` over ``pool`` = (R, S) windows, NCHW, as torch's
    max_pool2d / avg_pool2d: ``kind`` "max" or "avg", ``padding`` (top, left, bottom, right),
    ``ceil_mode`` (a last, partial window when it starts inside the input or its left padding) and,
    for "avg", ``count_include_pad`` (divide by the window's size within the padded input, else by
    its elements inside the input). Computed in fp32."""

    family: ClassVar[str] = "pool2d"
    N: int
    C: int
    H: int
    W: int
    kind: str
    pool: tuple[int, int]
    _: KW_ONLY
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)
    ceil_mode: bool = False
    count_include_pad: bool = True
    dtype_in: str = "float32"
    dtype_out: str | None = None  # None: dtype_in
    name_in: str = "X"
    name_out: str = "Y"

    KINDS: ClassVar[tuple[str, ...]] = tuple(op.kind for op in op_table.anchors("pool2d"))

    def __post_init__(self) -> None:
        where = "Pool2dSpec"
        _check_positive(where, "N", self.N)  # the batch may be symbolic (a Relax model's dynamic batch)
        if self.kind not in self.KINDS:
            raise _fail(where, f"kind is {self.kind!r}; expected one of {', '.join(self.KINDS)}")
        windows = (("pool", 2, 1), ("stride", 2, 1), ("padding", 4, 0), ("dilation", 2, 1))
        _check_image(self, where, ("C", "H", "W"), "pooling", windows)
        if self.kind == "avg" and self.dilation != (1, 1):
            raise _fail(where, f"an average pool with dilation {self.dilation}; it takes dilation (1, 1)")
        top, left, bottom, right = self.padding
        if max(top, bottom) > self.pool[0] // 2 or max(left, right) > self.pool[1] // 2:
            raise _fail(where, f"padding {self.padding} is more than half the {self.pool[0]}x{self.pool[1]} window")
        if self.OH <= 0 or self.OW <= 0:
            raise _fail(
                where,
                f"a {self.pool[0]}x{self.pool[1]} window does not fit the {self.H}x{self.W} input padded by {self.padding}",
            )
        _set(self, "ceil_mode", bool(self.ceil_mode))
        _set(self, "count_include_pad", bool(self.count_include_pad))
        _check_in_out(self, where)

    def _out(self, size: int, before: int, after: int, window: int, stride: int, dilation: int) -> int:
        span = size + before + after - dilation * (window - 1) - 1
        if span < 0:
            return 0
        out = (-(-span // stride) if self.ceil_mode else span // stride) + 1
        if self.ceil_mode and (out - 1) * stride >= size + before:  # the last window starts in the padding
            out -= 1
        return out

    @property
    def OH(self) -> int:
        top, _, bottom, _ = self.padding
        return self._out(self.H, top, bottom, self.pool[0], self.stride[0], self.dilation[0])

    @property
    def OW(self) -> int:
        _, left, _, right = self.padding
        return self._out(self.W, left, right, self.pool[1], self.stride[1], self.dilation[1])

    @property
    def shape_out(self) -> tuple[int, ...]:
        return (self.N, self.C, self.OH, self.OW)

    def inputs(self) -> list[TensorArg]:
        return [TensorArg(self.name_in, (self.N, self.C, self.H, self.W), self.dtype_in)]

    def outputs(self) -> list[TensorArg]:
        return [TensorArg(self.name_out, self.shape_out, self.dtype_out)]


SPEC_FAMILIES = ("gemm", "elementwise", "reduce", "softmax", "norm", "attention", "conv2d", "pool2d")
