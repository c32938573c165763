"""Row-reduction tile programs: reductions (sum/max/mean), softmax, layer_norm and rms_norm.

Every kernel views its input as ``[outer, R, inner]`` around the reduced axes: a *row* is one
(outer, inner) pair and has ``R`` elements. A block owns ``block_m`` rows and walks each row in
steps of ``block_n`` elements; statistics accumulate in fp32 (an integer reduction in int32).

GPU: a ``block_m x block_n`` fp32 fragment holds per-lane partial results across the steps, then
``T.reduce_sum`` / ``T.reduce_max`` combine the lanes. Reads past the row end or past the last row
are masked with the operation's identity (0 for sums, -inf for max), writes by an ``if``. A NaN
propagates as in torch: max combines with ``nan_max`` (tile/common.py), and the GPU max, whose
``T.reduce_max`` drops NaN lanes, adds back the sum of its NaN lanes.
Softmax keeps a per-lane running max and rescaled sum (online softmax), so it reads its input
twice; layer_norm computes the mean, then the variance around it, then writes (three reads).

CPU: one row at a time; each statistic is a lane_reduce over CPU_LANES partial results (independent
lanes, which g++ vectorises without -ffast-math), softmax's exponentials by the inline tessera_expf.
"""

from __future__ import annotations

import math

from .._tvm import T, prim_func
from .base import clamp
from .common import (
    CPU_LANES,
    all_of,
    cpu_exp,
    declare_params,
    guard,
    lane_chunks,
    lane_reduce,
    lowest,
    nan_max,
    to_compute,
    unravel,
)
from .schedule import TileSchedule
from .specs import NormSpec, ReduceSpec, SoftmaxSpec

ACC = "float32"


class RowView:
    """Index arithmetic of the ``[outer, R, inner]`` view of a tensor reduced over ``axes``."""

    def __init__(self, shape: tuple[int, ...], axes: tuple[int, ...]):
        first, last = axes[0], axes[-1]
        self.shape = shape
        self.outer_dims = shape[:first]
        self.reduced_dims = shape[first : last + 1]
        self.inner_dims = shape[last + 1 :]
        self.inner = math.prod(self.inner_dims)
        self.length = math.prod(self.reduced_dims)
        self.rows = math.prod(self.outer_dims) * self.inner

    def _split(self, row):
        if self.inner == 1:
            return row, 0
        return row // self.inner, row % self.inner

    def index(self, row, r) -> tuple:
        """Input coordinates of element ``r`` of row ``row``."""
        return self.coords(*self._split(row), r)

    def coords(self, outer, inner, r) -> tuple:
        """Input coordinates of element ``r`` of the row at (``outer``, ``inner``)."""
        return (*unravel(outer, self.outer_dims), *unravel(r, self.reduced_dims), *unravel(inner, self.inner_dims))

    def reduced_index(self, row, keepdims: bool) -> tuple:
        """Output coordinates of row ``row`` once the axes are reduced."""
        return self.reduced_coords(*self._split(row), keepdims)

    def reduced_coords(self, outer, inner, keepdims: bool) -> tuple:
        """Output coordinates of the row at (``outer``, ``inner``) once the axes are reduced."""
        kept = [0] * len(self.reduced_dims) if keepdims else []
        index = (*unravel(outer, self.outer_dims), *kept, *unravel(inner, self.inner_dims))
        return index or (0,)

    def load(self, buf, row, r, dtype: str = ACC):
        return to_compute(buf[self.index(row, r)], dtype)


# ---------------------------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------------------------


def _reduce_setup(spec: ReduceSpec, schedule: TileSchedule) -> tuple:
    """What both reduction programs read: the row view, sizes, blocks, params and the operation's
    identity, combine and finish steps."""
    view = RowView(spec.shape, spec.axis)
    rows, length = view.rows, view.length
    block_m = clamp(schedule.block_m, rows)
    block_n = schedule.block_n
    is_max = spec.kind == "max"
    params = spec.params()
    acc = reduce_acc(spec)

    def identity():
        return (lowest(acc) if acc == ACC else T.min_value(acc)) if is_max else T.cast(0, acc)

    def combine(total, value, host=False):
        return nan_max(total, value, host) if is_max else total + value

    def finish(total):
        if spec.kind != "mean":
            return total
        # An integer mean truncates toward zero, as the reference's cast of its mean does.
        return total / T.cast(length, acc) if acc == ACC else T.truncdiv(total, T.cast(length, acc))

    return view, rows, length, block_m, block_n, is_max, params, identity, combine, finish


def reduce_acc(spec: ReduceSpec) -> str:
    """The accumulator of a reduction: fp32, int32 for integer inputs (exact, wrapping as the
    reference's int32 sums; in fp32 an int32 max lost its low bits and saturated)."""
    return "int32" if spec.dtype_in.startswith("int") else ACC


#: Contiguous elements after the reduced axes from which the CPU reduces whole runs of them at once
#: (:func:`_reduce_cpu_columns`), and the most a block takes.
CPU_COLUMNS_FROM = 8
CPU_COLUMN_BLOCK = 512


def reduce_cpu_program(spec: ReduceSpec, schedule: TileSchedule):
    """sum / max / mean over consecutive axes on the CPU: one row at a time, lane_reduce over CPU_LANES;
    over axes followed by a static ``CPU_COLUMNS_FROM`` or more elements, runs of columns at a time."""
    view, rows, length, block_m, block_n, is_max, params, identity, combine, finish = _reduce_setup(spec, schedule)
    if isinstance(view.inner, int) and view.inner >= CPU_COLUMNS_FROM:  # a symbolic run: row by row
        return _reduce_cpu_columns(spec, view, length, params, identity, combine, finish)

    @prim_func
    def main():
        io = declare_params(params, ("x", "out"))
        with T.Kernel(T.ceildiv(rows, block_m)) as bx:
            lanes = T.alloc_local((CPU_LANES,), reduce_acc(spec))
            for i in T.serial(T.min(block_m, rows - bx * block_m)):
                lane_reduce(
                    lanes,
                    length,
                    identity(),
                    lambda acc, value: combine(acc, value, host=True),
                    lambda r, i=i: view.load(io.x, bx * block_m + i, r, reduce_acc(spec)),
                )
                io.out[view.reduced_index(bx * block_m + i, spec.keepdims)] = T.cast(finish(lanes[0]), spec.dtype_out)

    return main


def _reduce_cpu_columns(spec: ReduceSpec, view: RowView, length: int, params, identity, combine, finish):
    """The CPU reduction over axes followed by ``inner`` contiguous elements ([outer, R, inner]): a
    block owns up to CPU_COLUMN_BLOCK consecutive columns of one outer index and adds each of the R
    rows into them in turn (a loop over contiguous columns, which g++ vectorises). Row by row, each
    (outer, inner) pair reduced its R elements on its own: a sum over an axis of 2 in [128, 2, 256]
    (Mixtral's top-2 experts) took 408 us against torch's 38-43."""
    inner, outer = view.inner, view.rows // view.inner
    width = min(inner, CPU_COLUMN_BLOCK)
    chunks = -(-inner // width)
    acc = reduce_acc(spec)

    @prim_func
    def main():
        io = declare_params(params, ("x", "out"))
        with T.Kernel(outer * chunks) as bx:
            totals = T.alloc_local((width,), acc)
            first = (bx % chunks) * width
            live = T.min(width, inner - first)
            for j in T.serial(live):
                totals[j] = identity()
            for r in T.serial(length):
                for j in T.serial(live):
                    value = io.x[view.coords(bx // chunks, first + j, r)]
                    totals[j] = combine(totals[j], to_compute(value, acc), host=True)
            for j in T.serial(live):
                io.out[view.reduced_coords(bx // chunks, first + j, spec.keepdims)] = T.cast(
                    finish(totals[j]), spec.dtype_out
                )

    return main


def reduce_gpu_program(spec: ReduceSpec, schedule: TileSchedule):
    """sum / max / mean over consecutive axes on a thread-block target: a fragment of lanes, T.reduce_*."""
    view, rows, length, block_m, block_n, is_max, params, identity, combine, finish = _reduce_setup(spec, schedule)
    acc = reduce_acc(spec)
    nan_lanes = is_max and acc == ACC  # integers have no NaN

    @prim_func
    def main():
        io = declare_params(params, ("x", "out"))
        with T.Kernel(T.ceildiv(rows, block_m), threads=schedule.threads) as bx:
            lanes = T.alloc_fragment((block_m, block_n), acc)
            total = T.alloc_fragment((block_m,), acc)
            nans = T.alloc_fragment((block_m,), acc)
            T.fill(lanes, identity())
            for step in T.serial(T.ceildiv(length, block_n)):
                for i, j in T.Parallel(block_m, block_n):
                    lanes[i, j] = combine(
                        lanes[i, j],
                        guard(
                            all_of(bx * block_m + i < rows, step * block_n + j < length),
                            view.load(io.x, bx * block_m + i, step * block_n + j, acc),
                            identity(),
                        ),
                    )
            if is_max:
                T.reduce_max(lanes, total, dim=1)
            else:
                T.reduce_sum(lanes, total, dim=1)
            if nan_lanes:
                # T.reduce_max combines the lanes with fmaxf, which drops a NaN lane: the sum of the
                # NaN lanes (0 without one) is added back, so a row with a NaN gives NaN.
                for i, j in T.Parallel(block_m, block_n):
                    lanes[i, j] = T.if_then_else(T.isnan(lanes[i, j]), lanes[i, j], T.cast(0, ACC))
                T.reduce_sum(lanes, nans, dim=1)
            for i in T.Parallel(block_m):
                if bx * block_m + i < rows:
                    io.out[view.reduced_index(bx * block_m + i, spec.keepdims)] = T.cast(
                        finish(total[i] + nans[i] if nan_lanes else total[i]), spec.dtype_out
                    )

    return main


# ---------------------------------------------------------------------------------------------
# Softmax
# ---------------------------------------------------------------------------------------------


def _rescaled(total, old_max, new_max, value):
    """Online softmax: ``total * exp(old_max - new_max) + exp(value - new_max)``, 0 while all are -inf."""
    return T.if_then_else(
        new_max == lowest(ACC), T.cast(0, ACC), total * T.exp(old_max - new_max) + T.exp(value - new_max)
    )


def softmax_cpu_program(spec: SoftmaxSpec, schedule: TileSchedule):
    """Numerically stable softmax along ``spec.axis`` on the CPU (one row at a time)."""
    view = RowView(spec.shape, (spec.axis,))
    return _softmax_cpu(spec, view, clamp(schedule.block_m, view.rows))


def softmax_gpu_program(spec: SoftmaxSpec, schedule: TileSchedule):
    """Numerically stable (online) softmax along ``spec.axis`` on a thread-block target."""
    view = RowView(spec.shape, (spec.axis,))
    rows, length = view.rows, view.length
    block_m = clamp(schedule.block_m, rows)
    block_n = schedule.block_n
    params = spec.params()

    @prim_func
    def main():
        io = declare_params(params, ("x", "out"))
        with T.Kernel(T.ceildiv(rows, block_m), threads=schedule.threads) as bx:
            lane_max = T.alloc_fragment((block_m, block_n), ACC)
            lane_sum = T.alloc_fragment((block_m, block_n), ACC)
            row_max = T.alloc_fragment((block_m,), ACC)
            row_sum = T.alloc_fragment((block_m,), ACC)
            T.fill(lane_max, lowest(ACC))
            T.fill(lane_sum, 0)
            for step in T.serial(T.ceildiv(length, block_n)):
                for i, j in T.Parallel(block_m, block_n):
                    value = guard(
                        all_of(bx * block_m + i < rows, step * block_n + j < length),
                        view.load(io.x, bx * block_m + i, step * block_n + j),
                        lowest(ACC),
                    )
                    # nan_max: a lane that saw a NaN keeps it (fmaxf would drop it, and a lane of only
                    # NaN and padding would count as empty), so its sum and the row's are NaN.
                    lane_sum[i, j] = _rescaled(lane_sum[i, j], lane_max[i, j], nan_max(lane_max[i, j], value), value)
                    lane_max[i, j] = nan_max(lane_max[i, j], value)
            T.reduce_max(lane_max, row_max, dim=1)
            for i, j in T.Parallel(block_m, block_n):
                lane_sum[i, j] = T.if_then_else(
                    lane_max[i, j] == lowest(ACC), T.cast(0, ACC), lane_sum[i, j] * T.exp(lane_max[i, j] - row_max[i])
                )
            T.reduce_sum(lane_sum, row_sum, dim=1)
            for step in T.serial(T.ceildiv(length, block_n)):
                # Staged through a (block_m, block_n) fragment so the loop gets its thread layout.
                for i, j in T.Parallel(block_m, block_n):
                    lane_sum[i, j] = (
                        T.exp(
                            guard(
                                all_of(bx * block_m + i < rows, step * block_n + j < length),
                                view.load(io.x, bx * block_m + i, step * block_n + j),
                                lowest(ACC),
                            )
                            - row_max[i]
                        )
                        / row_sum[i]
                    )
                    if bx * block_m + i < rows and step * block_n + j < length:
                        io.out[view.index(bx * block_m + i, step * block_n + j)] = T.cast(
                            lane_sum[i, j], spec.dtype_out
                        )

    return main


def _softmax_cpu(spec: SoftmaxSpec, view: RowView, block_m: int):
    """CPU softmax, one row at a time: the max and the sum of exponentials as CPU_LANES partial
    results (lane_reduce: contiguous rows vectorise), exponentials by the inline ``tessera_expf``.
    An fp32 output holds ``exp(x - max)`` after the second pass and is scaled in place (one
    exponential per element); other outputs recompute the exponential at the end, rounding once."""
    rows, length = view.rows, view.length
    keep_exp = spec.dtype_out == ACC
    full, tail = lane_chunks(length)
    params = spec.params()

    @prim_func
    def main():
        io = declare_params(params, ("x", "out"))
        with T.Kernel(T.ceildiv(rows, block_m)) as bx:
            lanes = T.alloc_local((CPU_LANES,), ACC)
            row_max = T.alloc_local((1,), ACC)
            scale = T.alloc_local((1,), ACC)
            for i in T.serial(T.min(block_m, rows - bx * block_m)):
                lane_reduce(lanes, length, lowest(ACC), T.max, lambda r, i=i: view.load(io.x, bx * block_m + i, r))
                row_max[0] = lanes[0]
                if keep_exp:  # out = exp(x - max) while summing it (lane_reduce's loops, with a store)
                    for lane in T.serial(CPU_LANES):
                        lanes[lane] = T.cast(0, ACC)
                    for chunk in T.serial(full):
                        for lane in T.serial(CPU_LANES):
                            io.out[view.index(bx * block_m + i, chunk * CPU_LANES + lane)] = cpu_exp(
                                view.load(io.x, bx * block_m + i, chunk * CPU_LANES + lane) - row_max[0]
                            )
                            lanes[lane] += io.out[view.index(bx * block_m + i, chunk * CPU_LANES + lane)]
                    for lane in T.serial(tail):
                        io.out[view.index(bx * block_m + i, full * CPU_LANES + lane)] = cpu_exp(
                            view.load(io.x, bx * block_m + i, full * CPU_LANES + lane) - row_max[0]
                        )
                        lanes[lane] += io.out[view.index(bx * block_m + i, full * CPU_LANES + lane)]
                    for lane in T.serial(1, CPU_LANES):
                        lanes[0] += lanes[lane]
                    scale[0] = T.cast(1, ACC) / lanes[0]
                    for r in T.serial(length):
                        io.out[view.index(bx * block_m + i, r)] = io.out[view.index(bx * block_m + i, r)] * scale[0]
                else:
                    lane_reduce(
                        lanes,
                        length,
                        T.cast(0, ACC),
                        _add,
                        lambda r, i=i: cpu_exp(view.load(io.x, bx * block_m + i, r) - row_max[0]),
                    )
                    scale[0] = T.cast(1, ACC) / lanes[0]
                    for r in T.serial(length):
                        io.out[view.index(bx * block_m + i, r)] = T.cast(
                            cpu_exp(view.load(io.x, bx * block_m + i, r) - row_max[0]) * scale[0], spec.dtype_out
                        )

    return main


def _add(a, b):
    return a + b


# ---------------------------------------------------------------------------------------------
# Norms
# ---------------------------------------------------------------------------------------------


def _normalized(spec: NormSpec, value, mean, inv_std, weight, bias, col):
    """``(value - mean) * inv_std * weight[col] + bias[col]`` as the spec asks, cast to dtype_out."""
    y = (value - mean) * inv_std if spec.kind == "layer_norm" else value * inv_std
    if spec.has_weight:
        y = y * to_compute(weight[col], ACC)
    if spec.has_bias:
        y = y + to_compute(bias[col], ACC)
    return T.cast(y, spec.dtype_out)


def _declare_norm(spec: NormSpec):
    """The parameters as ``io.x``, ``io.weight``, ``io.bias`` (None when absent) and ``io.out``."""
    io = declare_params(spec.params(), ("x",))
    rest = io.buffers[1:-1]
    io.weight = rest[0] if spec.has_weight else None
    io.bias = rest[-1] if spec.has_bias else None
    io.out = io.buffers[-1]
    return io


def _norm_setup(spec: NormSpec, schedule: TileSchedule) -> tuple:
    """What both norm programs read: the row view, sizes, blocks and the statistics' constants."""
    view = RowView(spec.shape, (len(spec.shape) - 1,))
    rows, length = view.rows, view.length
    block_m = clamp(schedule.block_m, rows)
    block_n = schedule.block_n
    centered = spec.kind == "layer_norm"
    eps = float(spec.eps)
    # a symbolic length (a Relax model's dynamic dim) divides at run time
    inv_length = 1.0 / length if isinstance(length, int) else T.cast(1, ACC) / T.cast(length, ACC)
    return view, rows, length, block_m, block_n, centered, eps, inv_length


def norm_cpu_program(spec: NormSpec, schedule: TileSchedule):
    """layer_norm / rms_norm over the last axis on the CPU: one row at a time, lane_reduce statistics."""
    view, rows, length, block_m, block_n, centered, eps, inv_length = _norm_setup(spec, schedule)

    @prim_func
    def main():
        io = _declare_norm(spec)
        with T.Kernel(T.ceildiv(rows, block_m)) as bx:
            lanes = T.alloc_local((CPU_LANES,), ACC)
            mean = T.alloc_local((1,), ACC)
            inv_std = T.alloc_local((1,), ACC)
            for i in T.serial(T.min(block_m, rows - bx * block_m)):
                mean[0] = T.cast(0, ACC)
                if centered:
                    lane_reduce(
                        lanes, length, T.cast(0, ACC), _add, lambda r, i=i: view.load(io.x, bx * block_m + i, r)
                    )
                    mean[0] = lanes[0] * inv_length
                lane_reduce(
                    lanes,
                    length,
                    T.cast(0, ACC),
                    _add,
                    lambda r, i=i: (
                        (view.load(io.x, bx * block_m + i, r) - mean[0])
                        * (view.load(io.x, bx * block_m + i, r) - mean[0])
                    ),
                )
                inv_std[0] = T.rsqrt(lanes[0] * inv_length + eps)
                for r in T.serial(length):
                    io.out[view.index(bx * block_m + i, r)] = _normalized(
                        spec, view.load(io.x, bx * block_m + i, r), mean[0], inv_std[0], io.weight, io.bias, r
                    )

    return main


def norm_gpu_program(spec: NormSpec, schedule: TileSchedule):
    """layer_norm / rms_norm over the last axis on a thread-block target: fragments of lanes, T.reduce_sum."""
    view, rows, length, block_m, block_n, centered, eps, inv_length = _norm_setup(spec, schedule)

    @prim_func
    def main():
        io = _declare_norm(spec)
        with T.Kernel(T.ceildiv(rows, block_m), threads=schedule.threads) as bx:
            lanes = T.alloc_fragment((block_m, block_n), ACC)
            mean = T.alloc_fragment((block_m,), ACC)
            inv_std = T.alloc_fragment((block_m,), ACC)
            T.fill(mean, 0)
            if centered:
                T.fill(lanes, 0)
                for step in T.serial(T.ceildiv(length, block_n)):
                    for i, j in T.Parallel(block_m, block_n):
                        lanes[i, j] += guard(
                            all_of(bx * block_m + i < rows, step * block_n + j < length),
                            view.load(io.x, bx * block_m + i, step * block_n + j),
                            T.cast(0, ACC),
                        )
                T.reduce_sum(lanes, mean, dim=1)
                for i in T.Parallel(block_m):
                    mean[i] = mean[i] * inv_length
            T.fill(lanes, 0)
            for step in T.serial(T.ceildiv(length, block_n)):
                for i, j in T.Parallel(block_m, block_n):
                    lanes[i, j] += guard(
                        all_of(bx * block_m + i < rows, step * block_n + j < length),
                        (view.load(io.x, bx * block_m + i, step * block_n + j) - mean[i])
                        * (view.load(io.x, bx * block_m + i, step * block_n + j) - mean[i]),
                        T.cast(0, ACC),
                    )
            T.reduce_sum(lanes, inv_std, dim=1)
            for i in T.Parallel(block_m):
                inv_std[i] = T.rsqrt(inv_std[i] * inv_length + eps)
            for step in T.serial(T.ceildiv(length, block_n)):
                # Staged through a (block_m, block_n) fragment so the loop gets its thread layout.
                for i, j in T.Parallel(block_m, block_n):
                    lanes[i, j] = guard(
                        all_of(bx * block_m + i < rows, step * block_n + j < length),
                        view.load(io.x, bx * block_m + i, step * block_n + j),
                        T.cast(0, ACC),
                    )
                    if bx * block_m + i < rows and step * block_n + j < length:
                        io.out[view.index(bx * block_m + i, step * block_n + j)] = _normalized(
                            spec, lanes[i, j], mean[i], inv_std[i], io.weight, io.bias, step * block_n + j
                        )

    return main
