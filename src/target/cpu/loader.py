"""The CPU kernel loader: a g++-built shared library -> a kernel callable with numpy arrays.

:func:`load_cpu_kernel` loads a library :func:`~.build.compile_cpu` built with ctypes. A
:class:`CpuKernel` checks every numpy argument against its :class:`KernelParam` (dtype, rank, dims,
symbolic dims agreeing across arrays, C-contiguity) before it hands raw pointers to C, because C
would otherwise read out of bounds silently.
"""

from __future__ import annotations

import ctypes
import operator
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ...errors import TesseraError
from .blas_threads import share_blas_threads

__all__ = [
    "ArgumentError",
    "CpuKernel",
    "KernelParam",
    "KernelRuntimeError",
    "ParamSpecError",
    "load_cpu_kernel",
    "numpy_dtype",
]


class ArgumentError(TesseraError, TypeError):
    """A kernel was called with an argument that does not match its parameter."""


class ParamSpecError(TesseraError, ValueError):
    """A :class:`KernelParam` (or the list given to :func:`load_cpu_kernel`) is malformed."""


class KernelRuntimeError(TesseraError, RuntimeError):
    """A compiled kernel returned a non-zero status."""


# ---------------------------------------------------------------------------------------------- dtypes


def _build_numpy_dtypes() -> dict[str, np.dtype]:
    table = {
        name: np.dtype(name)
        for name in (
            "float16",
            "float32",
            "float64",
            "int8",
            "int16",
            "int32",
            "int64",
            "uint8",
            "uint16",
            "uint32",
            "uint64",
        )
    }
    table["bool"] = np.dtype(np.bool_)
    try:  # numpy has no bfloat16/fp8; ml_dtypes provides them with the same bit layout as C++'s
        import ml_dtypes

        table["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
        table["float8_e4m3fn"] = np.dtype(ml_dtypes.float8_e4m3fn)
        table["float8_e5m2"] = np.dtype(ml_dtypes.float8_e5m2)
    except ImportError:  # pragma: no cover - ml_dtypes comes with tilelang/torch
        pass
    return table


_NUMPY_DTYPES = _build_numpy_dtypes()

# C types of scalar parameters (TileLang passes symbolic dims as int32_t/int64_t).
_SCALAR_CTYPES: dict[str, Any] = {
    "bool": ctypes.c_bool,
    "int8": ctypes.c_int8,
    "int16": ctypes.c_int16,
    "int32": ctypes.c_int32,
    "int64": ctypes.c_int64,
    "uint8": ctypes.c_uint8,
    "uint16": ctypes.c_uint16,
    "uint32": ctypes.c_uint32,
    "uint64": ctypes.c_uint64,
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
}


def numpy_dtype(tvm_dtype: str) -> np.dtype:
    """The numpy dtype for a TVM dtype string (``"bfloat16"`` -> ``ml_dtypes.bfloat16``)."""
    try:
        return _NUMPY_DTYPES[tvm_dtype]
    except KeyError:
        raise ParamSpecError(
            f"dtype {tvm_dtype!r} has no numpy equivalent here; known: {', '.join(sorted(_NUMPY_DTYPES))}"
        ) from None


# ---------------------------------------------------------------------------------------------- params

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class KernelParam:
    """One parameter of a compiled kernel, in the C function's order.

    ``shape`` holds ints or symbol names (``("M", 256)``) for buffers and is empty for scalars. A
    scalar whose name is a symbol of some buffer's shape is filled in from the arrays' shapes.
    ``written``: whether the kernel writes the buffer (None: not known, so it may); a read-only
    array is refused for a buffer the kernel may write.
    """

    name: str
    kind: Literal["buffer", "scalar"]
    dtype: str
    shape: tuple[int | str, ...] = ()
    written: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))  # accept lists, keep the dataclass hashable
        where = f"kernel parameter {self.name!r}"
        if not isinstance(self.name, str) or not _IDENT.fullmatch(self.name):
            raise ParamSpecError(f"{where}: name must be an identifier")
        if self.kind not in ("buffer", "scalar"):
            raise ParamSpecError(f"{where}: kind is {self.kind!r}, expected 'buffer' or 'scalar'")
        numpy_dtype(self.dtype)  # raises for unknown dtypes
        if self.kind == "scalar":
            if self.shape:
                raise ParamSpecError(f"{where}: a scalar has shape (), got {self.shape}")
            if self.dtype not in _SCALAR_CTYPES:
                raise ParamSpecError(
                    f"{where}: scalar dtype {self.dtype!r} cannot be passed from Python; "
                    f"supported: {', '.join(_SCALAR_CTYPES)}"
                )
        for dim in self.shape:
            ok = (isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0) or (
                isinstance(dim, str) and _IDENT.fullmatch(dim)
            )
            if not ok:
                raise ParamSpecError(
                    f"{where}: shape {self.shape} has {dim!r}; dims are ints >= 0 or symbol names like 'M'"
                )


# ---------------------------------------------------------------------------------------------- load

# glibc's dlopen returns the already-loaded library for a path it has seen, even after the file was
# rebuilt; we remember what each path held and load a private copy when it changed.
_LOADED: dict[str, tuple[tuple[int, int, int, int], ctypes.CDLL]] = {}


def _dlopen_fresh(path: Path) -> ctypes.CDLL:
    real = os.path.realpath(path)
    st = os.stat(real)
    identity = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    cached = _LOADED.get(real)
    if cached is not None and cached[0] == identity:
        return cached[1]
    if cached is None:
        lib = ctypes.CDLL(real)
    else:  # same path, new file: dlopen(real) would hand back the stale library
        tmp_dir = tempfile.mkdtemp(prefix="tessera-so-")
        try:
            copy = os.path.join(tmp_dir, os.path.basename(real))
            shutil.copyfile(real, copy)
            lib = ctypes.CDLL(copy)  # the mapping stays valid after the copy is deleted
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    _LOADED[real] = (identity, lib)
    return lib


def load_cpu_kernel(so_path: str | os.PathLike[str], symbol: str, params: Sequence[KernelParam]) -> CpuKernel:
    """Load ``symbol`` from the shared library ``so_path`` as a :class:`CpuKernel` taking ``params``.

    ``params`` must list the C function's parameters in order; the C function must return ``int32_t``
    (0 = success), as TileLang's C codegen does. Nothing checks the list against the C prototype, so
    it must come from the same PrimFunc as the source.
    """
    path = Path(so_path)
    if not path.is_file():
        raise ParamSpecError(f"shared library {os.fspath(path)!r} does not exist (build it with compile_cpu)")
    params = list(params)
    seen: set[str] = set()
    for p in params:
        if not isinstance(p, KernelParam):
            raise ParamSpecError(f"kernel {symbol!r}: params must be KernelParam objects, got {p!r}")
        if p.name in seen:
            raise ParamSpecError(f"kernel {symbol!r}: parameter name {p.name!r} appears twice")
        seen.add(p.name)
    try:
        lib = _dlopen_fresh(path)
    except OSError as exc:
        raise ParamSpecError(f"cannot load {os.fspath(path)!r}: {exc}") from None
    try:
        fn = getattr(lib, symbol)
    except AttributeError:
        raise ParamSpecError(
            f'symbol {symbol!r} not found in {os.fspath(path)!r}; is it declared extern "C"? '
            "(TileLang's C codegen names the device function '<prim_func name>_kernel', e.g. 'main_kernel')"
        ) from None
    share_blas_threads()  # numpy's OpenBLAS on the kernels' threads from now on (blas_threads.py)
    return CpuKernel(fn, name=symbol, path=path, params=params, lib=lib)


class CpuKernel:
    """A compiled CPU kernel: ``kernel(*arrays, **scalars)``, numpy arrays in C order, in place.

    Buffers are passed positionally in parameter order (outputs too: the kernel writes into them);
    scalars by name, and scalars named like a symbolic dim are taken from the arrays' shapes.
    Every mismatch raises :class:`ArgumentError` naming the kernel, the parameter, what was found and
    what was expected; a non-zero return code raises :class:`KernelRuntimeError`.
    """

    __slots__ = ("_buffer_names", "_buffers", "_fn", "_lib", "_nargs", "_scalars", "name", "params", "path")

    def __init__(
        self, fn: Any, *, name: str, path: Path, params: Sequence[KernelParam], lib: ctypes.CDLL | None = None
    ) -> None:
        self.name = name
        self.path = path
        self.params = tuple(params)
        self._lib = lib  # keep the library loaded as long as the kernel lives
        # Prebuilt once: (position, param, numpy dtype) for buffers, (position, param, ctype) for scalars.
        self._buffers = [(i, p, numpy_dtype(p.dtype)) for i, p in enumerate(self.params) if p.kind == "buffer"]
        self._scalars = [(i, p, _SCALAR_CTYPES[p.dtype]) for i, p in enumerate(self.params) if p.kind == "scalar"]
        self._nargs = len(self.params)
        self._buffer_names = ", ".join(p.name for _, p, _ in self._buffers)
        fn.argtypes = [ctypes.c_void_p if p.kind == "buffer" else _SCALAR_CTYPES[p.dtype] for p in self.params]
        fn.restype = ctypes.c_int32
        self._fn = fn

    def __repr__(self) -> str:
        sig = ", ".join(
            f"{p.name}: {p.dtype}[{', '.join(map(str, p.shape))}]" if p.kind == "buffer" else f"{p.name}: {p.dtype}"
            for p in self.params
        )
        return f"<CpuKernel {self.name}({sig}) from {os.fspath(self.path)}>"

    def __call__(self, *arrays: np.ndarray, **scalars: Any) -> None:
        kname = self.name
        if len(arrays) != len(self._buffers):
            raise ArgumentError(
                f"kernel {kname!r} takes {len(self._buffers)} arrays ({self._buffer_names}), got {len(arrays)}"
            )
        args: list[Any] = [None] * self._nargs
        bound: dict[str, int] = {}
        bound_at: dict[str, str] = {}
        for (pos, p, dtype), arr in zip(self._buffers, arrays, strict=True):
            if not isinstance(arr, np.ndarray):
                raise ArgumentError(
                    f"kernel {kname!r}: argument {p.name!r} is a {type(arr).__name__}, expected a numpy.ndarray "
                    f"of {p.dtype} with shape {_fmt_shape(p.shape)}"
                )
            if arr.dtype != dtype:
                raise ArgumentError(
                    f"kernel {kname!r}: argument {p.name!r} has dtype {arr.dtype}, expected {p.dtype} "
                    f"(use {p.name}.astype({_dtype_hint(p.dtype)}))"
                )
            if arr.ndim != len(p.shape):
                raise ArgumentError(
                    f"kernel {kname!r}: argument {p.name!r} has rank {arr.ndim} (shape {arr.shape}), expected rank "
                    f"{len(p.shape)} (shape {_fmt_shape(p.shape)})"
                )
            for axis, (dim, size) in enumerate(zip(p.shape, arr.shape, strict=True)):
                if isinstance(dim, int):
                    if size != dim:
                        raise ArgumentError(
                            f"kernel {kname!r}: argument {p.name!r} has shape {arr.shape}, expected "
                            f"{_fmt_shape(p.shape)}: dim {axis} is {size}, expected {dim}"
                        )
                elif dim in bound:
                    if bound[dim] != size:
                        raise ArgumentError(
                            f"kernel {kname!r}: argument {p.name!r} has shape {arr.shape}, expected "
                            f"{_fmt_shape(p.shape)}: symbolic dim {dim!r} is {size} in {p.name}.shape[{axis}] "
                            f"but {bound[dim]} in {bound_at[dim]}"
                        )
                else:
                    bound[dim] = size
                    bound_at[dim] = f"{p.name}.shape[{axis}]"
            if not arr.flags.c_contiguous:
                raise ArgumentError(
                    f"kernel {kname!r}: argument {p.name!r} is not C-contiguous (strides {arr.strides}); "
                    f"expected a C-contiguous array: pass np.ascontiguousarray({p.name}) (and copy results back "
                    "if it is an output)"
                )
            if not arr.flags.writeable and p.written is not False:
                raise ArgumentError(
                    f"kernel {kname!r}: argument {p.name!r} is a read-only array, but the kernel "
                    f"{'writes' if p.written else 'may write'} {p.name}; expected a writable array: pass "
                    f"{p.name}.copy() (or np.empty_like({p.name}) for an output)"
                )
            if not arr.flags.aligned:
                raise ArgumentError(
                    f"kernel {kname!r}: argument {p.name!r} is not aligned to its dtype; pass a copy ({p.name}.copy())"
                )
            args[pos] = arr.ctypes.data
        if scalars or self._scalars:
            self._fill_scalars(args, scalars, bound, bound_at)
        rc = self._fn(*args)
        if rc != 0:
            raise KernelRuntimeError(f"kernel {kname!r} ({os.fspath(self.path)}) returned error code {rc}, expected 0")

    def _fill_scalars(
        self, args: list[Any], given: dict[str, Any], bound: dict[str, int], bound_at: dict[str, str]
    ) -> None:
        kname = self.name
        names = {p.name for _, p, _ in self._scalars}
        unknown = sorted(set(given) - names)
        if unknown:
            expected = ", ".join(sorted(names)) or "none"
            raise ArgumentError(
                f"kernel {kname!r}: unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
                f"scalar parameters: {expected}"
            )
        for pos, p, _ctype in self._scalars:
            if p.name in given:
                value = _check_scalar(kname, p, given[p.name])
                if p.name in bound and value != bound[p.name]:
                    raise ArgumentError(
                        f"kernel {kname!r}: scalar {p.name!r} is {value} but the arrays give {p.name} = "
                        f"{bound[p.name]} (from {bound_at[p.name]}); leave it out to use the arrays' value"
                    )
            elif p.name in bound:
                value = _check_scalar(kname, p, bound[p.name])
            else:
                raise ArgumentError(
                    f"kernel {kname!r}: missing scalar argument {p.name!r} ({p.dtype}); pass it as {p.name}=..."
                )
            args[pos] = value


_INT_RANGES = {
    name: (int(np.iinfo(name).min), int(np.iinfo(name).max))
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
}


def _check_scalar(kname: str, p: KernelParam, value: Any) -> Any:
    if p.dtype == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise ArgumentError(f"kernel {kname!r}: scalar {p.name!r} is {value!r}, expected a bool")
        return bool(value)
    if p.dtype in _INT_RANGES:
        if isinstance(value, (bool, np.bool_)):
            raise ArgumentError(f"kernel {kname!r}: scalar {p.name!r} is {value!r}, expected an int ({p.dtype})")
        try:
            ivalue = operator.index(value)
        except TypeError:
            raise ArgumentError(
                f"kernel {kname!r}: scalar {p.name!r} is a {type(value).__name__} ({value!r}), expected an int "
                f"({p.dtype})"
            ) from None
        lo, hi = _INT_RANGES[p.dtype]
        if not lo <= ivalue <= hi:
            raise ArgumentError(
                f"kernel {kname!r}: scalar {p.name!r} is {ivalue}, which does not fit {p.dtype} ([{lo}, {hi}])"
            )
        return ivalue
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentError(
            f"kernel {kname!r}: scalar {p.name!r} is a {type(value).__name__} ({value!r}), expected a number "
            f"({p.dtype})"
        )
    return float(value)


def _fmt_shape(shape: tuple[int | str, ...]) -> str:
    inner = ", ".join(str(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def _dtype_hint(tvm_dtype: str) -> str:
    if tvm_dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return f"ml_dtypes.{tvm_dtype}"
    return "np.bool_" if tvm_dtype == "bool" else f"np.{tvm_dtype}"
