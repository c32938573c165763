"""Running a compiled sharded kernel: each rank's local kernel, then its collectives on torch.distributed.

Ranks map row-major onto the mesh. All-reduces over one axis are coalesced into buckets of
``bucket_mb`` (default 16 MB), with each tensor starting on a 32x32-tile boundary. With
``wait=False`` a call returns a :class:`Pending` result at once: the collectives run on a
communication thread while the caller computes something else.

A collective that does not finish within ``timeout`` seconds raises :class:`CollectiveError` on the
rank that waits for it. The error names the rank, the collective, the output and the kernel, and the
ranks that are hung or gone: the ranks whose collective failed check in on the process group's
store, and those that do not within a second are named. A rank whose peer died gets the same error,
as soon as gloo notices or at the timeout. No output of such a call is returned.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tessera_tvm import trace as _trace
from tessera_tvm.graph.collectives import LOCAL_KINDS, Collective, read_collectives, split_pieces
from tessera_tvm.graph.sharding import dim_size

from .distributed import CollectiveError, ShardedKernel, _cat, unzigzag, zigzag_piece
from .errors import KernelError

__all__ = ["Pending", "ShardedCompiledKernel"]

#: Elements of one 32x32 tile: each tensor in a bucket starts on a multiple of it.
TILE_ELEMS = 32 * 32
#: Seconds the ranks of a failed collective wait for each other to check in (the rest are named).
HEALTH_WINDOW = 1.0


def _kernels_queued(results: list):
    """On the GPU, a CUDA event recorded on the caller's stream after the kernels that made ``results``
    (the communication stream waits for it); None on the CPU."""
    import torch

    if not any(isinstance(r, torch.Tensor) and r.is_cuda for r in results):
        return None
    event = torch.cuda.Event()
    event.record()
    return event


class Pending:
    """The result of a call with ``wait=False``: its collectives run on a communication thread (on
    the GPU, on a CUDA stream of their own)."""

    def __init__(self, future: concurrent.futures.Future):
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self):
        outs, finished = self._future.result()
        if finished is not None:  # the GPU: the caller's stream waits for the communication stream
            import torch

            torch.cuda.current_stream().wait_event(finished)
        return outs


class ShardedCompiledKernel:
    """What ``ts.compile`` returns for a :class:`ShardedKernel`: the local kernel and its collectives."""

    def __init__(
        self, sharded: ShardedKernel, local, config, shapes: Mapping[str, int] | None, rank: int | None = None
    ):
        self.sharded = sharded
        self.local = local  # the CompiledKernel for this rank's shapes
        self.config = config
        self.rank = rank  # the rank it was compiled for, where the ranks' graphs differ (else None)
        self.graph = local.kernel.graph(sharded.local_shapes(shapes), target=config)
        self.collectives = read_collectives(self.graph.module, sharded.name)
        self.stats: dict[str, Any] = {}
        self._groups: dict[str, Any] | None = None
        self._comm: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._waits = 0  # collectives waited for, numbered alike on every rank (_silent_ranks)
        self._stream = None  # the GPU: the communication stream of wait=False calls
        self._resplits_checked: set[tuple] = set()  # the dims at which every all-to-all divides (_check_resplits)

    def __repr__(self) -> str:
        return f"<ShardedCompiledKernel {self.sharded.name} over {self.sharded.mesh!r} for {self.config.name}>"

    def inspect_ir(self, stage: str = "graph") -> str:
        if stage == "graph":
            return self.graph.text()
        text = self.local.inspect_ir(stage)
        if stage == "sched":
            lines = [
                f"sched.collective  {c.text(c.value_name)} on torch.distributed"
                + (
                    " (no communication: each rank keeps its piece)"
                    if c.kind == "slice"
                    else " (no communication: this rank's keys, up to its last query)"
                    if c.kind == "prefix"
                    else " (no communication: one of this rank's two zigzag pieces)"
                    if c.kind == "half"
                    else " (no communication: the results of its two zigzag pieces, one after the other)"
                    if c.kind == "concat"
                    else " (no communication: key/value heads repeated up to the all-to-all's pieces)"
                    if c.kind == "repeat"
                    else " (between the kernels, before the next one reads it)"
                    if c.output < 0
                    else " (coalesced into buckets)"
                    if c.kind == "all_reduce"
                    else ""
                )
                for c in self.collectives
            ]
            text = "\n".join([text, *lines]) if lines else text
        return text

    # ---- process groups ----
    def _dist(self):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise CollectiveError(
                f"{self.sharded.name}: a sharded kernel runs under torch.distributed; call "
                "torch.distributed.init_process_group (torchrun does the environment) first"
            )
        if dist.get_world_size() != self.sharded.mesh.size:
            raise CollectiveError(
                f"{self.sharded.name}: the mesh {self.sharded.mesh!r} has {self.sharded.mesh.size} ranks but the "
                f"process group has {dist.get_world_size()}"
            )
        if self.rank is not None and dist.get_rank() != self.rank:
            raise CollectiveError(
                f"{self.sharded.name}: compiled for rank {self.rank} (its graph is that rank's own), called on "
                f"rank {dist.get_rank()}; compile it on each rank"
            )
        return dist

    def _group(self, dist, axis: str):
        """The process group of this rank along ``axis`` (the default group on a 1-D mesh)."""
        if len(self.sharded.mesh.axes) == 1:
            return None, list(range(self.sharded.mesh.size))
        with self._lock:
            if self._groups is None:  # every rank creates every group, in the same order
                self._groups = {}
                for name, _ in self.sharded.mesh.axes:
                    for ranks in self.sharded.mesh.group_ranks(name):
                        group = dist.new_group(ranks)
                        if dist.get_rank() in ranks:
                            self._groups[name] = (group, ranks)
        return self._groups[axis]

    # ---- calls ----
    def __call__(self, *arrays, wait: bool = True):
        outs, inside = self._run_local(arrays)  # (count, seconds, copy seconds) of those between the kernels
        results = list(outs) if isinstance(outs, tuple) else [outs]
        if not any(c.output >= 0 for c in self.collectives):
            return outs
        dist = self._dist()
        if wait:
            return self._finish(dist, results, isinstance(outs, tuple), inside)
        if self._comm is None:
            self._comm = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"tessera-comm-{self.sharded.name}"
            )
        queued = _kernels_queued(results)  # the GPU: the communication stream starts after these kernels
        return Pending(
            self._comm.submit(self._finish_on_the_side, dist, results, isinstance(outs, tuple), inside, queued)
        )

    def _finish_on_the_side(self, dist, results: list, as_tuple: bool, inside: tuple[int, float, float], queued):
        """:meth:`_finish` on the communication thread, and the CUDA event that marks its end (None on
        the CPU). On the GPU its work goes on a stream of its own, which first waits for the kernels
        queued on the caller's stream (the event ``queued``): the caller's next kernels overlap the
        collectives."""
        import torch

        if queued is None:  # the CPU
            return self._finish(dist, results, as_tuple, inside), None
        device = next(r.device for r in results if isinstance(r, torch.Tensor) and r.is_cuda)
        with self._lock:
            if self._stream is None:
                self._stream = torch.cuda.Stream(device)
        with torch.cuda.device(device), torch.cuda.stream(self._stream):
            self._stream.wait_event(queued)
            outs = self._finish(dist, results, as_tuple, inside)
            finished = torch.cuda.Event()
            finished.record(self._stream)
        return outs, finished

    def _run_local(self, arrays: Sequence[Any]) -> tuple[Any, tuple[int, float, float]]:
        """The local kernels, and the count and seconds of the collectives among them (those that move
        data, then the copies of those that do not, ``LOCAL_KINDS``). A collective
        between the kernels (one a later kernel reads) runs when that kernel first needs it, on every
        rank in the same order."""
        inner = [c for c in self.collectives if c.output < 0]
        self.stats = {}
        if not inner:
            return self.local(*arrays), (0, 0.0, 0.0)
        import torch

        from tessera_tvm.target.backend import backend_for

        from .gpu import from_torch, to_torch
        from .instance import HOST, _bind, _check_args

        dist = self._dist()
        local = self.local
        runner = backend_for(local.config).runner
        on_gpu = runner.device_memory
        checked = _check_args(local.kernel, arrays, local.shapes, allow_torch=on_gpu, allow_torch_cpu=not on_gpu)
        as_torch = not on_gpu and bool(checked) and isinstance(checked[0], torch.Tensor)
        if as_torch:  # the CPU kernels run on host arrays: torch tensors in, torch tensors out
            checked = [
                from_torch(t, ttype.dtype.tvm) for t, (_, ttype) in zip(checked, local.kernel.params, strict=True)
            ]
        env = _bind(local.kernel, checked, local.shapes)
        self._check_resplits(dist, env)
        instance = local._instance_of(env)
        issued, seconds, copies = [0], [0.0], [0.0]

        def collective(c: Collective, array, *others):
            issued[0] += 1
            begin = time.perf_counter()
            out = self._collective_between(dist, c, array, others)
            (copies if c.kind in LOCAL_KINDS else seconds)[0] += time.perf_counter() - begin
            return out

        with _trace.span(f"local kernels {self.sharded.name}", "host"):
            if on_gpu:  # values stay on the device; the collectives take torch tensors (NCCL)
                outs = runner.run(instance, checked, collective=collective)
            else:
                outs = instance.run(checked, memory=HOST, collective=collective)
        if as_torch:
            back = [to_torch(o, o.dtype.name, "cpu") for o in (outs if isinstance(outs, tuple) else (outs,))]
            outs = tuple(back) if isinstance(outs, tuple) else back[0]
        self.stats = {
            "collectives": issued[0],
            "rank": dist.get_rank(),
            "comm_seconds": seconds[0],
            "copy_seconds": copies[0],
        }
        return outs, (issued[0], seconds[0], copies[0])

    def _check_resplits(self, dist, env: Mapping[str, int]) -> None:
        """Every all-to-all's new dim divides into the axis's pieces at the dims of this call, checked
        before the local kernels compile for them (3 heads over 4 ranks would give a kernel of 0 heads).
        Every rank has the same shapes, so every rank stops here alike. Once per set of dims: a call
        at shapes already checked pays nothing (binding the shapes in TVM costs ~30 us a collective)."""
        key = tuple(sorted(env.items()))
        if key in self._resplits_checked:
            return
        for c in self.collectives:
            if c.kind != "all_to_all" or c.source is None:
                continue
            size = dim_size(c.source, c.dim, env)
            if size is not None:
                self._check_pieces(dist, c, size, c.value_name)
        self._resplits_checked.add(key)

    def _check_pieces(self, dist, c: Collective, size: int, value: str) -> None:
        pieces = split_pieces(self.sharded.mesh.axis_size(c.axis), c.axis in self.sharded.zigzag)
        if size % pieces:
            heads = " (attention='all_to_all' splits the heads: give Q, K and V a multiple of that many)"
            raise KernelError(
                f"kernel {self.sharded.name}, rank {dist.get_rank()}: all_to_all of {value} over {c.axis!r} cuts "
                f"its dim {c.dim} ({size}) into {pieces} equal pieces, which it does not divide into"
                + (heads if c.dim == 1 else "")
            )

    def _collective_between(self, dist, c: Collective, value, others: Sequence[Any] = ()):
        """``c`` on a value between the kernels (summed and gathered in fp32): its result, of the
        value's kind (a host array, or a torch tensor on the GPU). ``others``: a concat's later values."""
        import torch

        group, ranks = self._group(dist, c.axis)
        what = c.value_name
        if c.kind in LOCAL_KINDS:  # no communication: this rank's part, in the value's own dtype
            return self._local_part(dist, c, value, len(ranks), others)
        with _trace.span(f"{c.kind} of {what}", "comm"):
            # an all-reduce sums in place: on a copy, as the value may be read again (an output, say)
            copy = c.kind == "all_reduce"
            if isinstance(value, torch.Tensor):
                t = value.to(torch.float32, copy=copy)
                return self._run_one(dist, c, t, group, ranks, [], what).to(value.dtype)
            t = torch.from_numpy(np.array(value, dtype=np.float32, copy=copy or None))
            t = self._run_one(dist, c, t, group, ranks, [], what)
            return t.numpy().astype(value.dtype, copy=False)

    def _run_one(self, dist, c: Collective, t, group, ranks: list[int], outputs: list[int], value: str = ""):
        """One all-reduce, reduce-scatter, all-gather, all-to-all or slice of ``t`` (fp32) over ``c.axis``: its
        result."""
        import torch

        if c.kind in LOCAL_KINDS:
            return self._local_part(dist, c, t, len(ranks))

        zigzag = c.axis in self.sharded.zigzag
        if c.kind == "all_gather":
            parts = [torch.empty_like(t) for _ in ranks]
            work = dist.all_gather(parts, t.contiguous(), group=group, async_op=True)
            self._wait(work, "all_gather", outputs, c.axis, ranks, value)
            return unzigzag(parts, c.dim, zigzag)
        if c.kind == "all_to_all":  # piece r of the new dim to rank r; what comes back joined on the old
            n = len(ranks)
            self._check_pieces(dist, c, t.shape[c.dim], value or c.value_name)
            sends = [zigzag_piece(t, c.dim, n, r, zigzag).contiguous() for r in range(n)]
            parts = [torch.empty_like(p) for p in sends]
            self._wait(dist.all_to_all(parts, sends, group=group, async_op=True), c.kind, outputs, c.axis, ranks, value)
            return unzigzag(parts, c.from_dim, zigzag)
        if c.kind == "reduce_scatter":  # the sum of piece i lands on the rank with coordinate i
            piece = self.sharded.mesh.coords(dist.get_rank())[c.axis]  # this rank's piece
            n = len(ranks)
            pieces = [zigzag_piece(t, c.dim, n, r, zigzag).contiguous() for r in range(n)]
            out = torch.empty_like(pieces[piece])
            self._wait(
                dist.reduce_scatter(out, pieces, group=group, async_op=True), c.kind, outputs, c.axis, ranks, value
            )
            return out
        self._wait(dist.all_reduce(t, group=group, async_op=True), c.kind, outputs, c.axis, ranks, value)
        return t

    def _local_part(self, dist, c: Collective, t, ranks: int, others: Sequence[Any] = ()):
        """A collective that moves nothing (``LOCAL_KINDS``) on a host array or a torch tensor: this
        rank's piece of ``c.dim`` (slice), the first ``c.pieces`` of its pieces (prefix; a zigzag
        axis has two per rank), half ``c.pieces`` of it (half), it joined with ``others`` (concat), or
        each entry of ``c.dim`` ``c.pieces`` times (repeat)."""
        zigzag = c.axis in self.sharded.zigzag
        if c.kind == "slice":
            part = zigzag_piece(t, c.dim, ranks, self.sharded.mesh.coords(dist.get_rank())[c.axis], zigzag)
        elif c.kind == "repeat":  # each entry of the dim c.pieces times in a row (key/value heads)
            part = (
                t.repeat_interleave(c.pieces, c.dim)
                if hasattr(t, "repeat_interleave")
                else np.repeat(t, c.pieces, c.dim)
            )
        elif c.kind == "concat":
            part = _cat([t, *others], c.dim)
        else:
            size = t.shape[c.dim] // (2 if c.kind == "half" else self.sharded.pieces(c.axis))
            start = size * c.pieces if c.kind == "half" else 0
            stop = start + size * (1 if c.kind == "half" else c.pieces)
            part = t[(slice(None),) * c.dim + (slice(start, stop),)]
        return part.contiguous() if hasattr(part, "contiguous") else np.ascontiguousarray(part)

    def _finish(self, dist, results: list, as_tuple: bool, inside: tuple[int, float, float]):
        """The output collectives (``inside``: the count, seconds and copy seconds of those that ran between
        the kernels)."""
        issued, between, copies = inside
        import torch

        rank = dist.get_rank()
        begin = time.perf_counter()
        # summed and gathered in fp32: numpy results through torch views, torch results as they are
        as_torch = [isinstance(r, torch.Tensor) for r in results]
        dtypes = [r.dtype if t else np.asarray(r).dtype for r, t in zip(results, as_torch, strict=True)]
        tensors = [
            r.to(torch.float32).contiguous() if t else torch.from_numpy(np.ascontiguousarray(r, dtype=np.float32))
            for r, t in zip(results, as_torch, strict=True)
        ]
        outside = [c for c in self.collectives if c.output >= 0]  # the ones inside ran with the kernels
        with _trace.span(f"collectives {self.sharded.name}", "comm", rank=rank):
            reduces: dict[str, list[int]] = {}
            for c in outside:
                if c.kind == "all_reduce":
                    reduces.setdefault(c.axis, []).append(c.output)
            for axis, outputs in reduces.items():
                group, ranks = self._group(dist, axis)
                for bucket in self._buckets([tensors[k] for k in outputs]):
                    flat = torch.zeros(bucket[-1][1] + bucket[-1][2], dtype=torch.float32, device=bucket[0][0].device)
                    for t, offset, n in bucket:
                        flat[offset : offset + n] = t.reshape(-1)
                    self._wait(dist.all_reduce(flat, group=group, async_op=True), "all_reduce", outputs, axis, ranks)
                    issued += 1
                    for t, offset, n in bucket:
                        t.copy_(flat[offset : offset + n].reshape(t.shape))
            for c in outside:
                if c.kind == "all_reduce":
                    continue
                group, ranks = self._group(dist, c.axis)
                tensors[c.output] = self._run_one(dist, c, tensors[c.output], group, ranks, [c.output])
                issued += 1
        self.stats = {
            "collectives": issued,
            "rank": rank,
            "comm_seconds": between + time.perf_counter() - begin,
            "copy_seconds": copies,  # the no-communication kinds (a slice, a prefix, a half, a concat)
        }
        outs = [
            t.to(dt) if torch_out else t.numpy().astype(dt, copy=False)
            for t, dt, torch_out in zip(tensors, dtypes, as_torch, strict=True)
        ]
        return tuple(outs) if as_tuple else outs[0]

    def _buckets(self, tensors: list) -> list[list[tuple]]:
        """Tensors packed into buckets of at most ``bucket_mb`` (a bigger tensor gets its own), each
        starting on a tile boundary: ``[(tensor, offset, numel), ...]`` per bucket."""
        limit = int(self.sharded.bucket_mb * 2**20 // 4)
        buckets: list[list[tuple]] = []
        current: list[tuple] = []
        used = 0
        for t in tensors:
            n = t.numel()
            offset = -(-used // TILE_ELEMS) * TILE_ELEMS
            if current and offset + n > limit:
                buckets.append(current)
                current, offset = [], 0
            current.append((t, offset, n))
            used = offset + n
        if current:
            buckets.append(current)
        return buckets

    def _wait(self, work, kind: str, outputs: list[int], axis: str, ranks: list[int], value: str = "") -> None:
        import torch.distributed as dist

        timeout = self.sharded.timeout
        with self._lock:  # every rank issues its collectives in the same order: the same number here
            self._waits += 1
            number = self._waits
        value = value or f"output{'s' if len(outputs) > 1 else ''} {', '.join(map(str, outputs))}"
        what = f"rank {dist.get_rank()}: {kind} of {value} of kernel {self.sharded.name} over mesh axis {axis!r} (ranks {ranks})"
        try:
            ok = work.wait(timeout=datetime.timedelta(seconds=timeout))
            reason = None if ok is not False else "timed out"
        except RuntimeError as exc:
            reason = " ".join(str(exc).split())[:300]
        if reason is None:
            return
        who = self._silent_ranks(dist, ranks, number)
        if "timed out" in reason.lower() or "timeout" in reason.lower():
            raise CollectiveError(f"{what} did not complete within {timeout:g} s: {who} ({reason})") from None
        raise CollectiveError(f"{what} failed: {who} ({reason})") from None

    def _silent_ranks(self, dist, ranks: list[int], number: int) -> str:
        """Which ranks of ``ranks`` are hung or gone, in words: each rank whose collective failed checks
        in on the process group's store under the collective's number, and the ranks that do not
        within :data:`HEALTH_WINDOW` seconds are named. A store that cannot be reached (it lives with
        rank 0 under a tcp:// init) leaves the ranks unnamed."""
        me = dist.get_rank()
        try:
            from torch.distributed.distributed_c10d import _get_default_store

            store = _get_default_store()
            prefix = f"tessera/health/{self.sharded.name}/{number}/"
            store.set(f"{prefix}{me}", "failed")
            missing = [r for r in ranks if r != me]
            deadline = time.monotonic() + min(HEALTH_WINDOW, self.sharded.timeout)
            while True:
                missing = [r for r in missing if not store.check([f"{prefix}{r}"])]
                if not missing or time.monotonic() >= deadline:
                    break
                time.sleep(0.02)
        except Exception:  # no store to ask: say what is known
            return "a rank of the group is hung or gone"
        if not missing:
            return "every rank of the group saw it fail (a broken connection, not a missing rank)"
        names = ", ".join(map(str, missing))
        return f"rank{'s' if len(missing) > 1 else ''} {names} did not answer: hung or gone"
