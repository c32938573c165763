"""Element types and tensor annotations.

    import tessera as ts
    from tessera import Tensor

    def f(A: Tensor["M", "K", ts.f16], b: Tensor[128, ts.f32]) -> Tensor["M", 128, ts.f32]: ...

A ``DType`` knows its Tessera name (``f16``), its TVM name (``float16``) and its numpy dtype
(bf16 and fp8 come from ``ml_dtypes``). ``Tensor[dims..., dtype]`` is an annotation: named dims
are symbolic (bound from ``shapes=`` at compile time or from the arrays at call time), integer
dims are literal.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DType",
    "TensorType",
    "Tensor",
    "dtype",
    "DTYPES",
    "f32",
    "f16",
    "bf16",
    "fp8_e4m3",
    "fp8_e5m2",
    "int8",
    "int32",
]


@dataclass(frozen=True)
class DType:
    """An element type: ``name`` is Tessera's (``bf16``), ``tvm`` TVM's (``bfloat16``)."""

    name: str
    tvm: str
    bits: int
    is_float: bool

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype arrays of this type have (``ml_dtypes`` for bf16 and fp8)."""
        return _numpy_dtype(self.tvm)

    @property
    def itemsize(self) -> int:
        return self.bits // 8

    def __repr__(self) -> str:
        return f"ts.{self.name}"

    def __str__(self) -> str:
        return self.name


def _numpy_dtype(tvm_name: str) -> np.dtype:
    if tvm_name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, tvm_name))
    return np.dtype(tvm_name)


f32 = DType("f32", "float32", 32, True)
f16 = DType("f16", "float16", 16, True)
bf16 = DType("bf16", "bfloat16", 16, True)
fp8_e4m3 = DType("fp8_e4m3", "float8_e4m3fn", 8, True)
fp8_e5m2 = DType("fp8_e5m2", "float8_e5m2", 8, True)
int8 = DType("int8", "int8", 8, False)
int32 = DType("int32", "int32", 32, False)

#: Every element type, by Tessera name.
DTYPES: dict[str, DType] = {d.name: d for d in (f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8, int32)}
_ALIASES = {d.tvm: d for d in DTYPES.values()} | {"float": f32, "half": f16, "e4m3": fp8_e4m3, "e5m2": fp8_e5m2}


def dtype(value: Any) -> DType:
    """The ``DType`` for a DType, a name (``"f16"``, ``"float16"``, ``"bf16"``) or a numpy dtype."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        found = DTYPES.get(value) or _ALIASES.get(value)
        if found is not None:
            return found
    else:
        try:
            name = np.dtype(value).name
        except TypeError:
            name = None
        found = _ALIASES.get(name) if name else None
        if found is not None:
            return found
    raise TypeError(f"unknown dtype {value!r}; expected one of {', '.join('ts.' + n for n in DTYPES)}")


def _is_dim_name(value: Any) -> bool:
    return isinstance(value, str) and value.isidentifier() and not keyword.iskeyword(value)


@dataclass(frozen=True)
class TensorType:
    """A tensor annotation: ``dims`` holds names (symbolic) and ints (literal); ``dtype`` a DType."""

    dims: tuple[str | int, ...]
    dtype: DType

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(d for d in self.dims if isinstance(d, str))

    def __repr__(self) -> str:
        items = [repr(d) if isinstance(d, str) else str(d) for d in self.dims]
        return f"Tensor[{', '.join([*items, repr(self.dtype)])}]"

    def describe(self) -> str:
        """``[M, K] f16``: how errors and dumps show the type."""
        return f"[{', '.join(map(str, self.dims))}] {self.dtype}"


class _TensorAnnotation:
    """``Tensor[dim, ..., dtype]`` builds a :class:`TensorType`."""

    def __getitem__(self, items: Any) -> TensorType:
        if not isinstance(items, tuple):
            items = (items,)
        if not items:
            raise TypeError("Tensor[...] needs at least a dtype, e.g. Tensor['M', 'N', ts.f16]")
        *dims, last = items
        try:
            elem = dtype(last)
        except TypeError:
            raise TypeError(
                f"Tensor[...]: the last item must be a dtype (ts.f32, ts.f16, ts.bf16, ...), found {last!r}; "
                f"write e.g. Tensor[{', '.join(repr(i) for i in items)}, ts.f16]"
            ) from None
        checked: list[str | int] = []
        for dim in dims:
            if isinstance(dim, bool) or not (_is_dim_name(dim) or (isinstance(dim, int) and dim > 0)):
                raise TypeError(
                    f"Tensor[...]: dim {dim!r} must be a name (a Python identifier such as 'M') or a positive int"
                )
            checked.append(dim)
        return TensorType(tuple(checked), elem)

    def __repr__(self) -> str:
        return "tessera.Tensor"


#: The annotation: ``Tensor["M", "K", ts.f16]``.
Tensor = _TensorAnnotation()
