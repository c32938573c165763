"""2-D convolution tile programs: ``Y = epilogue(conv2d(X, W))``, NCHW input, OIHW weights.

CPU (c): the implicit GEMM ``[N*OH*OW, C*R*S] x [C*R*S, O]`` on the packed micro-kernel of
tessera/cpu_gemm.h, as the GEMM program runs it (tile/gemm.py): a block owns ``block_m`` output
pixels by ``block_n`` output channels, and for each K step packs its A panel straight from the
input through the window arithmetic (``tessera_cpu_pack_a_conv_*``, zeros in the padding; the
im2col matrix is never built) and its B panel from the weights, read as ``[O, C*R*S]``. The
epilogue (bias ``[1, O, 1, 1]``, residual or gate of the output's shape, activations) runs on the
accumulator as it is stored, channel by channel, so that each channel's pixels are written in order.
There is no GPU program yet.
"""

from __future__ import annotations

from .._tvm import T, prim_func
from .base import SpecError
from .gemm import apply_epilogue, cpu_gemm, cpu_pack, cpu_pack_elements, cpu_pack_suffix, declare_gemm_params
from .schedule import TileSchedule
from .specs import Conv2dSpec


def conv2d_cpu_program(spec: Conv2dSpec, s: TileSchedule):
    """The convolution tile program of the CPU: the implicit GEMM on packed panels."""
    x_dtype, w_dtype = cpu_pack_suffix(spec.dtype_in), cpu_pack_suffix(spec.dtype_w)
    if x_dtype is None or w_dtype is None or spec.dtype_acc != "float32":
        raise SpecError(
            f"Conv2dSpec: {spec.dtype_in} x {spec.dtype_w} accumulating in {spec.dtype_acc}; the CPU convolution "
            "takes float32, float16 or bfloat16 inputs accumulating in float32"
        )
    OH, OW = spec.OH, spec.OW
    # The implicit GEMM's sizes (the pixels are a TIR expression when the batch is symbolic).
    pixels, channels, depth_total = spec.N * OH * OW, spec.O, spec.C * spec.R * spec.S
    block_m, block_n, block_k = s.block_m, s.block_n, s.block_k
    a_elems, b_elems = cpu_pack_elements(block_m, block_n, block_k)
    top, left, _, _ = spec.padding
    window = (spec.C, spec.H, spec.W, OH, OW, spec.R, spec.S, *spec.stride, top, left, *spec.dilation)

    @prim_func
    def main():
        io = declare_gemm_params(spec, ("x", "w"))
        with T.Kernel(T.ceildiv(channels, block_n), T.ceildiv(pixels, block_m)) as (bx, by):
            acc = T.alloc_local((block_m, block_n), "float32")
            a_pack = T.alloc_local((a_elems,), "float32")
            b_pack = T.alloc_local((b_elems,), "float32")
            rows = T.min(block_m, pixels - by * block_m)
            cols = T.min(block_n, channels - bx * block_n)
            T.clear(acc)
            for k in T.serial(T.ceildiv(depth_total, block_k)):
                depth = T.min(block_k, depth_total - k * block_k)
                T.call_extern(
                    "int32",
                    f"tessera_cpu_pack_a_conv_{x_dtype}",
                    T.address_of(a_pack[0]),
                    io.x.data,
                    by * block_m,
                    k * block_k,
                    rows,
                    depth,
                    *window,
                )
                # B[k, o] = W[o, k] of the [O, C*R*S] view: k_stride 1, column stride C*R*S.
                offset = (bx * block_n) * depth_total + k * block_k
                cpu_pack("b", w_dtype, b_pack, io.w.data, offset, 1, depth_total, cols, depth)
                cpu_gemm(acc, block_n, a_pack, b_pack, rows, cols, depth)
            for j in T.serial(cols):
                for i in T.serial(rows):
                    pixel = by * block_m + i
                    n, rest = pixel // (OH * OW), pixel % (OH * OW)
                    index = (n, bx * block_n + j, rest // OW, rest % OW)
                    io.out[index] = T.cast(
                        apply_epilogue(
                            spec,
                            acc[i, j],
                            pixel,
                            bx * block_n + j,
                            (),
                            io.operands,
                            masked=False,
                            host=True,
                            bias_index=(0, bx * block_n + j, 0, 0),
                            tile_index=index,
                        ),
                        spec.dtype_out,
                    )

    return main
