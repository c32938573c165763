"""Tenstorrent (tt-metal / Metalium) target: pinned API, arch table, API headers, host emulator.

Everything the Tenstorrent code generator emits is written against ONE tt-metal release,
:data:`TT_METAL_VERSION`. In that release

* data-movement kernels define ``void kernel_main()`` and include ``dataflow_api.h``; they read
  and write interleaved DRAM pages through ``TensorAccessor``/``TensorAccessorArgs``
  (``noc_async_read_tile``/``noc_async_write_tile`` + barriers) and talk to compute through the
  circular-buffer (CB) protocol;
* compute kernels define ``namespace NAMESPACE { void MAIN { ... } }`` and use
  ``compute_kernel_api/*.h`` (``mm_init``/``matmul_tiles``, ``add_tiles``, SFPU ``exp/gelu/relu``,
  ``tile_regs_acquire/commit/wait/release``, ``pack_tile``);
* the host program uses the single-device API (``CreateDevice``, ``CreateBuffer``,
  ``CreateCircularBuffer``, ``CreateKernel``, ``SetRuntimeArgs``, ``EnqueueProgram``, ...).

Pieces in this package:

``include/``            that API's headers, one copy: the kernel API implemented for the emulator (the
                        generated kernels are syntax-checked against it too), the host API declared
``emulator/``           the emulator's runner (C++, ``emulator/src``), driven by a plan
``plan.schema.json``    the ``tt.plan.json`` format host programs and the emulator are built from
``arch``                the architecture table (:func:`tessera_tvm.target.tt.arch.get_arch`)
``emulate``             :func:`run_plan` and the plan validator, re-exported from:
``emulate_plan``        loading a plan, its JSON-schema check and cross-field validation
``emulate_build``       compiling the emulator runner and the kernels with g++ (cached)
``emulate_run``         running a plan in the emulator and reading back its results
``API.md``              which signatures were verified against tt-metal sources, and where
``tile_programs``       the TileLang tile programs of every kernel family, in 32x32 tiles (the passes layer)
``transform/``          the ``tt.*`` passes: tile program -> annotated, verified TT IR (the passes layer)
``ir``                  the attributes the passes write and the code generator reads, the errors
``codegen``             the code generator: annotated TT IR -> the five artifacts (reader/compute/writer/host/plan)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: The tt-metal release every generated kernel and host program targets (and its release date).
TT_METAL_VERSION = "v0.62.2"
TT_METAL_RELEASE_DATE = "2025-08-20"
TT_METAL_VERSION_STRING = f"tt-metal {TT_METAL_VERSION} ({TT_METAL_RELEASE_DATE})"

PACKAGE_DIR = Path(__file__).resolve().parent
#: ``-I`` root of the tt-metal API headers: ``g++ -fsyntax-only`` checks kernels and host programs against
#: them, and the emulator builds kernels with them (the kernel API is implemented over its runtime).
INCLUDE_DIR = PACKAGE_DIR / "include"
EMULATOR_SRC_DIR = PACKAGE_DIR / "emulator" / "src"
PLAN_SCHEMA_PATH = PACKAGE_DIR / "plan.schema.json"

TILE_HEIGHT = 32
TILE_WIDTH = 32
TILE_ELEMS = TILE_HEIGHT * TILE_WIDTH
FACE_HEIGHT = 16
FACE_WIDTH = 16

#: tt-metal ``tt::DataFormat`` names the plans use, with bytes per element.
DATA_FORMATS: dict[str, int] = {"Float16": 2, "Float16_b": 2, "Float32": 4}
#: DRAM buffer dtypes in plans -> the CB data format that carries them (``Float16`` is IEEE half,
#: ``Float16_b`` is bfloat16).
DTYPE_TO_FORMAT: dict[str, str] = {"float16": "Float16", "bfloat16": "Float16_b", "float32": "Float32"}


def tile_bytes(data_format: str) -> int:
    """Bytes of one 32x32 tile in ``data_format`` (``Float16``/``Float16_b`` -> 2048, ``Float32`` -> 4096)."""
    try:
        return TILE_ELEMS * DATA_FORMATS[data_format]
    except KeyError:
        raise ValueError(f"unsupported data format {data_format!r}; supported: {sorted(DATA_FORMATS)}") from None


def padded_shape(shape: tuple[int, ...] | list[int]) -> tuple[int, int]:
    """2-D padded shape (rows, cols) of a tensor in tile layout; 1-D tensors are one row."""
    rows, cols = as_2d_shape(shape)
    return (-(-rows // TILE_HEIGHT) * TILE_HEIGHT, -(-cols // TILE_WIDTH) * TILE_WIDTH)


def format_ranges(values) -> str:
    """Tile indices as runs: ``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (what errors about tiles print)."""
    out, start, prev = [], None, None
    for v in sorted(int(v) for v in values):
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = v
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)


def as_2d_shape(shape: tuple[int, ...] | list[int]) -> tuple[int, int]:
    shape = tuple(int(s) for s in shape)
    if len(shape) == 1:
        return (1, shape[0])
    if len(shape) == 2:
        return shape  # type: ignore[return-value]
    raise ValueError(f"tile layout supports 1-D and 2-D tensors, got shape {shape}")


def float_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded


def bf16_bits_to_float(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float values to the nearest bfloat16 (ties to even), returned as float32."""
    return bf16_bits_to_float(float_to_bf16_bits(x))


def float_to_f16_bits(x: np.ndarray) -> np.ndarray:
    """Numbers -> IEEE half bit patterns (uint16), round to nearest even (numpy's float16 conversion):
    too large -> inf, tiny -> subnormal or zero, NaN stays NaN."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is the rounding asked for
        half = np.asarray(x).astype(np.float16)
    return np.ascontiguousarray(half).view(np.uint16)


def f16_bits_to_float(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b, dtype=np.uint16).view(np.float16).astype(np.float32)


def round_to_f16(x: np.ndarray) -> np.ndarray:
    """Round float values to the nearest IEEE half (ties to even), returned as float32."""
    return f16_bits_to_float(float_to_f16_bits(x))


def _face_order(rows: int, cols: int) -> np.ndarray:
    """Permutation taking a row-major (rows, cols) matrix to tt-metal tile/face order."""
    tr, tc = rows // TILE_HEIGHT, cols // TILE_WIDTH
    idx = np.arange(rows * cols, dtype=np.int64).reshape(tr, 2, FACE_HEIGHT, tc, 2, FACE_WIDTH)
    # tile row, tile col, face row, face col, row in face, col in face
    return idx.transpose(0, 3, 1, 4, 2, 5).reshape(-1)


def tilize(x: np.ndarray, pad_value: float = 0.0) -> np.ndarray:
    """Pad a 1-D/2-D array to whole 32x32 tiles and reorder it into tile layout.

    Tiles are stored row-major over the tile grid (page ``i`` = tile ``(i // Nt, i % Nt)``, the
    order interleaved DRAM pages use); inside a tile the four 16x16 faces are stored in order
    (top-left, top-right, bottom-left, bottom-right), each face row-major — tt-metal's
    ``tilize_nfaces`` layout. Returns a flat array of ``pr * pc`` elements.
    """
    arr = np.asarray(x)
    rows, cols = as_2d_shape(arr.shape)
    arr = arr.reshape(rows, cols)
    pr, pc = padded_shape((rows, cols))
    padded = np.full((pr, pc), pad_value, dtype=arr.dtype)
    padded[:rows, :cols] = arr
    return padded.reshape(-1)[_face_order(pr, pc)]


def untilize(flat: np.ndarray, shape: tuple[int, ...] | list[int]) -> np.ndarray:
    """Inverse of :func:`tilize`: tile-layout data -> array of ``shape`` (padding dropped)."""
    rows, cols = as_2d_shape(shape)
    pr, pc = padded_shape((rows, cols))
    flat = np.asarray(flat).reshape(-1)
    if flat.size != pr * pc:
        raise ValueError(f"expected {pr * pc} elements for padded shape {(pr, pc)}, got {flat.size}")
    out = np.empty(pr * pc, dtype=flat.dtype)
    out[_face_order(pr, pc)] = flat
    return out.reshape(pr, pc)[:rows, :cols].reshape(tuple(int(s) for s in shape))


def __getattr__(name: str):  # lazy: the emulator driver pulls in subprocess/hashlib machinery
    if name in {"run_plan", "validate_plan", "load_plan", "PlanError", "EmulatorError", "EmulatorResult"}:
        from . import emulate

        return getattr(emulate, name)
    if name in {"get_arch", "TTArch", "ARCHS"}:
        from . import arch

        return getattr(arch, name)
    raise AttributeError(name)
