"""GEMM tile programs: ``out = epilogue(A @ B)``, batched, transposed operands, masked edges.

GPU (cuda/hip): one ``block_m x block_n`` output tile per block, A/B tiles in shared memory, a
pipelined K loop of ``T.gemm`` into an fp32 fragment, the epilogue applied on the fragment, one
``T.copy`` out. TileLang's copies zero-fill reads past the matrix edge and predicate the store, and
the epilogue masks its own operand reads, so M, N, K need not be multiples of the block.

CPU (c): a local fp32 accumulator per tile. For each K step the block packs its A and B panels
(converting fp16/bf16 to fp32, transposed operands read through their strides) and calls the
register-blocked micro-kernel of tessera/cpu_gemm.h (``src/target/include``), the CPU analogue of
TileLang's ``tl::gemm_ss`` templates; the epilogue is a loop over the accumulator. Extents are
clamped to the matrix edge (``min(block, M - row0)``), so no element outside the matrices is read
or written. Other dtypes (integer inputs, a non-fp32 accumulator) keep serial loops. A B packed ahead
(``GemmSpec.packed_b``: a constant weight, tile/panels.py) is not packed: the micro-kernel reads each
K step's panel where the packed operand holds it.
"""

from __future__ import annotations

import math

from .._tvm import T, pointer_buffer, prim_func, tvm
from .base import SpecError
from .common import (
    all_of,
    as_index,
    binary,
    broadcast_coords,
    const,
    declare_params,
    element_offset,
    guard,
    nan_max,
    nan_min,
    round_to,
    to_compute,
    unary,
    unravel,
)
from .panels import PackedPanels
from .schedule import TileSchedule, _cores_evenly_busy
from .specs import GemmSpec


def _batch_coords(spec: GemmSpec, bz):
    """(A, B, out) batch coordinates of flat batch index ``bz`` (numpy broadcasting)."""
    out = unravel(bz, spec.batch) if spec.batch else []
    return (broadcast_coords(out, spec.batch_a, spec.batch), broadcast_coords(out, spec.batch_b, spec.batch), out)


def apply_epilogue(
    spec: GemmSpec,
    acc,
    row,
    col,
    out_coords,
    operands: dict,
    masked: bool = True,
    host: bool = False,
    *,
    bias_index: tuple | None = None,
    tile_index: tuple | None = None,
):
    """The epilogue steps on accumulator value ``acc`` of output element (row, col).

    With ``masked`` the operand reads are guarded by the matrix bounds (GPU tiles cover the edge);
    ``host``: a CPU program (vectorisable exp/erf/tanh, :func:`unary`). A bias is read at
    ``bias_index`` (default ``(col,)``) and a residual or gate at ``tile_index`` (default
    ``(*out_coords, row, col)``): a convolution reads them in NCHW (tile/conv.py).
    """
    compute = held = spec.dtype_acc  # held: the dtype of the graph value the steps so far computed
    zero = T.cast(0, compute)
    value = acc
    bias_index = (col,) if bias_index is None else bias_index
    tile_index = (*out_coords, row, col) if tile_index is None else tile_index
    for op in spec.epilogue:
        if op.kind == "bias":
            bias = to_compute(operands[op.operand][bias_index], compute)
            value = value + (guard(col < spec.N, bias, zero) if masked else bias)
        elif op.kind in ("residual", "gate"):
            res = to_compute(operands[op.operand][tile_index], compute)
            res = guard(all_of(row < spec.M, col < spec.N), res, zero) if masked else res
            value = value + res if op.kind == "residual" else value * res
        elif op.kind == "scale":
            value = binary("mul", value, const(op.value, compute))  # a scale of 0 keeps NaN and inf as NaN
        elif op.kind == "add_scalar":
            value = value + T.cast(op.value, compute)
        elif op.kind == "max_scalar":
            value = nan_max(value, const(op.value, compute))
        elif op.kind == "min_scalar":
            value = nan_min(value, const(op.value, compute))
        elif op.kind == "cast":
            if compute.startswith("int") and not op.dtype.startswith("int"):
                # An integer accumulator cast to a float (a dequantisation): the steps after it compute
                # in float32 (in int32, a scale of 0.25 became 0).
                value, compute = T.cast(value, "float32"), "float32"
                zero = T.cast(0, compute)
            value, held = round_to(value, op.dtype, compute), op.dtype
            continue
        else:
            value = unary(op.kind, value, compute, host=host)
        if held.startswith("int") and held != compute:
            # An int8 step's result is int8: wrapped here, as the reference's, not at a later cast
            # (through int32 where the steps compute in float32: a float past int8's range has no int8).
            wide = value if compute.startswith("int") else T.cast(value, "int32")
            value = to_compute(T.cast(wide, held), compute)
    return value


def declare_gemm_params(spec: GemmSpec, names: tuple[str, str] = ("a", "b")):
    """The parameters as ``io.a``, ``io.b`` (or ``names``: a convolution's ``x``, ``w``), ``io.out`` and
    ``io.operands`` (epilogue operand name -> buffer)."""
    io = declare_params(spec.params(), names)
    io.out = io.buffers[-1]
    io.operands = {arg.name: buf for arg, buf in zip(spec.epilogue_operands(), io.buffers[2:-1], strict=True)}
    return io


def gemm_gpu_program(spec: GemmSpec, s: TileSchedule):
    """The GEMM tile program of a thread-block target (CUDA, HIP): shared-memory tiles, T.gemm."""
    if spec.packed_b is not None:
        raise SpecError("GemmSpec: packed_b is the CPU micro-kernel's layout; a thread-block GEMM reads B as it is")
    M, N, K = spec.M, spec.N, spec.K
    block_m, block_n, block_k = s.block_m, s.block_n, s.block_k
    a_tile = (block_k, block_m) if spec.transpose_a else (block_m, block_k)
    b_tile = (block_n, block_k) if spec.transpose_b else (block_k, block_n)
    n_batch = math.prod(spec.batch)

    @prim_func
    def main():
        io = declare_gemm_params(spec)
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), n_batch, threads=s.threads) as (bx, by, bz):
            A_s = T.alloc_shared(a_tile, spec.dtype_a)
            B_s = T.alloc_shared(b_tile, spec.dtype_b)
            acc = T.alloc_fragment((block_m, block_n), spec.dtype_acc)
            if s.rasterize > 0:
                T.use_swizzle(s.rasterize)
            a_batch, b_batch, out_batch = _batch_coords(spec, bz)
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, block_k), num_stages=s.stages):
                if spec.transpose_a:
                    T.copy(io.a[(*a_batch, k * block_k, by * block_m)], A_s)
                else:
                    T.copy(io.a[(*a_batch, by * block_m, k * block_k)], A_s)
                if spec.transpose_b:
                    T.copy(io.b[(*b_batch, bx * block_n, k * block_k)], B_s)
                else:
                    T.copy(io.b[(*b_batch, k * block_k, bx * block_n)], B_s)
                T.gemm(A_s, B_s, acc, transpose_A=spec.transpose_a, transpose_B=spec.transpose_b)
            if len(spec.epilogue) > 0:
                for i, j in T.Parallel(block_m, block_n):
                    acc[i, j] = apply_epilogue(
                        spec, acc[i, j], by * block_m + i, bx * block_n + j, out_batch, io.operands
                    )
            T.copy(acc, io.out[(*out_batch, by * block_m, bx * block_n)])

    return main


#: Rows/columns added to block_m/block_n when sizing the packed panels (TESSERA_GEMM_PAD in
#: tessera/cpu_gemm.h): the micro-kernel pads the last strip to its MR x NR register tile.
CPU_PACK_PAD = 64

#: Rows x columns of the micro-kernel's register tile on AVX-512 (TESSERA_GEMM_MR x TESSERA_GEMM_NR);
#: CPU blocks are rounded to multiples of it (tile/schedule.py) so no strip is partly empty.
CPU_MICRO_TILE = (14, 32)

#: The register tile of the bf16 x bf16 micro-kernel on bf16 k-pairs (TESSERA_PAIRS_MR x
#: TESSERA_PAIRS_NR): 6 rows of A read in place x 4 vectors.
CPU_PAIRS_MICRO_TILE = (6, 64)

#: Input dtypes the packing routines read, by the suffix of their names (tessera_cpu_pack_a_f16, ...).
_CPU_PACK_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def cpu_gemm_packs(spec: GemmSpec) -> bool:
    """Whether the CPU GEMM of ``spec`` runs a packed micro-kernel (else serial loops)."""
    floats = spec.dtype_acc == "float32" and spec.dtype_a in _CPU_PACK_DTYPES and spec.dtype_b in _CPU_PACK_DTYPES
    return floats or cpu_gemm_quads(spec)


def cpu_gemm_quads(spec: GemmSpec) -> bool:
    """Whether the CPU GEMM of ``spec`` runs on int8 k-quads (int8 x int8 -> int32: tessera/cpu_int8.h,
    vpdpbusd with AVX512-VNNI, AMX tiles where the CPU has them); a row-major A is read in place, a
    transposed one copied into row-major blocks first."""
    return spec.dtype_a == spec.dtype_b == "int8" and spec.dtype_acc == "int32"


def cpu_pack_suffix(dtype: str) -> str | None:
    """The dtype suffix of the packing routines for ``dtype`` (``"f16"``), None when there are none."""
    return _CPU_PACK_DTYPES.get(dtype)


def cpu_gemm_pairs(spec: GemmSpec) -> bool:
    """Whether the CPU GEMM of ``spec`` runs on bf16 k-pairs (bf16 x bf16: vdpbf16ps with AVX512-BF16)."""
    return spec.dtype_acc == "float32" and spec.dtype_a == spec.dtype_b == "bfloat16"


def cpu_k_per_word(spec: GemmSpec) -> int:
    """Consecutive k in a 32-bit word of the CPU GEMM's packed B: 2 (bf16 k-pairs), 4 (int8 k-quads),
    else 1 (fp32 panels)."""
    return 2 if cpu_gemm_pairs(spec) else 4 if cpu_gemm_quads(spec) else 1


def cpu_micro_tile(spec: GemmSpec) -> tuple[int, int]:
    """Rows x columns of the register tile the CPU GEMM of ``spec`` runs (blocks are rounded to it)."""
    return CPU_PAIRS_MICRO_TILE if cpu_k_per_word(spec) > 1 else CPU_MICRO_TILE  # int8 quads: the same 6 x 64


def cpu_pack_elements(block_m: int, block_n: int, block_k: int, *, per_word: int = 1) -> tuple[int, int]:
    """fp32 elements (32-bit words) of the packed A and B panels of a CPU GEMM block, ``per_word`` k
    in a word (:func:`cpu_k_per_word`: bf16 k-pairs take half as many, int8 k-quads a quarter)."""
    depth = -(-block_k // per_word)
    return (block_m + CPU_PACK_PAD) * depth, (block_n + CPU_PACK_PAD) * depth


def cpu_reads_a_in_place(spec: GemmSpec) -> bool:
    """Whether the CPU GEMM of ``spec`` reads A where it is instead of packing it: a row-major bf16 A
    of a bf16 x bf16 GEMM, whose k-pairs are 32-bit words of its rows (``tessera_cpu_gemm_bf16x2_rows``),
    and a row-major int8 A of an int8 GEMM (k-quads: ``tessera_cpu_gemm_s8x4_rows``)."""
    return cpu_k_per_word(spec) > 1 and not spec.transpose_a


def _panel_address(panel):
    """A panel's first element: ``panel`` a buffer, or already an address (``T.address_of``)."""
    return T.address_of(panel[0]) if isinstance(panel, tvm.tirx.Buffer) else panel


def cpu_pack(operand: str, dtype: str, panel, source, offset, stride_outer, stride_k, count, depth):
    """``tessera_cpu_pack_<operand>_<dtype>`` (tessera/cpu_gemm.h): ``count`` rows (A) or columns (B)
    of ``depth`` elements, read from ``source`` + ``offset`` through the two element strides, into the
    fp32 ``panel`` (a buffer, or the address of a panel inside one) that :func:`cpu_gemm` reads. Offset and strides are passed as int64 (an operand may
    hold 2^31 elements or more: :func:`~.common.element_offset`), the counts as int32 (a block's)."""
    return T.call_extern(
        "int32",
        f"tessera_cpu_pack_{operand}_{dtype}",
        _panel_address(panel),
        source,
        as_index(offset, "int64"),
        as_index(stride_outer, "int64"),
        as_index(stride_k, "int64"),
        as_index(count, "int32"),
        as_index(depth, "int32"),
    )


def cpu_gemm(acc, row_stride, a_panel, b_panel, rows, cols, depth, *, pairs=False, quads=False, overwrite=False):
    """``tessera_cpu_gemm_f32`` (tessera/cpu_gemm.h): ``acc[rows, cols] += A x B`` over ``depth``, from
    panels packed by :func:`cpu_pack` (buffers or addresses); ``acc`` rows are ``row_stride`` elements apart. ``pairs``:
    ``tessera_cpu_gemm_bf16x2``, on panels of bf16 k-pairs (packed as ``bf16x2``). ``quads``:
    ``tessera_cpu_gemm_s8x4`` (tessera/cpu_int8.h), A a row-major int8 block (packed as ``s8x4``), B
    k-quads, int32 ``acc``. ``overwrite`` (fp32 panels): ``tessera_cpu_gemm_set_f32``, ``acc[rows,
    cols] = A x B`` (acc is not read)."""
    assert not ((pairs or quads) and overwrite), "the bf16 and int8 micro-kernels only accumulate"
    kernel = "tessera_cpu_gemm_set_f32" if overwrite else "tessera_cpu_gemm_f32"
    return T.call_extern(
        "int32",
        "tessera_cpu_gemm_bf16x2" if pairs else "tessera_cpu_gemm_s8x4" if quads else kernel,
        T.address_of(acc[0, 0]),
        row_stride,
        _panel_address(a_panel),
        _panel_address(b_panel),
        as_index(rows, "int32"),  # at most a block: int32 even where the matrix has 2^31 rows or more
        as_index(cols, "int32"),
        as_index(depth, "int32"),
    )


def cpu_gemm_rows(acc, row_stride, a, a_offset, a_row_stride, b_panel, rows, cols, depth, *, quads=False):
    """``tessera_cpu_gemm_bf16x2_rows`` (tessera/cpu_gemm.h): ``acc[rows, cols] += A x B`` over ``depth``,
    A the ``rows`` rows of a row-major bf16 operand from ``a`` + ``a_offset``, ``a_row_stride`` elements
    apart (offset and stride int64), read in place; B a panel of k-pairs packed by :func:`cpu_pack`.
    ``quads``: ``tessera_cpu_gemm_s8x4_rows`` (tessera/cpu_int8.h), int8 A and k-quads, int32 ``acc``."""
    return T.call_extern(
        "int32",
        "tessera_cpu_gemm_s8x4_rows" if quads else "tessera_cpu_gemm_bf16x2_rows",
        T.address_of(acc[0, 0]),
        row_stride,
        a,
        as_index(a_offset, "int64"),
        as_index(a_row_stride, "int64"),
        _panel_address(b_panel),
        as_index(rows, "int32"),
        as_index(cols, "int32"),
        as_index(depth, "int32"),
    )


def cpu_gemm_panel(acc, row_stride, a_panel, b, b_offset, strip, rows, cols, depth):
    """``tessera_cpu_gemm_panel_f32`` (tessera/cpu_gemm.h): ``acc[rows, cols] += A x B`` over ``depth``,
    A from a panel packed by :func:`cpu_pack`, B from the panel packed ahead at ``b`` + ``b_offset``
    (int64, in floats) in strips of ``strip`` columns (tile/panels.py)."""
    return T.call_extern(
        "int32",
        "tessera_cpu_gemm_panel_f32",
        T.address_of(acc[0, 0]),
        row_stride,
        T.address_of(a_panel[0]),
        b,
        b_offset,
        as_index(strip, "int32"),
        as_index(rows, "int32"),
        as_index(cols, "int32"),
        as_index(depth, "int32"),
    )


def cpu_packed_b(spec: GemmSpec, s: TileSchedule) -> PackedPanels | None:
    """The panels in which the CPU GEMM of ``spec`` under ``s`` can take a constant B packed ahead
    (the CPU backend's ``packed_weights`` hook), None where it packs B itself: the serial loops, bf16 x
    bf16 (k-pairs, which only CPUs with AVX512-BF16 read), a dim that stays symbolic. The strips are
    the AVX-512 register tile's columns; a kernel built where NR differs repacks them."""
    if not cpu_gemm_packs(spec) or cpu_k_per_word(spec) > 1 or spec.packed_b is not None:
        return None
    if not (isinstance(spec.N, int) and isinstance(spec.K, int)):
        return None
    return PackedPanels(s.block_n, s.block_k, CPU_MICRO_TILE[1])


def _row_major_strides(shape) -> list[int]:
    strides, stride = [], 1
    for dim in reversed(shape):
        strides.append(stride)
        stride *= dim
    return strides[::-1]


@T.macro
def _store_cpu_block(spec, io, acc, rows, cols, row0, col0, out_batch):
    """The CPU block's ``rows x cols`` accumulator tile through the epilogue into the output at
    (``row0``, ``col0``) (no masks: the loops stop at the matrix edge)."""
    for i in T.serial(rows):
        for j in T.serial(cols):
            io.out[(*out_batch, row0 + i, col0 + j)] = T.cast(
                apply_epilogue(spec, acc[i, j], row0 + i, col0 + j, out_batch, io.operands, masked=False, host=True),
                spec.dtype_out,
            )


def gemm_cpu_program(spec: GemmSpec, s: TileSchedule):
    """The GEMM tile program of the CPU: packed panels and the micro-kernel (serial loops without it)."""
    if not cpu_gemm_packs(spec):
        return _gemm_cpu_loops(spec, s)
    M, N, K = spec.M, spec.N, spec.K
    block_m, block_n, block_k = s.block_m, s.block_n, s.block_k
    n_batch = math.prod(spec.batch)
    # bf16 x bf16: k-pairs for the CPU's bf16 dot products (fp32 packing where it has none); int8 x
    # int8: k-quads and an int32 accumulator; both read a row-major A in place (a transposed one is packed).
    pairs, quads = cpu_gemm_pairs(spec), cpu_gemm_quads(spec)
    a_in_place = cpu_reads_a_in_place(spec)
    if pairs or quads:
        dtype_a = dtype_b = "bf16x2" if pairs else "s8x4"
    else:
        dtype_a, dtype_b = _CPU_PACK_DTYPES[spec.dtype_a], _CPU_PACK_DTYPES[spec.dtype_b]
    a_elems, b_elems = cpu_pack_elements(block_m, block_n, block_k, per_word=cpu_k_per_word(spec))
    # (row, k) strides of A and (k, column) strides of B: a transposed operand is read through them.
    a_strides = _row_major_strides((K, M) if spec.transpose_a else (M, K))
    b_strides = _row_major_strides((N, K) if spec.transpose_b else (K, N))
    a_row_stride, a_k_stride = a_strides[::-1] if spec.transpose_a else a_strides
    b_k_stride, b_col_stride = b_strides[::-1] if spec.transpose_b else b_strides

    def a_offset(io, a_batch, by, k):
        """The element offset of K step ``k``'s panel of A for row block ``by``."""
        index = (*a_batch, k * block_k, by * block_m) if spec.transpose_a else (*a_batch, by * block_m, k * block_k)
        return element_offset(io.a, index)

    def pack_b(io, b_pack, b_batch, bx, k, cols, depth):
        """K step ``k``'s panel of B for column block ``bx`` (a transposed B is read through its strides)."""
        index = (*b_batch, bx * block_n, k * block_k) if spec.transpose_b else (*b_batch, k * block_k, bx * block_n)
        return cpu_pack(
            "b", dtype_b, b_pack, io.b.data, element_offset(io.b, index), b_k_stride, b_col_stride, cols, depth
        )

    def pack_a(io, a_pack, a_batch, by, k, rows, depth):
        """K step ``k``'s panel of A for row block ``by`` (a transposed A is read through its strides)."""
        return cpu_pack(
            "a", dtype_a, a_pack, io.a.data, a_offset(io, a_batch, by, k), a_row_stride, a_k_stride, rows, depth
        )

    if spec.packed_b is not None:
        return _gemm_cpu_packed_b(spec, s, pack_a, a_elems)
    if cpu_b_shared_by_row_blocks(spec, s):
        return _gemm_cpu_shared_b(spec, s, a_offset, pack_b, pack_a, a_row_stride)
    if cpu_a_shared_by_column_blocks(spec, s):
        return _gemm_cpu_shared_a(spec, s, pack_a, pack_b)

    @prim_func
    def main():
        io = declare_gemm_params(spec)
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), n_batch) as (bx, by, bz):
            acc = T.alloc_local((block_m, block_n), spec.dtype_acc)  # float32; int32 for int8 quads
            a_pack = T.alloc_local((1 if a_in_place else a_elems,), "float32")
            b_pack = T.alloc_local((b_elems,), "float32")
            a_batch, b_batch, out_batch = _batch_coords(spec, bz)
            rows = T.min(block_m, M - by * block_m)
            cols = T.min(block_n, N - bx * block_n)
            T.clear(acc)
            for k in T.serial(T.ceildiv(K, block_k)):
                depth = T.min(block_k, K - k * block_k)
                pack_b(io, b_pack, b_batch, bx, k, cols, depth)
                if a_in_place:
                    offset = a_offset(io, a_batch, by, k)
                    cpu_gemm_rows(acc, block_n, io.a.data, offset, a_row_stride, b_pack, rows, cols, depth, quads=quads)
                else:
                    pack_a(io, a_pack, a_batch, by, k, rows, depth)
                    cpu_gemm(acc, block_n, a_pack, b_pack, rows, cols, depth, pairs=pairs, quads=quads)
            _store_cpu_block(spec, io, acc, rows, cols, by * block_m, bx * block_n, out_batch)

    return main


def cpu_b_shared_by_row_blocks(spec: GemmSpec, s: TileSchedule) -> bool:
    """Whether the CPU GEMM of ``spec`` under ``s`` packs B once for all row blocks of a column: a
    bf16 x bf16 or int8 GEMM with A read in place, or a GEMM on fp32 panels (A packed per block), whose
    column blocks alone give every core equal work (as many as the cores, a multiple of them, or 4 per
    core or more) and has more than one row block. (fp32, one core, 1024^3: B's packing for every row
    block was 10% of the time; packed once per column, 3%.)"""
    import os

    fp32_panels = cpu_gemm_packs(spec) and cpu_k_per_word(spec) == 1
    if not ((cpu_reads_a_in_place(spec) or fp32_panels) and spec.packed_b is None):
        return False
    if not all(isinstance(dim, int) for dim in (spec.M, spec.N, spec.K)):
        return False
    blocks = math.ceil(spec.N / s.block_n) * math.prod(spec.batch)
    return spec.M > s.block_m and _cores_evenly_busy(blocks, os.cpu_count() or 1)


def cpu_a_shared_by_column_blocks(spec: GemmSpec, s: TileSchedule) -> bool:
    """Whether the CPU GEMM of ``spec`` under ``s`` packs A once for all column blocks of a row: a
    bf16 x bf16 or int8 GEMM with a transposed A (copied into row-major k-pairs/quads first, which a
    block per (row, column) block repeated for every column block: 0.79x torch at 1024^3 int8) whose
    row blocks alone give every core equal work and has more than one column block."""
    import os

    if not (cpu_k_per_word(spec) > 1 and spec.transpose_a and spec.packed_b is None):
        return False
    if not all(isinstance(dim, int) for dim in (spec.M, spec.N, spec.K)):
        return False
    blocks = math.ceil(spec.M / s.block_m) * math.prod(spec.batch)
    return spec.N > s.block_n and _cores_evenly_busy(blocks, os.cpu_count() or 1)


def _workspace_panel(floats: int, at, size: int):
    """A buffer over the ``size`` floats at float ``at`` of the thread's workspace of ``floats`` floats
    (``tessera_cpu_workspace``): one address per panel, as CPU attention's (an index into one buffer
    over all panels, a stride of 32768 floats or more, fails in tl.StorageRewrite)."""
    address = T.call_extern("handle", "tessera_cpu_workspace", T.int64(floats), T.cast(at, "int64"))
    return pointer_buffer(address, (size,), "float32")


def _gemm_cpu_shared_b(spec: GemmSpec, s: TileSchedule, a_offset, pack_b, pack_a, a_row_stride):
    """The CPU GEMM with B packed once per column: a block per column of ``block_n`` columns (and
    batch) packs B's panels for every K step once, into the thread's workspace
    (``tessera_cpu_workspace``), then runs its row blocks over them one after another (a block per
    row block packs B once per row block: 4-5% of a 1024^3 bf16 GEMM, 10% of an fp32 one). A is read
    in place (bf16 x bf16, int8: :func:`cpu_reads_a_in_place`) or packed by ``pack_a`` for each row
    block and K step (fp32 panels)."""
    M, N, K = spec.M, spec.N, spec.K
    block_m, block_n, block_k = s.block_m, s.block_n, s.block_k
    n_batch = math.prod(spec.batch)
    quads = cpu_gemm_quads(spec)
    a_elems, b_elems = cpu_pack_elements(block_m, block_n, block_k, per_word=cpu_k_per_word(spec))
    steps = math.ceil(K / block_k)
    in_place = cpu_reads_a_in_place(spec)

    @prim_func
    def main():
        io = declare_gemm_params(spec)
        with T.Kernel(T.ceildiv(N, block_n), n_batch) as (bx, bz):
            acc = T.alloc_local((block_m, block_n), spec.dtype_acc)
            a_pack = T.alloc_local((1 if in_place else a_elems,), "float32")
            a_batch, b_batch, out_batch = _batch_coords(spec, bz)
            cols = T.min(block_n, N - bx * block_n)
            for k in T.serial(steps):
                panel = _workspace_panel(steps * b_elems, k * b_elems, b_elems)
                pack_b(io, panel, b_batch, bx, k, cols, T.min(block_k, K - k * block_k))
            for by in T.serial(T.ceildiv(M, block_m)):
                rows = T.min(block_m, M - by * block_m)
                T.clear(acc)
                for k in T.serial(steps):
                    depth = T.min(block_k, K - k * block_k)
                    panel = _workspace_panel(steps * b_elems, k * b_elems, b_elems)
                    if in_place:
                        offset = a_offset(io, a_batch, by, k)
                        cpu_gemm_rows(
                            acc, block_n, io.a.data, offset, a_row_stride, panel, rows, cols, depth, quads=quads
                        )
                    else:
                        pack_a(io, a_pack, a_batch, by, k, rows, depth)
                        cpu_gemm(acc, block_n, a_pack, panel, rows, cols, depth)
                _store_cpu_block(spec, io, acc, rows, cols, by * block_m, bx * block_n, out_batch)

    return main


def _gemm_cpu_shared_a(spec: GemmSpec, s: TileSchedule, pack_a, pack_b):
    """The bf16 x bf16 (or int8) CPU GEMM with a transposed A, a block per row block of ``block_m``
    rows (and batch): it packs A's panels for every K step once, into the thread's workspace, then
    runs its column blocks over them one after another, each packing its own B panels."""
    M, N, K = spec.M, spec.N, spec.K
    block_m, block_n, block_k = s.block_m, s.block_n, s.block_k
    n_batch = math.prod(spec.batch)
    pairs, quads = cpu_gemm_pairs(spec), cpu_gemm_quads(spec)
    a_elems, b_elems = cpu_pack_elements(block_m, block_n, block_k, per_word=cpu_k_per_word(spec))
    steps = math.ceil(K / block_k)

    @prim_func
    def main():
        io = declare_gemm_params(spec)
        with T.Kernel(T.ceildiv(M, block_m), n_batch) as (by, bz):
            acc = T.alloc_local((block_m, block_n), spec.dtype_acc)
            b_pack = T.alloc_local((b_elems,), "float32")
            a_batch, b_batch, out_batch = _batch_coords(spec, bz)
            rows = T.min(block_m, M - by * block_m)
            for k in T.serial(steps):
                panel = _workspace_panel(steps * a_elems, k * a_elems, a_elems)
                pack_a(io, panel, a_batch, by, k, rows, T.min(block_k, K - k * block_k))
            for bx in T.serial(T.ceildiv(N, block_n)):
                cols = T.min(block_n, N - bx * block_n)
                T.clear(acc)
                for k in T.serial(steps):
                    depth = T.min(block_k, K - k * block_k)
                    pack_b(io, b_pack, b_batch, bx, k, cols, depth)
                    panel = _workspace_panel(steps * a_elems, k * a_elems, a_elems)
                    cpu_gemm(acc, block_n, panel, b_pack, rows, cols, depth, pairs=pairs, quads=quads)
                _store_cpu_block(spec, io, acc, rows, cols, by * block_m, bx * block_n, out_batch)

    return main


def _gemm_cpu_packed_b(spec: GemmSpec, s: TileSchedule, pack_a, a_elems: int):
    """The CPU GEMM whose B comes packed ahead (``spec.packed_b``): as :func:`gemm_cpu_program` (whose
    ``pack_a`` packs A), but each K step passes the micro-kernel the address of B's panel instead of
    packing it."""
    M, N, K = spec.M, spec.N, spec.K
    block_m, block_n, block_k = s.block_m, s.block_n, s.block_k
    panels = spec.packed_b
    if (panels.block_n, panels.block_k) != (block_n, block_k):
        raise SpecError(
            f"GemmSpec: packed_b holds panels of {panels.block_n} columns x {panels.block_k} k; the schedule's "
            f"blocks are {block_n} x {block_k} (block_n x block_k): pack B for the schedule it runs under"
        )
    n_batch = math.prod(spec.batch)

    @prim_func
    def main():
        io = declare_gemm_params(spec)
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), n_batch) as (bx, by, bz):
            acc = T.alloc_local((block_m, block_n), "float32")
            a_pack = T.alloc_local((a_elems,), "float32")
            a_batch, b_batch, out_batch = _batch_coords(spec, bz)
            rows = T.min(block_m, M - by * block_m)
            cols = T.min(block_n, N - bx * block_n)
            T.clear(acc)
            for k in T.serial(T.ceildiv(K, block_k)):
                depth = T.min(block_k, K - k * block_k)
                pack_a(io, a_pack, a_batch, by, k, rows, depth)
                panel = element_offset(io.b, (*b_batch, panels.offset(N, K, bx, k)))
                cpu_gemm_panel(acc, block_n, a_pack, io.b.data, panel, panels.strip, rows, cols, depth)
            _store_cpu_block(spec, io, acc, rows, cols, by * block_m, bx * block_n, out_batch)

    return main


def _gemm_cpu_loops(spec: GemmSpec, s: TileSchedule):
    if spec.packed_b is not None:
        raise SpecError(f"GemmSpec: packed_b is read by the micro-kernel, which takes no {spec.dtype_a} x float32 GEMM")
    M, N, K = spec.M, spec.N, spec.K
    block_m, block_n, block_k = s.block_m, s.block_n, s.block_k
    n_batch = math.prod(spec.batch)
    compute = spec.dtype_acc

    def load_a(a, batch, row, kk):
        index = (*batch, kk, row) if spec.transpose_a else (*batch, row, kk)
        return to_compute(a[index], compute)

    def load_b(b, batch, kk, col):
        index = (*batch, col, kk) if spec.transpose_b else (*batch, kk, col)
        return to_compute(b[index], compute)

    @prim_func
    def main():
        io = declare_gemm_params(spec)
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), n_batch) as (bx, by, bz):
            acc = T.alloc_local((block_m, block_n), compute)
            a_batch, b_batch, out_batch = _batch_coords(spec, bz)
            rows = T.min(block_m, M - by * block_m)
            cols = T.min(block_n, N - bx * block_n)
            T.clear(acc)
            for k in T.serial(T.ceildiv(K, block_k)):
                for i in T.serial(rows):
                    for kk in T.serial(T.min(block_k, K - k * block_k)):
                        # A's element is loaded inline (g++ hoists it): a let-bound bf16 load escapes
                        # tirx.BF16StorageLegalize and would be read as an integer.
                        for j in T.serial(cols):
                            acc[i, j] += load_a(io.a, a_batch, by * block_m + i, k * block_k + kk) * load_b(
                                io.b, b_batch, k * block_k + kk, bx * block_n + j
                            )
            _store_cpu_block(spec, io, acc, rows, cols, by * block_m, bx * block_n, out_batch)

    return main
