"""Foundations of the kernel specs: what every spec, expression and schedule module builds on.

``SpecError`` (the error a malformed spec or schedule raises), the dtypes a spec may use (``DTYPES``,
``dtype_bytes``), the target kinds the generators accept (``TARGET_KINDS``), ``TensorArg`` (one
PrimFunc parameter) and the small argument checks the spec and schedule dataclasses run in their
``__post_init__`` (names, dtypes, dimensions, axes), each raising a ``SpecError`` that names the spec
and field.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..errors import TesseraError


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

#: PrimFunc attr of a tile program built from a Tessera spec (build_tile_program): its family.
SPEC_ATTR = "tessera.spec"


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


# ---------------------------------------------------------------------------------------------
# Symbolic dims
# ---------------------------------------------------------------------------------------------


def is_symbolic(dim: Any) -> bool:
    """Whether ``dim`` is a symbolic dim: an int32 ``tirx.Var`` (a Relax model's dynamic batch).

    A spec may hold such a Var where its tile program only loops over the dim (a GEMM's M and batch,
    the rows of a norm, softmax or reduction, attention's batch): the program's grid and its clamped
    edge loops take the Var, the PrimFunc binds it from the buffer's shape at call time. Schedules,
    validation and resource estimates read the spec through :func:`bind_dims` with a hint instead.
    """
    from .._tvm import tvm

    return isinstance(dim, tvm.tirx.Var) and str(dim.dtype) == "int32"


def symbolic_dims(spec: Any) -> list[Any]:
    """The distinct symbolic dims of a spec (dataclass) in field order."""
    found: list[Any] = []

    def visit(value: Any) -> None:
        if is_symbolic(value):
            if not any(value.same_as(v) for v in found):
                found.append(value)
        elif isinstance(value, tuple):
            for v in value:
                visit(v)

    for name in getattr(spec, "__dataclass_fields__", {}):
        visit(getattr(spec, name))
    return found


def bind_dims(spec: Any, values: dict[str, int]) -> Any:
    """``spec`` with each symbolic dim replaced by ``values[name]`` (a spec of static shapes)."""
    import dataclasses

    def bind(value: Any) -> Any:
        if is_symbolic(value):
            return int(values[str(value.name)])
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple (TensorArg)
            return type(value)(*(bind(v) for v in value))
        if isinstance(value, tuple):
            return tuple(bind(v) for v in value)
        return value

    changes = {f.name: bind(getattr(spec, f.name)) for f in dataclasses.fields(spec)}
    return dataclasses.replace(spec, **changes)


#: Elements from which a buffer's flat offsets no longer fit int32 (TVM's default index type).
INT32_ELEMENTS = 2**31


def element_count_may_exceed_int32(shape: Any) -> bool:
    """Whether a buffer of ``shape`` can hold ``INT32_ELEMENTS`` elements or more: its static element
    count is that large, or a dim is symbolic (a dynamic dim is treated as possibly large). Static
    dims may be ints or ``tirx.IntImm``; any other dim counts as symbolic."""
    count = 1
    for dim in shape:
        value = getattr(dim, "value", dim)
        if isinstance(value, bool) or not isinstance(value, int):
            return True
        count *= value
    return count >= INT32_ELEMENTS


def index_dtype(shape: Any) -> str:
    """The integer type of flat offsets into a buffer of ``shape``: ``int64`` where its element count
    can reach 2^31 (:func:`element_count_may_exceed_int32`), else ``int32``. The one rule every tile
    program applies to the offsets it computes itself (TileLang's tl.ConfigIndexBitwidth widens the
    indices of buffer loads and stores, not the offsets passed to extern calls)."""
    return "int64" if element_count_may_exceed_int32(shape) else "int32"


def clamp(block: int, extent: Any) -> int:
    """``min(block, extent)`` for a static extent; ``block`` for a symbolic one (loops clamp at run time)."""
    return min(block, extent) if isinstance(extent, int) else block


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
        if is_symbolic(d):
            continue
        if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
            raise _fail(spec, f"{field} is {dims!r}; every dimension must be a positive int, found {d!r}")
    return dims


def _check_positive(spec: str, field: str, value: Any) -> None:
    if is_symbolic(value):
        return
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
