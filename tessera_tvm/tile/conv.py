"""2-D convolution tile programs: ``Y = epilogue(conv2d(X, W))``, NCHW input, OIHW weights.

CPU (c), groups of several input channels: the implicit GEMM ``[N*OH*OW, C/g*R*S] x [C/g*R*S, O/g]``
of each group on the packed micro-kernel of tessera/cpu_gemm.h, as the GEMM program runs it
(tile/gemm.py): a block owns ``block_m`` output pixels by ``block_n`` of its group's output
channels (the grid's third axis is the group), and for each K step packs its A panel straight from
the input through the window arithmetic (``tessera_cpu_pack_a_conv_*``, zeros in the padding; the
im2col matrix is never built) and its B panel from the weights, read as ``[O, C/g*R*S]``.

CPU, direct (``TileSchedule.conv_algorithm == "direct"``, chosen by the planner where it wastes fewer
multiply-adds than the implicit GEMM costs): the GEMM's roles swapped. The register tile's rows are
output channels (A: the weights, read in place when fp32) and its vector columns output pixels, read
in place from a block's zero-padded copy of its input rows (split into phases by the strides), so
nothing is gathered per K step and the epilogue stores rows of NCHW as they lie in the accumulator.

CPU, Winograd (``TileSchedule.conv_algorithm == "winograd"``, 3x3 windows of stride 1, chosen by the
planner where estimated faster than both): F(4x4, 3x3) (tessera/cpu_winograd.h). A block owns
``block_m`` output channels of ``block_n`` output rows of one image and group; it transforms its
channels' weights (U = G g G^T, 36 numbers per filter), then per chunk of ``block_k`` output rows
transforms the input tiles (V = B^T d B), runs the 36 GEMMs U x V over the input channels on the packed
micro-kernel, and transforms back (A^T M A) into channel-major rows that the epilogue stores: 36
multiply-adds per 16 outputs and channel pair where the direct program takes 144.

CPU, depthwise (one input channel per group; ``O/g`` output channels each): a GEMM of one column
would waste the micro-kernel, so a block computes a whole output plane directly. It copies its
input plane into a zero-padded local plane, then ``tessera_cpu_depthwise_f32`` (cpu_conv.h) sums the
window for segments of a row held in vector registers, with no bounds to test.

Each runs the epilogue (bias ``[1, O, 1, 1]``, residual or gate of the output's shape, activations,
clips) on the accumulator as it is stored. There is no GPU program yet.
"""

from __future__ import annotations

from .._tvm import T, pointer_buffer, prim_func
from .base import INT32_ELEMENTS, SpecError
from .common import as_index, element_offset
from .gemm import (
    apply_epilogue,
    cpu_gemm,
    cpu_pack,
    cpu_pack_elements,
    cpu_pack_suffix,
    declare_gemm_params,
)
from .schedule import TileSchedule, _cores_evenly_busy, _round_up
from .specs import Conv2dSpec


@T.macro
def _store(spec: Conv2dSpec, io, value, n, channel, row, col):
    """``value`` (fp32) of output element (n, channel, row, col) through the epilogue into Y."""
    io.out[n, channel, row, col] = T.cast(
        apply_epilogue(
            spec,
            value,
            row,
            channel,
            (),
            io.operands,
            masked=False,
            host=True,
            bias_index=(0, channel, 0, 0),
            tile_index=(n, channel, row, col),
        ),
        spec.dtype_out,
    )


def conv2d_cpu_program(spec: Conv2dSpec, s: TileSchedule):
    """The convolution tile program of the CPU: per-group implicit GEMMs, or the depthwise program."""
    x_dtype, w_dtype = cpu_pack_suffix(spec.dtype_in), cpu_pack_suffix(spec.dtype_w)
    if x_dtype is None or w_dtype is None or spec.dtype_acc != "float32":
        raise SpecError(
            f"Conv2dSpec: {spec.dtype_in} x {spec.dtype_w} accumulating in {spec.dtype_acc}; the CPU convolution "
            "takes float32, float16 or bfloat16 inputs accumulating in float32"
        )
    if s.conv_algorithm == "winograd":  # (refuses a depthwise convolution: it runs its own program)
        return _winograd_cpu_program(spec, s)
    if spec.depthwise:
        return _depthwise_cpu_program(spec)
    _check_pixels(spec)
    if s.conv_algorithm == "direct":
        return _direct_cpu_program(spec, s)
    OH, OW, groups = spec.OH, spec.OW, spec.groups
    group_in, group_out = spec.C // groups, spec.O // groups
    # One group's implicit GEMM (the pixels are a TIR expression when the batch is symbolic).
    pixels, channels, depth_total = spec.N * OH * OW, group_out, group_in * spec.R * spec.S
    block_m, block_n, block_k = s.block_m, s.block_n, s.block_k
    a_elems, b_elems = cpu_pack_elements(block_m, block_n, block_k)
    top, left, _, _ = spec.padding
    window = (spec.C, spec.H, spec.W, OH, OW, spec.R, spec.S, *spec.stride, top, left, *spec.dilation)

    @prim_func
    def main():
        io = declare_gemm_params(spec, ("x", "w"))
        with T.Kernel(T.ceildiv(channels, block_n), T.ceildiv(pixels, block_m), groups) as (bx, by, group):
            acc = T.alloc_local((block_m, block_n), "float32")
            a_pack = T.alloc_local((a_elems,), "float32")
            b_pack = T.alloc_local((b_elems,), "float32")
            rows = T.min(block_m, pixels - by * block_m)
            cols = T.min(block_n, channels - bx * block_n)
            first = group * group_out + bx * block_n  # the block's first output channel
            T.clear(acc)
            for k in T.serial(T.ceildiv(depth_total, block_k)):
                depth = T.min(block_k, depth_total - k * block_k)
                T.call_extern(
                    "int32",
                    f"tessera_cpu_pack_a_conv_{x_dtype}",
                    T.address_of(a_pack[0]),
                    io.x.data,
                    element_offset(io.x, (0, group * group_in, 0, 0)),  # the group's first input channel
                    by * block_m,
                    k * block_k,
                    rows,
                    depth,
                    *window,
                )
                # B[k, o] = W[o, k] of the [O, C/g*R*S] view: k_stride 1, column stride C/g*R*S.
                w_offset = element_offset(io.w, (first, 0, 0, 0)) + as_index(k * block_k, "int64")
                cpu_pack("b", w_dtype, b_pack, io.w.data, w_offset, 1, depth_total, cols, depth)
                cpu_gemm(acc, block_n, a_pack, b_pack, rows, cols, depth)
            # Pixel-major, as the accumulator holds them: g++ vectorises the epilogue over the
            # channels of a pixel (contiguous in acc and in the bias). Channel-major (each channel's
            # pixels stored in order) read acc down its columns, one element at a time: 1.5x slower
            # for a 1x1 conv with a bias (192 x 56x56), 6x with a clip's two selects (a branch).
            for i in T.serial(rows):
                for j in T.serial(cols):
                    pixel = by * block_m + i
                    n, rest = pixel // (OH * OW), pixel % (OH * OW)
                    _store(spec, io, acc[i, j], n, first + j, rest // OW, rest % OW)

    return main


#: Floats past a block's padded pixels that the direct program keeps in its accumulators and past its
#: padded input (TESSERA_CONV_SLACK in tessera/cpu_conv.h): the last pixel tile runs over both.
DIRECT_SLACK = 48

#: K steps of one call of the direct program at most (TESSERA_CONV_MAX_DEPTH: its offsets' array).
DIRECT_MAX_K = 4096

#: Rows the direct program's packed weights add to block_m: the last strip of TESSERA_CONV_MR (at
#: most 14) output channels is zero-padded.
DIRECT_STRIP_PAD = 16


def direct_applies(spec: Conv2dSpec) -> str | None:
    """Why the direct program cannot compute ``spec`` (None where it can)."""
    if spec.depthwise:
        return "a depthwise convolution runs its own program"
    return None


def _phases(taps: int, stride: int, dilation: int) -> int:
    """Phases of a stride that some tap of the window reads (tessera_conv_phase_used)."""
    return len({t * dilation % stride for t in range(taps)})


def direct_layout(spec: Conv2dSpec, rows: int) -> dict[str, int]:
    """The direct program's local sizes for blocks of ``rows`` output rows (tessera/cpu_conv.h): the
    phase width ``Wp`` (the padded width over the column stride), the floats of a phase
    (``phase_plane``) and of a channel (``plane``, its kept phases) of the padded input, and of all
    of it (``xpad``, with ``slack``), the accumulator's row stride (``acc_stride``, one row per output
    channel) and the padded ``pixels`` of a full block."""
    top, left, bottom, right = spec.padding
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    phase_w = -(-(spec.W + left + right) // sw)
    phase_plane = (rows + (spec.R - 1) * dh // sh) * phase_w
    plane = _phases(spec.R, sh, dh) * _phases(spec.S, sw, dw) * phase_plane
    slack = DIRECT_SLACK + (spec.S - 1) * dw
    pixels = rows * phase_w
    return {
        "Wp": phase_w,
        "phase_plane": phase_plane,
        "plane": plane,
        "slack": slack,
        "xpad": spec.C // spec.groups * plane + slack,
        "pixels": pixels,
        "acc_stride": _round_up(pixels, 16) + DIRECT_SLACK,
    }


#: Output channels of the direct program's register tile (TESSERA_CONV_MR on AVX-512): block_m is
#: rounded to it. Its pixel tile is 48 floats (TESSERA_CONV_TILE), the last one of a block as narrow
#: as a vector of DIRECT_TAIL floats.
DIRECT_CHANNELS, DIRECT_TAIL = 8, 16

#: What the implicit GEMM costs per multiply-add of its register tiles against the direct program's:
#: packing A (the im2col gather) and B (the weights, at every call) and the transposing store.
#: Measured on this Zen 5 at 1 thread, 3x3 convs: 1.30 at 56x56 C=64 (1.36 vs 1.08 ms), 1.36 at 7x7
#: C=512 (1.80 vs 1.52 ms, where the direct program computes 64 padded pixels per 49, the GEMM 56).
IMPLICIT_GEMM_COST = 1.3

#: Floats of the direct program's accumulator per block, at most (rows of a block are cut to fit):
#: with the packed weights it stays well under the CPU's local_memory_per_kernel.
DIRECT_ACC_FLOATS = 112 * 1024

#: K steps of the direct program at most: a 3x3 window of 64 input channels (its packed weights,
#: 80 x 576 floats, 180 KiB, stay in L2 across a block's pixel tiles).
DIRECT_BLOCK_K = 576


def direct_schedule(spec: Conv2dSpec, schedule: TileSchedule, cores: int) -> TileSchedule:
    """``schedule`` with the direct program's blocks for ``spec``: up to 64 output channels (whole register strips) by
    as many output rows as the accumulator holds, split until every core has a block (a multiple of
    the cores while there are few per core), rows evened out; the K step a whole window where it fits.
    Few, large blocks measured best (56x56 C=64: 2 blocks of 28 rows, 0.53 ms on 2 cores, against
    0.61-0.66 ms for 7-14 blocks of 4-8 rows)."""
    group_out = spec.O // spec.groups
    block_m = min(64, _round_up(group_out, DIRECT_CHANNELS))
    padded_w = direct_layout(spec, 1)["Wp"]
    rows = max(1, min(spec.OH, (DIRECT_ACC_FLOATS // block_m - 2 * DIRECT_SLACK) // padded_w))
    row_blocks = -(-spec.OH // rows)
    others = -(-group_out // block_m) * spec.groups * (spec.N if isinstance(spec.N, int) else 1)
    while rows > 1 and not _cores_evenly_busy(row_blocks * others, cores):
        row_blocks += 1
        rows = -(-spec.OH // row_blocks)
    rows = -(-spec.OH // -(-spec.OH // rows))  # even: 56 rows in 2 blocks of 28
    depth = spec.C // spec.groups * spec.R * spec.S
    block_k = depth if depth <= DIRECT_BLOCK_K else _round_up(-(-depth // -(-depth // DIRECT_BLOCK_K)), 8)
    return schedule.replace(block_m=block_m, block_n=rows, block_k=block_k, conv_algorithm="direct")


def direct_wins(spec: Conv2dSpec, direct: TileSchedule) -> bool:
    """Whether the direct program under ``direct`` is estimated faster than the implicit GEMM: the
    multiply-adds each computes for the outputs (the direct one pads every block's pixels to its
    padded width and its pixel tile, and channels to its strips; the implicit GEMM pads pixels to
    its 14 rows and channels to its 32 columns), the implicit GEMM's at IMPLICIT_GEMM_COST each.
    On small planes the padded width wastes most (7x7: 9 of every 7 columns): there the implicit
    GEMM may stay."""
    group_out, rows = spec.O // spec.groups, direct.block_n
    padded_w = direct_layout(spec, rows)["Wp"]
    direct_waste = _round_up(rows * padded_w, DIRECT_TAIL) / (rows * spec.OW)
    direct_waste *= _round_up(group_out, DIRECT_CHANNELS) / group_out
    pixels = spec.OH * spec.OW
    implicit_waste = _round_up(pixels, 14) / pixels * _round_up(group_out, 32) / group_out
    return direct_waste < IMPLICIT_GEMM_COST * implicit_waste


def direct_local_floats(spec: Conv2dSpec, s: TileSchedule) -> int:
    """Floats of the direct program's local arrays: the accumulator and the packed weights (the
    padded input lives in the thread's workspace)."""
    packed = (s.block_m + DIRECT_STRIP_PAD) * s.block_k if spec.dtype_w != "float32" else 1
    return s.block_m * direct_layout(spec, s.block_n)["acc_stride"] + packed


def _direct_cpu_program(spec: Conv2dSpec, s: TileSchedule):
    """Convolution with the GEMM's roles swapped (tessera_cpu_conv_direct_f32, tessera/cpu_conv.h): a
    block owns ``block_m`` output channels of ``block_n`` output rows of one image and group. It
    copies the input rows they read into a zero-padded fp32 buffer in the thread's workspace (split
    into phases by the strides), and per K step accumulates acc[channel, padded pixel] from the
    weights (fp32: read in place; fp16/bf16: packed as A strips) and the buffer, read in place as B;
    the epilogue stores each channel's rows, contiguous in acc and in Y."""
    x_dtype, w_dtype = cpu_pack_suffix(spec.dtype_in), cpu_pack_suffix(spec.dtype_w)
    if s.block_k > DIRECT_MAX_K:
        raise SpecError(
            f"Conv2dSpec: block_k={s.block_k}; the direct convolution takes K steps of at most {DIRECT_MAX_K}"
        )
    OH, OW, R, S, groups = spec.OH, spec.OW, spec.R, spec.S, spec.groups
    (sh, sw), (dh, dw), (top, left, _, _) = spec.stride, spec.dilation, spec.padding
    group_in, group_out = spec.C // groups, spec.O // groups
    depth_total = group_in * R * S
    block_m, rows, block_k = s.block_m, s.block_n, s.block_k
    layout = direct_layout(spec, rows)
    Wp, plane, phase_plane, acc_stride = layout["Wp"], layout["plane"], layout["phase_plane"], layout["acc_stride"]
    window = (Wp, R, S, sh, sw, dh, dw)
    packs = spec.dtype_w != "float32"  # fp32 weights are read in place, rows contiguous in k
    a_elems = (block_m + DIRECT_STRIP_PAD) * block_k if packs else 1

    @prim_func
    def main():
        io = declare_gemm_params(spec, ("x", "w"))
        with T.Kernel(T.ceildiv(group_out, block_m), T.ceildiv(OH, rows), spec.N * groups) as (bx, by, bz):
            acc = T.alloc_local((block_m * acc_stride,), "float32")
            a_pack = T.alloc_local((a_elems,), "float32")
            n, group = bz // groups, bz % groups
            live_rows = T.min(rows, OH - by * rows)
            channels = T.min(block_m, group_out - bx * block_m)
            first = group * group_out + bx * block_m  # the block's first output channel
            address = T.call_extern("handle", "tessera_cpu_workspace", T.int64(layout["xpad"]), T.int64(0))
            xpad = pointer_buffer(address, (layout["xpad"],), "float32")
            T.call_extern(
                "int32",
                f"tessera_cpu_conv_rows_{x_dtype}",
                T.address_of(xpad[0]),
                io.x.data,
                element_offset(io.x, (n, group * group_in, 0, 0)),
                group_in,
                spec.H,
                spec.W,
                by * rows,
                T.int64(plane),
                T.int64(phase_plane),
                *window,
                top,
                left,
                layout["slack"],
            )
            for k in T.serial(T.ceildiv(depth_total, block_k)):
                depth = T.min(block_k, depth_total - k * block_k)
                w_offset = element_offset(io.w, (first, 0, 0, 0)) + as_index(k * block_k, "int64")
                if packs:
                    T.call_extern(
                        "int32",
                        f"tessera_cpu_conv_pack_w_{w_dtype}",
                        T.address_of(a_pack[0]),
                        io.w.data,
                        w_offset,
                        T.int64(depth_total),
                        as_index(channels, "int32"),
                        as_index(depth, "int32"),
                    )
                T.call_extern(
                    "int32",
                    "tessera_cpu_conv_direct_f32",
                    T.address_of(acc[0]),
                    T.int64(acc_stride),
                    *(
                        (T.address_of(a_pack[0]), T.int64(0), T.int64(0))
                        if packs
                        else (io.w.data, w_offset, T.int64(depth_total))
                    ),
                    T.address_of(xpad[0]),
                    as_index(k * block_k, "int32"),
                    as_index(depth, "int32"),
                    as_index(channels, "int32"),
                    as_index(live_rows * Wp, "int32"),
                    T.int64(plane),
                    T.int64(phase_plane),
                    *window,
                    T.Select(k == 0, 1, 0),
                )
            # Channel-major: each output row is a run of acc (row stride Wp) and of Y.
            for j in T.serial(channels):
                for oh in T.serial(live_rows):
                    for ow in T.serial(OW):
                        _store(spec, io, acc[j * acc_stride + oh * Wp + ow], n, first + j, by * rows + oh, ow)

    return main


#: The Winograd program's output tile: F(4x4, 3x3) (tessera/cpu_winograd.h). F(2x2, 3x3) takes 16
#: multiply-adds per 4 outputs (2.25x fewer than 36, against F(4x4)'s 4x) and measured 1.52x the
#: direct program's speed at 56x56 C=64 where F(4x4) measured 2.6x; F(4x4)'s error is ~15x the direct
#: program's (2e-5 against 1.3e-6 at most, 64 channels, outputs of rms 1.4: float64 reference).
WINOGRAD_TILE = 4

#: Tiles a chunk of the Winograd program computes at least (its rows rounded up to whole tile rows):
#: three strips of the micro-kernel's 14 rows. 56x56 C=64: chunks of 3 tile rows (42 tiles) measured
#: 0.49 ms, of 2 rows 0.51 ms, of 4 rows 0.57 ms (the transformed tiles, 36 x 42 x 64 floats each way,
#: stay in L2).
WINOGRAD_CHUNK_TILES = 40

#: What the Winograd program's transforms cost, in multiply-adds of the micro-kernel (measured at 1
#: thread on this Zen 5 against its 36 GEMMs): per input channel and tile (the input transform, once
#: per block of output channels), per output channel and tile (the output transform), and per filter
#: of a block (the weights' transform, once per block of rows).
WINOGRAD_INPUT_COST, WINOGRAD_OUTPUT_COST, WINOGRAD_WEIGHT_COST = 740, 370, 430

#: Floats the Winograd program's bounds add for the C side's roundings (tessera/cpu_winograd.h): the
#: micro-kernel's strips (MR <= 14 tiles, NR <= 64 channels) and a cache line between positions.
WINOGRAD_PAD = 64


def winograd_applies(spec: Conv2dSpec) -> str | None:
    """Why the Winograd program cannot compute ``spec`` (None where it can)."""
    if spec.depthwise:
        return "a depthwise convolution runs its own program"
    if (spec.R, spec.S) != (3, 3):
        return f"the window is {spec.R}x{spec.S}; Winograd F(4x4, 3x3) takes 3x3 windows"
    if tuple(spec.stride) != (1, 1):
        return f"stride is {tuple(spec.stride)}; Winograd F(4x4, 3x3) takes stride (1, 1)"
    if tuple(spec.dilation) != (1, 1):
        return f"dilation is {tuple(spec.dilation)}; Winograd F(4x4, 3x3) takes dilation (1, 1)"
    return None


def winograd_layout(spec: Conv2dSpec, s: TileSchedule) -> dict[str, int]:
    """The Winograd program's sizes under ``s``: tiles per row (``tile_w``), tile rows per chunk
    (``chunk_rows``), the accumulator's row stride and floats per channel (``row_stride``,
    ``acc_stride``), and the thread's workspace: the block's transformed weights (``u_floats``) and
    all of it (``floats``). Bounds of what tessera/cpu_winograd.h lays out (it checks them)."""
    m, positions = WINOGRAD_TILE, (WINOGRAD_TILE + 2) ** 2
    group_in = spec.C // spec.groups
    tile_w = -(-spec.OW // m)
    chunk_rows = -(-s.block_k // m)
    tiles = chunk_rows * tile_w
    row_stride = _round_up(tile_w * m, 16)
    channels = _round_up(s.block_m, WINOGRAD_PAD)
    u_floats = positions * (channels * group_in + WINOGRAD_PAD)
    xph = (chunk_rows * m + 2) * m * (tile_w + 1) + WINOGRAD_PAD
    v = positions * ((tiles + WINOGRAD_PAD) * group_in + WINOGRAD_PAD)
    gemm_out = positions * (tiles * channels + WINOGRAD_PAD)
    return {
        "tile_w": tile_w,
        "chunk_rows": chunk_rows,
        "row_stride": row_stride,
        "acc_stride": chunk_rows * m * row_stride,
        "u_floats": u_floats,
        "floats": u_floats + xph + v + gemm_out,
    }


def winograd_schedule(spec: Conv2dSpec, schedule: TileSchedule, cores: int) -> TileSchedule:
    """``schedule`` with the Winograd program's blocks for ``spec``: up to 64 output channels by whole
    images, the rows split (in whole tile rows) until every core has a block; chunks of at least
    WINOGRAD_CHUNK_TILES tiles."""
    m, group_out = WINOGRAD_TILE, spec.O // spec.groups
    block_m = min(64, _round_up(group_out, 16))
    tile_w, tile_rows = -(-spec.OW // m), -(-spec.OH // m)
    others = -(-group_out // block_m) * spec.groups * (spec.N if isinstance(spec.N, int) else 1)
    row_blocks = 1
    while row_blocks < tile_rows and not _cores_evenly_busy(row_blocks * others, cores):
        row_blocks += 1
    block_rows = -(-tile_rows // row_blocks)
    chunk = min(block_rows, -(-WINOGRAD_CHUNK_TILES // tile_w))
    chunk = -(-block_rows // -(-block_rows // chunk))  # even: 7 tile rows in chunks of 3, 3, 1 -> 3
    return schedule.replace(block_m=block_m, block_n=block_rows * m, block_k=chunk * m, conv_algorithm="winograd")


def winograd_wins(spec: Conv2dSpec, winograd: TileSchedule, other: TileSchedule | None) -> bool:
    """Whether the Winograd program under ``winograd`` is estimated faster than ``other`` (the direct
    program's schedule, or None for the implicit GEMM): the multiply-adds each computes, with the
    Winograd program's 36 GEMMs over its padded tiles (the micro-kernel's strips of 14) plus its
    transforms (WINOGRAD_*_COST). Small planes lose: few tiles per weight (7x7 C=512 takes 37 MB
    of transformed weights for 4 tiles)."""
    m, group_in, group_out = WINOGRAD_TILE, spec.C // spec.groups, spec.O // spec.groups
    tile_w, layout = -(-spec.OW // m), winograd_layout(spec, winograd)
    row_blocks, channel_blocks = -(-spec.OH // winograd.block_n), -(-group_out // winograd.block_m)
    chunks_per_block = -(-winograd.block_n // winograd.block_k)
    tiles = row_blocks * chunks_per_block * _round_up(layout["chunk_rows"] * tile_w, 14)
    cost = (m + 2) ** 2 * tiles * group_in * _round_up(group_out, 16)
    cost += WINOGRAD_INPUT_COST * group_in * tiles * channel_blocks + WINOGRAD_OUTPUT_COST * group_out * tiles
    cost += WINOGRAD_WEIGHT_COST * group_out * group_in * row_blocks
    macs = group_out * group_in * 9 * spec.OH * spec.OW  # per image and group
    if other is None:
        pixels = spec.OH * spec.OW
        other_cost = IMPLICIT_GEMM_COST * macs * _round_up(pixels, 14) / pixels * _round_up(group_out, 32) / group_out
    else:
        rows, padded_w = other.block_n, direct_layout(spec, other.block_n)["Wp"]
        waste = _round_up(rows * padded_w, DIRECT_TAIL) / (rows * spec.OW)
        other_cost = macs * waste * _round_up(group_out, DIRECT_CHANNELS) / group_out
    return cost < other_cost


def winograd_local_floats(spec: Conv2dSpec, s: TileSchedule) -> int:
    """Floats of the Winograd program's local array: a chunk's accumulator (the transformed weights
    and tiles live in the thread's workspace)."""
    return s.block_m * winograd_layout(spec, s)["acc_stride"]


def _winograd_cpu_program(spec: Conv2dSpec, s: TileSchedule):
    """Winograd F(4x4, 3x3) (tessera/cpu_winograd.h): a block owns ``block_m`` output channels of
    ``block_n`` output rows of one image and group. It transforms its channels' weights into the
    thread's workspace, then per chunk of ``block_k`` output rows calls the chunk routine (input
    transform, 36 GEMMs, output transform into acc, channel-major) and stores the chunk's rows
    through the epilogue."""
    why = winograd_applies(spec)
    if why is not None:
        raise SpecError(f"Conv2dSpec: conv_algorithm='winograd' cannot run this convolution: {why}")
    x_dtype, w_dtype = cpu_pack_suffix(spec.dtype_in), cpu_pack_suffix(spec.dtype_w)
    m, OH, OW, groups = WINOGRAD_TILE, spec.OH, spec.OW, spec.groups
    top, left, _, _ = spec.padding
    group_in, group_out = spec.C // groups, spec.O // groups
    block_m, rows, block_k = s.block_m, s.block_n, s.block_k
    layout = winograd_layout(spec, s)
    acc_stride, row_stride, floats = layout["acc_stride"], layout["row_stride"], layout["floats"]

    @prim_func
    def main():
        io = declare_gemm_params(spec, ("x", "w"))
        with T.Kernel(T.ceildiv(group_out, block_m), T.ceildiv(OH, rows), spec.N * groups) as (bx, by, bz):
            acc = T.alloc_local((block_m * acc_stride,), "float32")
            n, group = bz // groups, bz % groups
            live_rows = T.min(rows, OH - by * rows)
            channels = T.min(block_m, group_out - bx * block_m)
            first = group * group_out + bx * block_m  # the block's first output channel
            address = T.call_extern("handle", "tessera_cpu_workspace", T.int64(floats), T.int64(0))
            workspace = pointer_buffer(address, (floats,), "float32")
            T.call_extern(
                "int32",
                f"tessera_cpu_winograd_weights_m{m}_{w_dtype}",
                T.address_of(workspace[0]),
                io.w.data,
                element_offset(io.w, (first, 0, 0, 0)),
                group_in,
                as_index(channels, "int32"),
            )
            for chunk in T.serial(T.ceildiv(live_rows, block_k)):
                chunk_rows = T.min(block_k, live_rows - chunk * block_k)
                oh0 = by * rows + chunk * block_k  # the chunk's first output row
                T.call_extern(
                    "int32",
                    f"tessera_cpu_winograd_m{m}_{x_dtype}",
                    T.address_of(acc[0]),
                    T.int64(acc_stride),
                    row_stride,
                    T.address_of(workspace[0]),
                    T.int64(floats),
                    T.int64(layout["u_floats"]),
                    io.x.data,
                    element_offset(io.x, (n, group * group_in, 0, 0)),
                    group_in,
                    spec.H,
                    spec.W,
                    top,
                    left,
                    as_index(oh0, "int32"),
                    as_index(T.ceildiv(chunk_rows, m), "int32"),
                    layout["tile_w"],
                    as_index(channels, "int32"),
                )
                # Channel-major, as the direct program's: each output row is a run of acc and of Y.
                for j in T.serial(channels):
                    for oh in T.serial(chunk_rows):
                        for ow in T.serial(OW):
                            _store(spec, io, acc[j * acc_stride + oh * row_stride + ow], n, first + j, oh0 + oh, ow)

    return main


def _check_pixels(spec: Conv2dSpec) -> None:
    """The packing routine numbers the implicit GEMM's rows (output pixels) in int32."""
    pixels = spec.N * spec.OH * spec.OW
    if isinstance(pixels, int) and pixels >= INT32_ELEMENTS:
        raise SpecError(
            f"Conv2dSpec: output Y has {pixels} pixels (N*OH*OW = {spec.N}*{spec.OH}*{spec.OW}); the CPU convolution "
            f"numbers them in int32 and takes fewer than {INT32_ELEMENTS}: split the batch"
        )


def depthwise_planes(spec: Conv2dSpec) -> tuple[int, int]:
    """Elements of the depthwise program's two local planes: the padded input, the accumulators."""
    top, left, bottom, right = spec.padding
    return (spec.H + top + bottom) * (spec.W + left + right), spec.OH * spec.OW


def _depthwise_cpu_program(spec: Conv2dSpec):
    """Depthwise convolution on the CPU: a block per output plane (n, o), reading input channel
    ``o // (O / C)``. The block copies that input plane into a zero-padded local plane once and its
    window's weights to fp32; ``tessera_cpu_depthwise_f32`` then sums the window into a plane of fp32
    accumulators, a row segment at a time in vector registers, and the epilogue stores it."""
    OH, OW, R, S = spec.OH, spec.OW, spec.R, spec.S
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    top, left, _, right = spec.padding
    padded_w = spec.W + left + right
    padded_elems, acc_elems = depthwise_planes(spec)
    multiplier = spec.O // spec.C

    @prim_func
    def main():
        io = declare_gemm_params(spec, ("x", "w"))
        with T.Kernel(spec.O, spec.N) as (o, n):
            padded = T.alloc_local((padded_elems,), "float32")
            acc = T.alloc_local((acc_elems,), "float32")
            weights = T.alloc_local((R * S,), "float32")
            c = o // multiplier
            for i in T.serial(padded_elems):
                padded[i] = T.float32(0)
            for y in T.serial(spec.H):
                for x in T.serial(spec.W):
                    padded[(y + top) * padded_w + x + left] = T.cast(io.x[n, c, y, x], "float32")
            for r in T.serial(R):
                for s in T.serial(S):
                    weights[r * S + s] = T.cast(io.w[o, 0, r, s], "float32")
            T.call_extern(
                "int32",
                "tessera_cpu_depthwise_f32",
                T.address_of(acc[0]),
                T.address_of(padded[0]),
                T.address_of(weights[0]),
                R,
                S,
                OH,
                OW,
                padded_w,
                sh,
                sw,
                dh,
                dw,
            )
            for oh in T.serial(OH):
                for ow in T.serial(OW):
                    _store(spec, io, acc[oh * OW + ow], n, o, oh, ow)

    return main
