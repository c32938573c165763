"""Helpers the tile-program generators call from inside ``@T.prim_func`` bodies.

TileLang's builder runs the kernel body as Python, so these functions combine PrimExprs while the
kernel is traced: parameters declared from a spec, epilogue/expression math, numpy broadcasting and
index arithmetic. Everything here computes in the caller's accumulation dtype (fp32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace

from .. import op_table
from .._tvm import Builder, T, tvm
from .base import TensorArg, index_dtype

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
LOG2E = 1.4426950408889634


class KernelParams(SimpleNamespace):
    """A kernel's parameter buffers: ``.buffers`` in order, plus one attribute per role (``.x``, ``.out``).

    Kernels read their parameters from this object and never assign them to local variables:
    TileLang's builder renames a buffer after the variable it is assigned to, and the parameter
    names must stay the spec's.
    """


def declare_params(params: Sequence[TensorArg], roles: Sequence[str] = ()) -> KernelParams:
    """Declare the PrimFunc's tensor parameters in ``params`` order; call first in the kernel body.

    A spec's parameter list has a variable length (epilogue operands, optional weight/bias), which a
    Python ``def`` signature cannot express; the builder's ``arg`` is what a signature would call.
    ``roles`` names the buffers, in order, as attributes of the result.
    """
    builder = Builder.current()
    buffers = [builder.arg(p.name, T.Tensor(p.shape, p.dtype)) for p in params]
    io = KernelParams(buffers=buffers)
    for role, buf in zip(roles, buffers, strict=False):
        setattr(io, role, buf)
    return io


def to_compute(value, dtype: str):
    """``value`` as ``dtype`` (no-op when it already is)."""
    return value if str(value.dtype) == dtype else T.cast(value, dtype)


def round_to(value, dtype: str, compute: str):
    """Round ``value`` to ``dtype`` and continue in ``compute`` (a graph's explicit cast)."""
    return T.cast(T.cast(value, dtype), compute) if dtype != compute else value


def bfloat16_rounded(value):
    """float32 ``value`` rounded to the nearest bfloat16 (ties to even), as float32: its low 16 bits
    rounded away. NaN stays NaN (its payload could carry into the exponent)."""
    bits = T.reinterpret("uint32", value)
    half = T.bitwise_and(T.shift_right(bits, T.uint32(16)), T.uint32(1)) + T.uint32(0x7FFF)
    rounded = T.reinterpret("float32", T.bitwise_and(bits + half, T.uint32(0xFFFF0000)))
    return T.if_then_else(value != value, value, rounded)


def const(value: float, dtype: str):
    return T.cast(value, dtype) if not isinstance(value, int | float) else _imm(value, dtype)


def _imm(value: float, dtype: str):
    tirx = tvm.tirx
    if dtype.startswith("int"):
        return tirx.IntImm(dtype, int(value))
    return tirx.FloatImm(dtype, float(value))


def unary(op: str, x, dtype: str, cast_to: str | None = None, host: bool = False, propagate_nan: bool = True):
    """``op(x)`` for the element-wise/epilogue unary ops, evaluated in ``dtype``. ``relu`` keeps a NaN
    (:func:`nan_max`) unless ``propagate_nan`` is False: Tenstorrent's tensorizer matches ``T.max(x, 0)``
    as the SFPU's relu tile op, whose NaN behaviour is the hardware's.

    ``host``: a CPU tile program. Its fp32 exp, erf and tanh are tessera/cpu_math.h's inline
    functions, which g++ vectorises (libm's are opaque calls that keep the loop scalar: an erf GELU
    epilogue cost +65% over the bias alone, tanh +140%)."""
    one = _imm(1.0, dtype)
    fast = host and dtype == "float32"
    exp = cpu_exp if fast else T.exp
    tanh = (lambda v: T.call_pure_extern("float32", "tessera_tanhf", v)) if fast else T.tanh
    erf = (lambda v: T.call_pure_extern("float32", "tessera_erff", v)) if fast else T.erf
    if op == "relu":
        return nan_max(x, _imm(0.0, dtype)) if propagate_nan else T.max(x, _imm(0.0, dtype))
    if op == "gelu_erf":
        return _imm(0.5, dtype) * x * (one + erf(x * _imm(_SQRT_HALF, dtype)))
    if op == "gelu_tanh":
        inner = _imm(_SQRT_2_OVER_PI, dtype) * (x + _imm(0.044715, dtype) * x * x * x)
        if fast:  # 0.5 x (1 + tanh(u)) = x sigmoid(2u): one exp and one division, no tanh
            return x / (one + exp(_imm(-2.0, dtype) * inner))
        return _imm(0.5, dtype) * x * (one + tanh(inner))
    if op == "silu":
        return x / (one + exp(-x))
    beta = op_table.BY_NAME[op].swish_beta if op in op_table.BY_NAME else None
    if beta is not None:  # x sigmoid(beta x): quick GELU
        return x / (one + exp(_imm(-beta, dtype) * x))
    if op == "sigmoid":
        return one / (one + exp(-x))
    if op == "exp":
        return exp(x)
    if op == "tanh":
        return tanh(x)
    if op == "neg":
        return -x
    if op == "sqrt":
        return T.sqrt(x)
    if op == "rsqrt":
        return T.rsqrt(x)
    if op == "abs":
        return T.max(x, -x)  # T.abs lowers to tirx.fabs, which the C codegen cannot print
    if op == "log":
        return T.log(x)
    if op == "cast":
        return round_to(x, cast_to, dtype)
    raise ValueError(f"unknown unary op {op!r}")


def binary(op: str, x, y, propagate_nan: bool = True, host: bool = False):
    """``op(x, y)`` for the element-wise binary ops; ``max``/``min`` keep a NaN unless ``propagate_nan``
    is False (Tenstorrent, see :func:`unary`); ``host``: a CPU program (:func:`nan_max`)."""
    if not propagate_nan and op in ("max", "min"):
        return T.max(x, y) if op == "max" else T.min(x, y)
    if op == "add":
        return x + y
    if op == "sub":
        if propagate_nan and _is_float(x) and _same_value(x, y):
            return nan_or_zero(x)  # TVM folds x - x to 0
        return x - y
    if op == "mul":
        for a, b in ((x, y), (y, x)):
            if propagate_nan and isinstance(b, tvm.tirx.FloatImm) and b.value == 0 and _is_float(a):
                return nan_or_zero(a)  # TVM folds x * 0 to 0
        return x * y
    if op == "div":
        if isinstance(y, tvm.tirx.FloatImm) and y.value == 0:  # TVM refuses to fold x / 0: x * inf in IEEE
            return x * tvm.tirx.FloatImm(str(y.dtype), math.copysign(math.inf, y.value))
        return x / y
    if op == "max":
        return nan_max(x, y, host)
    if op == "min":
        return nan_min(x, y, host)
    if op == "pow":
        return T.pow(x, y)
    raise ValueError(f"unknown binary op {op!r}")


def nan_or_zero(x):
    """What ``x - x`` and ``x * 0`` are in IEEE arithmetic: 0 where ``x`` is finite, NaN where it is NaN
    or infinite. TVM folds both to a plain 0 (its arithmetic rules are the integers'), so a kernel
    built from them would turn a NaN or an infinity into 0 where torch gives NaN."""
    tirx = tvm.tirx
    return T.if_then_else(T.isfinite(x), tirx.FloatImm(str(x.dtype), 0.0), tirx.FloatImm(str(x.dtype), math.nan))


def _same_value(x, y) -> bool:
    """Whether ``x`` and ``y`` are one value: structurally equal and reading the same buffers
    (``structural_equal`` alone takes ``A[i]`` and ``B[i]`` of two like buffers for equal)."""
    if not tvm.ir.structural_equal(x, y):
        return False

    def buffers(expr) -> list:
        found: list = []
        tvm.tirx.stmt_functor.post_order_visit(
            tvm.tirx.Evaluate(expr),
            lambda node: found.append(node.buffer) if isinstance(node, tvm.tirx.BufferLoad) else None,
        )
        return found

    return all(a.same_as(b) for a, b in zip(buffers(x), buffers(y), strict=True))


def _is_float(x) -> bool:
    return str(x.dtype).startswith(("float", "bfloat"))


def nan_max(x, y, host: bool = False):
    """``max(x, y)``, NaN where either is NaN, as torch.maximum and numpy.maximum (and so relu, clamp
    and max reductions). ``T.max`` is C's ``x > y ? x : y`` and CUDA's ``fmaxf``, which drop a NaN.

    Against a constant: one compare and select, ``x < c ? c : x`` (one vector max on x86). Between
    two values: ``isnan(x) ? x : (y < x ? x : y)`` (``T.isnan``: TVM's simplifier folds a literal
    ``x != x`` to false); ``host`` (a CPU program, fp32) calls tessera/cpu_math.h's inline
    ``tessera_nan_maxf`` instead, whose arguments are read before the selects: a select whose arms
    load memory is a masked load or a gather for g++'s vectoriser (a max over rows ran 5x slower).
    Integers take ``T.max``."""
    return _nan_select(x, y, lambda a, b: b < a, T.max, "tessera_nan_maxf" if host else None)


def nan_min(x, y, host: bool = False):
    """``min(x, y)``, NaN where either is NaN (torch.minimum); see :func:`nan_max`."""
    return _nan_select(x, y, lambda a, b: a < b, T.min, "tessera_nan_minf" if host else None)


def _nan_select(x, y, x_wins, integer_op, host_function):
    tirx = tvm.tirx
    if not _is_float(x):
        return integer_op(x, y)
    # T.if_then_else, not tirx.Select: TVM's simplifier rewrites select(c, 0, x) - x into
    # select(c, -x, 0), folding the NaN arm's x - x to 0 (relu(x) - x was 0 for a NaN).
    if isinstance(y, tirx.FloatImm):  # a constant bound: only x can be NaN; x wins unless y does
        return T.if_then_else(x_wins(y, x), y, x)
    if host_function is not None and str(x.dtype) == "float32":
        return T.call_pure_extern("float32", host_function, x, y)
    return T.if_then_else(T.isnan(x), x, T.if_then_else(x_wins(x, y), x, y))


def unravel(flat, shape: Sequence[int]) -> list:
    """Coordinates of row-major index ``flat`` in ``shape`` (size-1 dims give 0). A dim may be
    symbolic (tile/base.py ``is_symbolic``); the outermost dim that is not 1 takes no modulo."""
    coords: list = []
    for i, dim in enumerate(shape):
        if _is_one(dim):
            coords.append(0)
            continue
        stride = math.prod(shape[i + 1 :])
        quotient = flat if isinstance(stride, int) and stride == 1 else flat // stride
        outermost = all(_is_one(d) for d in shape[:i])
        coords.append(quotient if outermost else quotient % dim)
    return coords


def _is_one(dim) -> bool:
    return isinstance(dim, int) and dim == 1


def broadcast_coords(coords: Sequence, in_shape: Sequence[int], out_shape: Sequence[int]) -> list:
    """numpy broadcasting: the input coordinates that feed output ``coords``."""
    lead = len(out_shape) - len(in_shape)
    return [0 if _is_one(size) else coords[lead + i] for i, size in enumerate(in_shape)]


def guard(cond, value, otherwise):
    """``value`` where ``cond`` holds, else ``otherwise`` (``value`` is not read outside ``cond``)."""
    if cond is True:
        return value
    return T.if_then_else(cond, value, otherwise)


def all_of(*conds):
    """Conjunction that drops statically-true terms (returns True when none is left)."""
    live = [c for c in conds if c is not True]
    if not live:
        return True
    return tvm.tirx.all(*live)


def cpu_exp(x):
    """``exp(x)`` (fp32) through tessera/cpu_math.h's inline ``tessera_expf``, which g++ vectorises;
    libm's ``expf`` is an opaque call that keeps a loop scalar. CPU tile programs only."""
    return T.call_pure_extern("float32", "tessera_expf", x)


def cpu_exp_nonpositive(x):
    """``exp(x)`` for ``x <= 0`` (a softmax's exponent: a score minus its row's max; -inf gives 0)
    through tessera/cpu_math.h's ``tessera_expf_nonpositive``: no overflow or denormal cases, about
    30% fewer instructions than :func:`cpu_exp`. CPU tile programs only."""
    return T.call_pure_extern("float32", "tessera_expf_nonpositive", x)


#: Partial results the CPU kernels keep per running reduction over a row (max, sum): lane l takes
#: elements l, l + CPU_LANES, ...; combined at the end. Independent lanes let g++ vectorise without
#: reassociating a single scalar sum (which it may not do without -ffast-math). 64 = four AVX-512
#: registers, enough adds in flight; and a loop of 16 would be unrolled completely before the
#: vectoriser runs, after which g++ 12 no longer vectorises the max (checked with -fopt-info-vec).
CPU_LANES = 64


def lane_chunks(length):
    """``(full, tail)``: the CPU_LANES-wide chunks of ``length`` elements and the elements after them
    (int or, for a symbolic length, TIR floordiv/floormod expressions)."""
    if isinstance(length, int):
        return divmod(length, CPU_LANES)
    return length // CPU_LANES, length % CPU_LANES


def lane_reduce(lanes, length, identity, combine, value_at):
    """Emit a reduction of ``value_at(r)`` for ``r < length`` into ``lanes[0]`` (CPU tile programs).

    ``lanes`` is a local fp32 buffer of CPU_LANES; lane l accumulates elements l, l + CPU_LANES, ...
    with ``combine`` (a loop of constant extent that g++ vectorises), then the lanes are combined.
    """
    full, tail = lane_chunks(length)
    _lane_reduce(lanes, full, tail, identity, combine, value_at)


@T.macro
def _lane_reduce(lanes, full, tail, identity, combine, value_at):
    for lane in T.serial(CPU_LANES):
        lanes[lane] = identity
    for chunk in T.serial(full):
        for lane in T.serial(CPU_LANES):
            lanes[lane] = combine(lanes[lane], value_at(chunk * CPU_LANES + lane))
    for lane in T.serial(tail):
        lanes[lane] = combine(lanes[lane], value_at(full * CPU_LANES + lane))
    for lane in T.serial(1, CPU_LANES):
        lanes[0] = combine(lanes[0], lanes[lane])


_INDEX_ARITHMETIC = (
    tvm.tirx.Add,
    tvm.tirx.Sub,
    tvm.tirx.Mul,
    tvm.tirx.FloorDiv,
    tvm.tirx.FloorMod,
    tvm.tirx.Min,
    tvm.tirx.Max,
)


def element_offset(buffer, index) -> object:
    """Row-major element offset of ``buffer[index]``, an int64 expression. CPU tile programs pass
    global operands to tessera/cpu_gemm.h as (base pointer, int64 offset): tirx.BF16ComputeLegalize
    retypes the address of a bf16 element as fp32. The arithmetic is 64-bit where the buffer can hold
    2^31 elements or more (base.index_dtype: a symbolic dim counts as large), else 32-bit and widened
    once. Static dims are folded; a symbolic one stays in the product."""
    dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in buffer.shape]
    dtype = index_dtype(dims)
    offset, stride = None, 1
    for i, dim in reversed(list(zip(index, dims, strict=True))):
        if not (isinstance(i, int) and i == 0):
            term = as_index(i, dtype) if _is_one(stride) else as_index(i, dtype) * as_index(stride, dtype)
            offset = term if offset is None else term + offset
        stride *= dim
    if offset is None:
        return tvm.tirx.IntImm("int64", 0)
    return offset if dtype == "int64" else T.cast(offset, "int64")  # widened once: it cannot overflow


def as_index(value, dtype: str):
    """``value`` (a Python int or an integer PrimExpr) as a ``dtype`` integer expression. Widening
    casts the leaves, not the result: ``by * 229376`` becomes ``(int64)by * 229376``, computed in 64 bits;
    narrowing (a count known to fit) casts the result."""
    tirx = tvm.tirx
    if isinstance(value, int):
        return tirx.IntImm(dtype, value)
    if str(value.dtype) == dtype:
        return value
    if isinstance(value, tirx.IntImm):
        return tirx.IntImm(dtype, int(value.value))
    if tvm.DataType(dtype).bits < tvm.DataType(str(value.dtype)).bits:  # narrowing: cast the result
        return T.cast(value, dtype)
    if isinstance(value, _INDEX_ARITHMETIC):
        return type(value)(as_index(value.a, dtype), as_index(value.b, dtype))
    return T.cast(value, dtype)


def lowest(dtype: str):
    """-inf in ``dtype`` (the identity of max)."""
    return -T.infinity(dtype)
