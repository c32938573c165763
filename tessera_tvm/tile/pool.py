"""2-D pooling tile program of the CPU: ``Y = max_pool2d / avg_pool2d(X)``, NCHW, as torch computes it.

A block per input plane (n, c): it copies the plane into a padded local plane (-inf around it for
max, zeros for avg; as far as a ceil-mode window reaches), then for each window offset combines the
strided view into a plane of fp32 accumulators, in loops with no bounds to test; the store divides an
average by its window's count (torch's: the window within the padded input, or with
``count_include_pad=False`` its elements inside the input).
"""

from __future__ import annotations

from .._tvm import T, prim_func
from .common import declare_params, lowest, nan_max, to_compute
from .schedule import TileSchedule
from .specs import Pool2dSpec


def padded_plane(spec: Pool2dSpec) -> tuple[int, int]:
    """Rows and columns of the padded local plane: the input and its padding, and past them what the
    last (ceil-mode) window reads."""
    (R, S), (sh, sw), (dh, dw) = spec.pool, spec.stride, spec.dilation
    top, left, bottom, right = spec.padding
    rows = max(spec.H + top + bottom, (spec.OH - 1) * sh + (R - 1) * dh + 1)
    cols = max(spec.W + left + right, (spec.OW - 1) * sw + (S - 1) * dw + 1)
    return rows, cols


def pool2d_cpu_program(spec: Pool2dSpec, _s: TileSchedule):
    """The pooling tile program of the CPU (see the module docstring)."""
    OH, OW, (R, S) = spec.OH, spec.OW, spec.pool
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    top, left, bottom, right = spec.padding
    rows, cols = padded_plane(spec)
    is_max = spec.kind == "max"

    @prim_func
    def main():
        io = declare_params(spec.params())
        x, y = io.buffers
        with T.Kernel(spec.C, spec.N) as (c, n):
            padded = T.alloc_local((rows * cols,), "float32")
            acc = T.alloc_local((OH * OW,), "float32")
            fill = lowest("float32") if is_max else T.float32(0)
            for i in T.serial(rows * cols):
                padded[i] = fill
            for yy in T.serial(spec.H):
                for xx in T.serial(spec.W):
                    padded[(yy + top) * cols + xx + left] = to_compute(x[n, c, yy, xx], "float32")
            for i in T.serial(OH * OW):
                acc[i] = fill
            for r in T.serial(R):
                for s in T.serial(S):
                    for oh in T.serial(OH):
                        for ow in T.serial(OW):
                            value = padded[(oh * sh + r * dh) * cols + ow * sw + s * dw]
                            if is_max:
                                acc[oh * OW + ow] = nan_max(acc[oh * OW + ow], value, host=True)
                            else:
                                acc[oh * OW + ow] += value
            for oh in T.serial(OH):
                for ow in T.serial(OW):
                    if is_max:
                        y[n, c, oh, ow] = T.cast(acc[oh * OW + ow], spec.dtype_out)
                    else:
                        y0, x0 = oh * sh - top, ow * sw - left
                        y1, x1 = T.min(y0 + R, spec.H + bottom), T.min(x0 + S, spec.W + right)
                        if not spec.count_include_pad:  # only the window's elements inside the input
                            y0, x0, y1, x1 = T.max(y0, 0), T.max(x0, 0), T.min(y1, spec.H), T.min(x1, spec.W)
                        count = T.cast((y1 - y0) * (x1 - x0), "float32")
                        y[n, c, oh, ow] = T.cast(acc[oh * OW + ow] / count, spec.dtype_out)

    return main
