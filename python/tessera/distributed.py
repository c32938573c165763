"""Sharded kernels: a kernel's arguments split over a device mesh, run on torch.distributed.

    mesh = ts.Mesh({"tp": 2})                                    # 1-D; ts.Mesh({"dp": 2, "tp": 2}) is 2-D
    mlp_tp = ts.shard(mlp, mesh, {"W1": ts.Split("F"), "b1": ts.Split("F"), "W2": ts.Split("F")})
    mlp_tp.inspect_ir("graph")                                   # the kernel, then R.call_pure_packed("tessera.all_reduce", ...)
    k = ts.compile(mlp_tp, target="cpu")                         # one local kernel per rank (a cache hit on all but one)
    out = k(x, w1_shard, b1_shard, w2_shard)                     # under torchrun: each rank passes its shards

The Graph IR of a sharded kernel carries ``tessera.sharding`` (the mesh, each parameter's split, each
output's). ``tessera.InsertCollectives`` adds the collectives it implies (``tessera_tvm.graph.insert_collectives``):
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
Running a compiled sharded kernel (buckets, ``wait=False``, timeouts) is
:mod:`tessera.sharded_runtime`'s.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tessera_tvm.graph.collectives import Collective, read_collectives, split_pieces
from tessera_tvm.graph.sharding import SHARDING_ATTR, RankDependent

from .errors import KernelError, TesseraError
from .kernel import Kernel

__all__ = [
    "CollectiveError",
    "Mesh",
    "Replicate",
    "ShardedKernel",
    "Split",
    "shard",
    "unzigzag",
    "zigzag_piece",
]

#: Bucket size for coalesced all-reduces (seed 004 §6: 8-32 MB).
DEFAULT_BUCKET_MB = 16.0


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


def __getattr__(name: str):
    # The runtime's names, from the module that runs sharded kernels (it imports this one).
    if name in ("Pending", "ShardedCompiledKernel"):
        from . import sharded_runtime

        return getattr(sharded_runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
