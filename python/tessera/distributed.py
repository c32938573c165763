"""Sharded kernels: a kernel's arguments split over a device mesh, run on torch.distributed.

    mesh = ts.Mesh({"tp": 2})                                    # 1-D; ts.Mesh({"dp": 2, "tp": 2}) is 2-D
    mlp_tp = ts.shard(mlp, mesh, {"W1": ts.Split("F"), "b1": ts.Split("F"), "W2": ts.Split("F")})
    mlp_tp.inspect_ir("graph")                                   # the kernel, then R.call_pure_packed("tessera.all_reduce", ...)
    k = ts.compile(mlp_tp, target="cpu")                         # one local kernel per rank (a cache hit on all but one)
    out = k(x, w1_shard, b1_shard, w2_shard)                     # under torchrun: each rank passes its shards

The Graph IR of a sharded kernel carries ``tessera.sharding`` (the mesh, each parameter's split, each
output's). ``tessera.InsertCollectives`` adds the collectives it implies (``tessera_tvm.graph.sharding``):
between the kernels, where an op needs a whole sum or a whole dim (an all-reduce, a reduce-scatter onto
a split residual, an all-gather of a split row or of the sequence), and at the outputs. Each rank
compiles the kernel for its local shapes (a split dim divided by its mesh axis) and runs it on its
shards; the collectives run through the process group of ``torch.distributed`` (gloo: those between
the kernels when a kernel first reads them, those at the outputs after the kernels). On the CPU they
run on host arrays; on a CUDA config (NCCL) on torch tensors on the device, a path no GPU has run yet.
Causal attention with the query sequence split is the one sharding whose graph differs between the
ranks (each reads the keys up to its last query): ``ts.compile`` compiles the calling rank's. Split
contiguously, the last rank computes most of the causal triangle; ``ts.Split("S", zigzag=True)``
balances it (the sequence cut into 2n pieces, rank c holding pieces c and 2n - 1 - c; ``local_arrays``
cuts them so, and every collective over that axis follows that layout). With
``attention="all_to_all"`` (DeepSpeed-Ulysses) such an attention is re-split on its heads instead:
one all-to-all each for Q, K and V, one for the result, the same graph and work on every rank.
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
import json
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tessera_tvm import trace as _trace
from tessera_tvm.graph.sharding import (
    LOCAL_KINDS,
    SHARDING_ATTR,
    Collective,
    RankDependent,
    dim_size,
    read_collectives,
    split_pieces,
)

from .errors import KernelError, TesseraError
from .kernel import Kernel

__all__ = [
    "CollectiveError",
    "Mesh",
    "Pending",
    "Replicate",
    "ShardedKernel",
    "Split",
    "shard",
    "unzigzag",
    "zigzag_piece",
]

#: Bucket size for coalesced all-reduces (seed 004 §6: 8-32 MB).
DEFAULT_BUCKET_MB = 16.0
#: Elements of one 32x32 tile: each tensor in a bucket starts on a multiple of it.
TILE_ELEMS = 32 * 32
#: Seconds the ranks of a failed collective wait for each other to check in (the rest are named).
HEALTH_WINDOW = 1.0


class CollectiveError(TesseraError, RuntimeError):
    """A collective of a sharded kernel failed or did not finish in time (a hung or dead rank)."""


@dataclass(frozen=True)
class Mesh:
    """A device mesh: named axes with sizes, ranks laid out row-major (the last axis varies fastest)."""

    axes: tuple[tuple[str, int], ...]

    def __init__(self, axes: Mapping[str, int] | int):
        items = tuple({"x": axes}.items()) if isinstance(axes, int) else tuple(dict(axes).items())
        if not items or len(items) > 2:
            raise KernelError(f"ts.Mesh takes 1 or 2 named axes, e.g. {{'tp': 2}}; found {axes!r}")
        for name, size in items:
            if not isinstance(name, str) or isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise KernelError(f"ts.Mesh: axis {name!r} has size {size!r}; expected a name and an int >= 1")
        object.__setattr__(self, "axes", items)

    @property
    def size(self) -> int:
        return math.prod(s for _, s in self.axes)

    def axis_size(self, axis: str) -> int:
        return dict(self.axes)[axis]

    def coords(self, rank: int) -> dict[str, int]:
        out = {}
        for name, size in reversed(self.axes):
            out[name] = rank % size
            rank //= size
        return {name: out[name] for name, _ in self.axes}

    def group_ranks(self, axis: str) -> list[list[int]]:
        """The rank groups along ``axis``: ranks that differ only in their ``axis`` coordinate."""
        groups: dict[tuple, list[int]] = {}
        for r in range(self.size):
            c = self.coords(r)
            groups.setdefault(tuple(v for k, v in c.items() if k != axis), []).append(r)
        return list(groups.values())

    def __repr__(self) -> str:
        return "ts.Mesh({" + ", ".join(f"{n!r}: {s}" for n, s in self.axes) + "})"


@dataclass(frozen=True)
class Split:
    """Split a tensor's dim (its name, e.g. ``"F"``, or its index) over a mesh axis (default: the
    mesh's only axis, or its last). ``zigzag=True``: load-balanced for causal attention over a split
    sequence; the dim is cut into ``2n`` pieces and the rank with coordinate ``c`` holds pieces ``c``
    and ``2n - 1 - c``, one after the other (every split over that axis is then zigzag)."""

    dim: str | int
    axis: str | None = None
    zigzag: bool = False

    def __post_init__(self):
        if not isinstance(self.zigzag, bool):
            raise KernelError(f"ts.Split({self.dim!r}): zigzag is {self.zigzag!r}; expected True or False")


@dataclass(frozen=True)
class Replicate:
    """Every rank holds the whole tensor (the default)."""


def _kernels_queued(results: list):
    """On the GPU, a CUDA event recorded on the caller's stream after the kernels that made ``results``
    (the communication stream waits for it); None on the CPU."""
    import torch

    if not any(isinstance(r, torch.Tensor) and r.is_cuda for r in results):
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def _specs(value) -> list:
    if value is None or isinstance(value, Replicate):
        return []
    if isinstance(value, Split):
        return [value]
    if isinstance(value, Sequence) and all(isinstance(v, Split) for v in value):
        return list(value)
    raise KernelError(f"a sharding is ts.Split(dim, axis), a list of them, or ts.Replicate(); found {value!r}")


def _process_rank() -> int | None:
    """This process's rank in torch.distributed's default group, or None outside one."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


class _LocalKernel(Kernel):
    """What each rank compiles: the kernel traced with ``tessera.sharding`` on its function, so its
    Graph IR has the collectives and its fused kernels end where an all-reduce must run. ``coords``
    (one rank's mesh coordinates) only where the ranks' graphs differ."""

    def __init__(self, sharded: ShardedKernel, coords: Mapping[str, int] | None = None):
        super().__init__(sharded.kernel.fn, sharded.kernel.schedule_overrides)
        self._sharding = sharded.sharding_attr(coords)
        self.variant = json.dumps(self._sharding, sort_keys=True)

    def _trace(self, env, arg_shapes):
        traced = super()._trace(env, arg_shapes)
        func = traced[self.name].with_attr(SHARDING_ATTR, self._sharding)
        return traced.__class__({**dict(traced.functions.items()), traced.get_global_var(self.name): func})


#: How ``ts.shard(..., attention=)`` runs an attention whose sequence is split (see :func:`shard`).
ATTENTION_MODES = ("all_gather", "all_to_all")


class ShardedKernel:
    """A kernel whose arguments and results are split over ``mesh`` (made by :func:`shard`)."""

    def __init__(
        self,
        kernel: Kernel,
        mesh: Mesh,
        inputs: Mapping[str, Any],
        outputs: Any = None,
        *,
        timeout: float = 60.0,
        bucket_mb: float = DEFAULT_BUCKET_MB,
        attention: str = "all_gather",
    ):
        if not isinstance(kernel, Kernel):
            raise TypeError(f"ts.shard takes a @tessera.kernel, found {kernel!r}")
        if not isinstance(mesh, Mesh):
            raise TypeError(f"ts.shard takes a ts.Mesh, found {mesh!r}")
        if not (isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0):
            raise KernelError(f"ts.shard: timeout is {timeout!r}; expected seconds > 0")
        if not (isinstance(bucket_mb, int | float) and not isinstance(bucket_mb, bool) and bucket_mb > 0):
            raise KernelError(f"ts.shard: bucket_mb is {bucket_mb!r}; expected megabytes > 0")
        if attention not in ATTENTION_MODES:
            raise KernelError(
                f"ts.shard: attention is {attention!r}; expected one of {', '.join(map(repr, ATTENTION_MODES))}"
            )
        self.kernel, self.mesh, self.timeout, self.bucket_mb = kernel, mesh, float(timeout), float(bucket_mb)
        self.attention = attention
        self.name = kernel.name
        where = f"ts.shard({kernel.name})"
        params = dict(kernel.params)
        unknown = [n for n in inputs if n not in params]
        if unknown:
            raise KernelError(f"{where}: {', '.join(unknown)} is not a parameter; parameters: {', '.join(params)}")
        self.param_splits: dict[str, dict[str, int]] = {}
        for name, value in inputs.items():
            self.param_splits[name] = self._resolve(where, name, params[name].dims, _specs(value))
        results = kernel.result if isinstance(kernel.result, tuple) else (kernel.result,)
        out_specs = list(outputs) if isinstance(outputs, list | tuple) else [outputs] * len(results)
        self.output_splits = []
        for k, spec in enumerate(out_specs):
            dims = results[k].dims if k < len(results) and results[k] is not None else ()
            self.output_splits.append(self._resolve(where, f"output {k}", dims, _specs(spec)))
        # a dim name split in one parameter is split alike in every parameter that has it
        split_dims: dict[str, str] = {}
        for name, splits in self.param_splits.items():
            for axis, index in splits.items():
                d = params[name].dims[index]
                if isinstance(d, str):
                    if split_dims.get(d, axis) != axis:
                        raise KernelError(f"{where}: dim {d} is split over {split_dims[d]!r} and {axis!r}")
                    split_dims[d] = axis
        for name, t in params.items():
            for index, d in enumerate(t.dims):
                if d in split_dims and self.param_splits.get(name, {}).get(split_dims[d]) != index:
                    raise KernelError(
                        f"{where}: dim {d} is split over {split_dims[d]!r} in some parameters but not in {name}; "
                        f"every tensor with dim {d} must split it alike (add ts.Split({d!r}) for {name})"
                    )
        self.split_dims = split_dims
        self.zigzag = self._zigzag_axes(where, inputs, outputs)
        self.local_kernel = _LocalKernel(self)  # what every rank compiles, unless its graph is its own
        self._rank_kernels: dict[int, _LocalKernel] = {}

    def _zigzag_axes(self, where: str, inputs: Mapping[str, Any], outputs: Any) -> frozenset[str]:
        """The mesh axes split load-balanced (``ts.Split(..., zigzag=True)``): every parameter split over
        such an axis must say so (its local piece is two pieces of the sequence); an output split
        over it is laid out alike."""
        said: dict[str, dict[bool, str]] = {}
        for name, value in inputs.items():
            for s in _specs(value):
                said.setdefault(self._axis(s), {}).setdefault(s.zigzag, name)
        out_specs = outputs if isinstance(outputs, list | tuple) else [outputs]
        for k, value in enumerate(out_specs):
            for s in _specs(value):
                axis = self._axis(s)
                if s.zigzag and True not in said.get(axis, {}):
                    raise KernelError(
                        f"{where}: output {k} is split zigzag over {axis!r} but no parameter is; say "
                        "ts.Split(..., zigzag=True) for the parameters split over it"
                    )
        for axis, kinds in said.items():
            if len(kinds) > 1:
                raise KernelError(
                    f"{where}: {kinds[True]} is split zigzag over {axis!r} but {kinds[False]} is not; every "
                    f"split over {axis!r} must be zigzag (ts.Split(..., zigzag=True)) or none"
                )
        return frozenset(a for a, kinds in said.items() if True in kinds)

    def _axis(self, spec: Split) -> str:
        """The mesh axis ``spec`` splits over: its own, or the mesh's only (last) axis."""
        return spec.axis if spec.axis is not None else self.mesh.axes[-1][0]

    def pieces(self, axis: str) -> int:
        """How many pieces a dim split over ``axis`` is cut into: one per rank, two per rank (zigzag)."""
        return split_pieces(self.mesh.axis_size(axis), axis in self.zigzag)

    def _resolve(self, where: str, what: str, dims, specs: list[Split]) -> dict[str, int]:
        out: dict[str, int] = {}
        names = [a for a, _ in self.mesh.axes]
        for s in specs:
            axis = self._axis(s)
            if axis not in names:
                raise KernelError(f"{where}: {what} is split over {axis!r}, which is not an axis of {self.mesh!r}")
            if isinstance(s.dim, int) and not isinstance(s.dim, bool):
                index = s.dim % len(dims) if dims and -len(dims) <= s.dim < len(dims) else None
            else:
                index = list(dims).index(s.dim) if s.dim in list(dims) else None
            if index is None:
                raise KernelError(f"{where}: {what} has no dim {s.dim!r}; its dims are {list(dims)}")
            if axis in out:
                raise KernelError(f"{where}: {what} is split twice over {axis!r}")
            out[axis] = index
        return out

    # ---- shapes and arrays ------------------------------------------------------------------
    def local_shapes(self, shapes: Mapping[str, int] | None) -> dict[str, int]:
        """Each rank's dims: a split dim divided by the size of its mesh axis (it must divide)."""
        env = self.kernel.check_shapes(shapes)
        out = dict(env)
        for d, axis in self.split_dims.items():
            if d in env:
                n, pieces = self.mesh.axis_size(axis), self.pieces(axis)
                if env[d] % pieces:
                    what = f"{n} ranks" + (f", {pieces} zigzag pieces" if pieces != n else "")
                    raise KernelError(
                        f"ts.shard({self.name}): dim {d} = {env[d]} does not split evenly over {axis!r} ({what})"
                    )
                out[d] = env[d] // n
        return out

    def local_arrays(self, arrays: Sequence[Any], rank: int) -> list[np.ndarray]:
        """Rank ``rank``'s shards of the whole arguments ``arrays`` (each a numpy array)."""
        coords = self.mesh.coords(rank)
        out = []
        for (name, _), array in zip(self.kernel.params, arrays, strict=True):
            a = np.asarray(array)
            for axis, index in self.param_splits.get(name, {}).items():
                a = zigzag_piece(a, index, self.mesh.axis_size(axis), coords[axis], axis in self.zigzag)
            out.append(np.ascontiguousarray(a))
        return out

    # ---- Graph IR ------------------------------------------------------------------------------
    def sharding_attr(self, coords: Mapping[str, int] | None = None) -> dict:
        attr = {
            "mesh": dict(self.mesh.axes),
            "params": {n: dict(s) for n, s in self.param_splits.items() if s},
            "outputs": [dict(s) for s in self.output_splits],
        }
        if self.zigzag:
            attr["zigzag"] = sorted(self.zigzag)
        if self.attention == "all_to_all":  # every axis: only one a sequence is split over meets an attention
            attr["attention_all_to_all"] = sorted(dict(self.mesh.axes))
        if coords is not None:
            attr["coords"] = dict(coords)
        return attr

    def local_kernel_for(self, rank: int | None, shapes: Mapping[str, int] | None = None, target: Any = None) -> Kernel:
        """What rank ``rank`` compiles: the kernel all ranks share, or, where the ranks' graphs differ
        (causal attention with the query sequence split: each rank reads the keys up to its last
        query), one traced with the rank's mesh coordinates. ``rank`` None: the shared one, or
        :class:`~tessera_tvm.graph.sharding.RankDependent` where there is none."""
        try:
            self.local_kernel.graph(self.local_shapes(shapes), target=target)
            return self.local_kernel
        except RankDependent:
            if rank is None:
                raise
        if not (isinstance(rank, int) and 0 <= rank < self.mesh.size):
            raise KernelError(f"ts.shard({self.name}): rank is {rank!r}; expected 0 .. {self.mesh.size - 1}")
        if rank not in self._rank_kernels:
            self._rank_kernels[rank] = _LocalKernel(self, self.mesh.coords(rank))
        return self._rank_kernels[rank]

    def graph(self, shapes: Mapping[str, int] | None = None, *, target: Any = None, rank: int | None = None):
        """The Graph IR: the kernel traced for each rank's shapes, with its collectives (``rank``: that
        rank's, needed where the ranks' graphs differ)."""
        return self.local_kernel_for(rank, shapes, target).graph(self.local_shapes(shapes), target=target)

    def collectives(self, target: Any = None, *, rank: int | None = None) -> list[Collective]:
        graph = self.graph(target=target, rank=rank)
        return read_collectives(graph.module, self.name)

    def inspect_ir(
        self, stage: str = "graph", *, shapes: Mapping[str, int] | None = None, rank: int | None = None
    ) -> str:
        if stage != "graph":
            raise KernelError(f"stage {stage!r} needs a target: ts.compile(sharded, target=...).inspect_ir({stage!r})")
        return self.graph(shapes, rank=rank).text()

    def __repr__(self) -> str:
        return f"<tessera.shard {self.name} over {self.mesh!r}>"


def zigzag_piece(a, dim: int, ranks: int, coord: int, zigzag: bool):
    """The piece of ``a`` (a numpy array or a torch tensor) on dim ``dim`` that the rank with coordinate
    ``coord`` of ``ranks`` holds: the ``coord``-th of ``ranks`` pieces, or (``zigzag``) pieces ``coord``
    and ``2 * ranks - 1 - coord`` of ``2 * ranks``, one after the other."""
    if not zigzag:
        return _chunks(a, dim, ranks)[coord]
    chunks = _chunks(a, dim, 2 * ranks)
    return _cat([chunks[coord], chunks[2 * ranks - 1 - coord]], dim)


def unzigzag(parts: Sequence[Any], dim: int, zigzag: bool = True):
    """The whole of a dim gathered from each rank's piece (``parts`` in coordinate order): the inverse
    of :func:`zigzag_piece` (``zigzag`` False: the pieces one after the other)."""
    if not zigzag:
        return _cat(parts, dim)
    halves = [_chunks(p, dim, 2) for p in parts]
    return _cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim)


def _chunks(a, dim: int, n: int) -> list:
    import torch

    return list(torch.chunk(a, n, dim=dim)) if isinstance(a, torch.Tensor) else np.split(a, n, axis=dim)


def _cat(parts: Sequence[Any], dim: int):
    import torch

    return torch.cat(list(parts), dim=dim) if isinstance(parts[0], torch.Tensor) else np.concatenate(parts, axis=dim)


def shard(
    kernel: Kernel,
    mesh: Mesh,
    inputs: Mapping[str, Any],
    outputs: Any = None,
    *,
    timeout: float = 60.0,
    bucket_mb: float = DEFAULT_BUCKET_MB,
    attention: str = "all_gather",
) -> ShardedKernel:
    """``kernel`` with its parameters split over ``mesh``: ``inputs`` maps parameter names to
    ``ts.Split(dim, axis)`` (or a list of them, one per mesh axis); unnamed parameters are replicated.
    ``outputs`` (one spec, or a list per result) says how each result is left on the ranks (default:
    replicated). ``timeout`` bounds each collective, ``bucket_mb`` the all-reduce buckets.
    ``attention``: how an attention whose queries, keys and values are split on the sequence runs:
    ``"all_gather"`` (each rank's queries against the gathered keys and values, Llama 3's context
    parallelism) or ``"all_to_all"`` (DeepSpeed-Ulysses: one all-to-all each re-splits Q, K and V
    on the heads, every rank attends over the whole sequence for its heads, and one all-to-all
    splits the result on the sequence again; the heads must divide over the ranks)."""
    return ShardedKernel(kernel, mesh, inputs, outputs, timeout=timeout, bucket_mb=bucket_mb, attention=attention)


# ---------------------------------------------------------------------------------------------
# Running: the local kernel, then the collectives on torch.distributed
# ---------------------------------------------------------------------------------------------


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

        from .gpu import from_torch, run_on_gpu, to_torch
        from .instance import HOST, _bind, _check_args

        dist = self._dist()
        local = self.local
        on_gpu = backend_for(local.config).runs_on == "gpu"
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
                outs = run_on_gpu(instance, checked, collective=collective)
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
