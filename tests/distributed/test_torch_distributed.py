"""Sharded kernels on torch.distributed: 2 and 4 gloo ranks on localhost (spawned processes)."""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import socket
import time

import pytest

pytest.importorskip("torch.distributed")

from . import ranks  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context(backend: str = "gloo"):
    """Ranks forked from a server process that imported Tessera and torch.distributed once (the
    forkserver method: a fresh interpreter that ran nothing else), not each importing them (~3 s
    of CPU per rank with the spawn method). NCCL ranks are spawned: on a machine with a GPU,
    importing Tessera (TileLang) initialises CUDA in the server, and a forked rank then cannot use
    it ("Cannot re-initialize CUDA in forked subprocess", H200, 2026-11-30)."""
    if backend == "nccl":
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch.distributed", "tests.distributed.ranks"])  # before the server starts
    return ctx


def _spawn(
    world: int, scenarios: list[str], timeout: float = 240.0, backend: str = "gloo", check: bool = True
) -> dict[int, dict]:
    ctx = _context(backend)
    results = ctx.Queue()
    released = ctx.Event()  # set once every rank reported: rank 0 holds the store the others may still read
    port = _free_port()
    procs = [
        ctx.Process(target=ranks.run, args=(r, world, port, scenarios, results, backend, released))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    out: dict[int, dict] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < world and time.monotonic() < deadline:
            try:
                rank, data = results.get(timeout=1.0)
            except queue.Empty:
                # every rank yet to report has exited (a killed rank): what it sent is already in the pipe
                if all(not procs[r].is_alive() for r in range(world) if r not in out):
                    with contextlib.suppress(queue.Empty):
                        while len(out) < world:
                            rank, data = results.get(timeout=0.5)
                            out[rank] = data
                    break
                continue
            out[rank] = data
    finally:
        released.set()
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    return _checked(out, scenarios) if check else out


def _checked(out: dict[int, dict], scenarios: list[str]) -> dict[int, dict]:
    """``out`` cut to ``scenarios``, none of which raised on any rank."""
    for rank, data in out.items():
        for name in scenarios:
            d = data.get(name, {})
            assert "exception" not in d, f"rank {rank}, {name}:\n{d['exception']}"
    return {rank: {name: data[name] for name in scenarios if name in data} for rank, data in out.items()}


TENSOR_PARALLEL = ["mlp", "residual", "attention", "buckets", "overlap"]
SEQUENCE_PARALLEL = [
    *["sequence_parallel", "sequence_attention", "causal_sequence_attention", "sum_read_twice"],
    *["zigzag_attention", "ulysses_attention", "resplit"],
]
EVERY_SPLIT = ["every_split"]
#: Last in the shared ranks' list: a collective that times out leaves the process group unusable.
HUNG = ["timeout"]

# The tests of two ranks share one pair of ranks: each rank is a process that imports torch and
# Tessera (seconds per rank), so one start instead of four; the hung-rank scenario runs last. One
# worker runs them, and the fixture lives for the session: a module fixture is torn down whenever
# the worker runs a test of another file in between. (The dead-rank test starts its own.)
two_rank_group = pytest.mark.xdist_group("two_gloo_ranks")


@pytest.fixture(scope="session")
def two_ranks() -> dict[int, dict]:
    # 600 s: every_split compiles 15 kernels per rank, cold in CI
    return _spawn(2, TENSOR_PARALLEL + SEQUENCE_PARALLEL + EVERY_SPLIT + HUNG, timeout=600.0, check=False)


@two_rank_group
def test_two_ranks_tensor_parallel_mlp_residual_attention_buckets_and_overlap(two_ranks):
    out = _checked(two_ranks, TENSOR_PARALLEL)
    assert sorted(out) == [0, 1]
    for rank in (0, 1):
        residual = out[rank]["residual"]  # summed between the matmul kernel and the add + relu kernel
        assert residual["err"] < 1e-4 and residual["inner"] == ["matmul"] and residual["issued"] == 1, residual
        mlp = out[rank]["mlp"]
        assert mlp["err"] < 1e-4 and mlp["collectives"] == 1  # column- then row-parallel: one all-reduce
        assert mlp["torch_err"] is not None and mlp["torch_err"] < 1e-4  # torch CPU tensors in and out
        assert 'R.call_pure_packed("tessera.all_reduce"' in mlp["graph"]
        att = out[rank]["attention"]
        assert att["err"] < 1e-4 and att["shape"] == [1, 4, 24, 16]  # heads split, gathered back
        buckets = out[rank]["buckets"]
        assert buckets["16.0"] == 1 and buckets["1e-06"] == 3  # three all-reduces coalesced into one bucket
        assert buckets["err16.0"] < 1e-4 and buckets["err1e-06"] < 1e-4
    overlap = out[0]["overlap"]  # rank 1 enters the collective 1 s late
    assert overlap["returned_s"] < 0.3 and overlap["in_flight"], overlap
    assert overlap["computed"] >= 1 and overlap["err"] < 1e-4, overlap  # rank 0 computed while it was pending


def _check_sequence_parallel(out: dict, world: int) -> None:
    for rank in range(world):
        sp = out[rank]["sequence_parallel"]
        assert sp["err"] < 1e-4 and sp["torch_err"] < 1e-4, sp
        assert sp["kinds"] == [("all_gather", -1), ("reduce_scatter", -1)] and sp["issued"] == 2, sp
        assert "sched.collective  all_gather(rms_norm's output) over 'tp', dim 0 on torch.distributed" in sp["sched"]
        assert sp["whole_err"] < 1e-4 and sp["whole_shape"] == [32, 32], sp
        att = out[rank]["sequence_attention"]
        assert att["err"] < 1e-4 and att["shape"] == [1, 2, 16 * world, 16], att  # gathered back at the output
        assert att["softmax_err"] < 1e-5, att
    _check_causal_sequence_attention(out, world)


def _check_causal_sequence_attention(out: dict, world: int) -> None:
    for rank in range(world):
        causal = out[rank]["causal_sequence_attention"]  # each rank reads the keys up to its last query
        assert causal["err"] < 1e-4 and causal["whole_err"] < 1e-4 and causal["rank"] == rank, causal
        assert causal["masked_err"] < 1e-4, causal  # with a padding mask, gathered and cut like the keys
        prefix = [("prefix", rank + 1)] * 2 if rank < world - 1 else []  # the last rank reads all of them
        assert causal["kinds"] == [("all_gather", None)] * 2 + prefix, causal
        assert ("prefix(K_all_gather) over 'sp', dim 2, its first" in causal["sched"]) == (rank < world - 1)


def _check_zigzag_attention(out: dict, world: int) -> None:
    for rank in range(world):
        zz = out[rank]["zigzag_attention"]  # each half of the rank's queries reads the keys up to its last
        assert zz["err"] < 1e-4 and zz["whole_err"] < 1e-4 and zz["shape"] == [1, 4, 16, 16], zz
        assert zz["block_err"] < 1e-4, zz  # the joined halves read by the next kernel, with a padding mask
        assert (zz["mesh_err"] is None) == (world != 4) and (zz["mesh_err"] or 0.0) < 1e-4, zz  # 2 x 2 mesh
        first = [("prefix", rank + 1)] * 2
        second = [("prefix", 2 * world - rank)] * 2 if rank else []
        assert zz["kinds"] == [("all_gather", None)] * 2 + [("half", 0), *first, ("half", 1), *second, ("concat", None)]
        assert "(no communication: one of this rank's two zigzag pieces)" in zz["sched"], zz["sched"]


def _check_ulysses_attention(out: dict, world: int) -> None:
    for rank in range(world):
        u = out[rank]["ulysses_attention"]  # Q, K, V re-split on the heads and the result back
        assert u["err"] < 1e-4 and u["whole_err"] < 1e-4 and u["shape"] == [1, 2 * world, 16, 16], u
        assert u["block_err"] < 1e-4 and u["zigzag_err"] < 1e-4, u
        assert (u["mesh_err"] is None) == (world != 4) and (u["mesh_err"] or 0.0) < 1e-4, u  # 2 x 2 mesh
        assert u["kinds"] == [("all_to_all", 1, 2)] * 3 + [("all_to_all", 2, 1)], u
        # wanted whole: the heads gathered (the result's all-to-all back onto the sequence left out)
        assert u["zigzag_whole_err"] < 1e-4 and u["whole_kinds"] == [("all_to_all", 1)] * 3 + [("all_gather", 1)], u
        for split, pieces in (("contiguous", world), ("zigzag", 2 * world)):  # 2 key/value heads, 8 query heads
            few = u["few_kv"][split]
            repeats = [("repeat", pieces // 2)] * 2 if pieces > 2 else []  # 2 heads over 2 pieces: no repeat
            assert few["err"] < 1e-4, (split, few)
            assert few["kinds"] == [*repeats, *[("all_to_all", None)] * 4], (split, few)
            assert ("repeated up to the all-to-all's pieces" in few["sched"]) == bool(repeats), few["sched"]
        if world == 4:  # the heads gathered over "sp" before the batch over "dp"
            sp = [("all_to_all", "sp", 1)] * 3
            assert u["mesh_kinds"] == [*sp, ("all_gather", "sp", 1), ("all_gather", "dp", 0)], u
        qkv = [("all_to_all", n) for n in ("X", "K", "V")]
        assert u["block_kinds"] == [
            *qkv,
            ("all_gather", "M"),  # the padding mask's keys, whole as the heads' keys are
            ("all_to_all", "flash_attention's output"),  # back on the sequence for the projection
            ("all_gather", "output 0"),
        ], u
        assert "prefix" not in u["sched"]  # causal, yet one graph for every rank
        assert f"rank {rank}: all_to_all of K over 'sp' cuts its dim 1 (3) into {world} equal pieces" in u["refused"]


@pytest.mark.slow
@two_rank_group
def test_two_ranks_sequence_parallel_gathers_and_scatters_between_the_kernels(two_ranks):
    out = _checked(two_ranks, SEQUENCE_PARALLEL)
    _check_sequence_parallel(out, 2)
    _check_zigzag_attention(out, 2)
    _check_ulysses_attention(out, 2)
    for rank in (0, 1):
        for name, (err, kinds, issued) in out[rank]["resplit"].items():  # rows to columns: one all-to-all
            assert err < 1e-5 and kinds == ["all_to_all"] and issued == 1, (name, err, kinds, issued)
    for rank in (0, 1):
        twice = out[rank]["sum_read_twice"]
        assert twice["kinds"] == [("all_reduce", -1), ("all_reduce", 0)] and twice["err"] < 1e-4, twice


@pytest.mark.slow
def test_four_ranks_on_a_two_by_two_mesh_and_a_hung_rank_named_by_the_others():
    # What only four ranks have: the 2 x 2 mesh, and ranks between the first and the last (the
    # zigzag's prefixes). The causal prefix and the re-split run at two ranks (the test above).
    scenarios = ["mlp", "mesh_2d", "zigzag_attention", "ulysses_attention"]
    out = _spawn(4, [*scenarios, "hung_last"])
    _check_zigzag_attention(out, 4)
    _check_ulysses_attention(out, 4)
    for rank in range(3):
        error = out[rank]["hung_last"]["error"]
        assert error is not None and f"rank {rank}: all_reduce of output 0 of kernel mlp" in error, error
        assert "rank 3 did not answer: hung or gone" in error, error
    assert sorted(out) == [0, 1, 2, 3]
    for rank in range(4):
        assert out[rank]["mlp"]["err"] < 1e-4
        mesh = out[rank]["mesh_2d"]
        assert mesh["err"] < 1e-4 and mesh["shape"] == [8, 32] and mesh["collectives"] == 1  # all-reduce over tp only


@two_rank_group
def test_a_hung_rank_times_out_with_a_clear_error(two_ranks):
    out = _checked(two_ranks, HUNG)
    result = out[0]["timeout"]
    assert result["error"] is not None, "rank 0 returned although rank 1 never entered the collective"
    assert "rank 0: all_reduce of output 0 of kernel mlp over mesh axis 'tp' (ranks [0, 1])" in result["error"]
    assert "did not complete within 2 s: rank 1 did not answer: hung or gone" in result["error"]
    # the 2 s timeout and 1 s for the ranks to check in, not gloo's 60 s (slack for a loaded 2-core machine)
    assert result["seconds"] < 15.0, result


def test_a_dead_rank_is_detected_with_a_clear_error():
    out = _spawn(2, ["killed"], timeout=120.0)
    result = out[0]["killed"]
    assert result["error"] is not None, "rank 0 returned although rank 1 had died"
    assert "rank 0: all_reduce of output 0 of kernel mlp" in result["error"]
    assert "rank 1 did not answer: hung or gone" in result["error"]
    assert result["seconds"] < 7.0, result


@pytest.mark.gpu
def test_sequence_parallel_on_the_gpu_with_nccl():
    # one rank per GPU: on a one-GPU machine the mesh has one rank, and the collectives between the
    # kernels still run, on torch CUDA tensors through NCCL
    import torch

    world = torch.cuda.device_count()
    out = _spawn(world, ["gpu_sequence_parallel", "gpu_zigzag_attention", "gpu_ulysses_attention"], backend="nccl")
    for rank in range(world):
        u = out[rank]["gpu_ulysses_attention"]  # Q, K, V and the result all-to-all'd on CUDA tensors
        assert u["cuda"] and u["err"] < 3e-2 and u["kinds"] == ["all_to_all"] * 4, u
        zz = out[rank]["gpu_zigzag_attention"]  # halves, prefixes and the join on CUDA tensors
        assert zz["cuda"] and zz["err"] < 3e-2 and zz["kinds"][-1] == "concat", zz
        result = out[rank]["gpu_sequence_parallel"]
        assert result["cuda"] and result["issued"] == 2, result
        assert result["err"] < 5e-2, result  # bf16 values, f32 accumulation
        # wait=False: the output gather on a CUDA stream of its own, fenced by events
        assert result["whole_err"] < 5e-2 and result["whole_shape"] == [128 * world, 128] and result["other"], result


@two_rank_group
def test_every_sharding_of_a_block_runs_right_or_is_refused_by_name(two_ranks):
    out = _checked(two_ranks, EVERY_SPLIT)
    for rank in (0, 1):
        results = out[rank]["every_split"]["results"]
        assert len(results) == 15
        ran = [r for r in results if r[1] == "ran"]
        wrong = [r for r in ran if not r[2] < 1e-4]
        assert not wrong, wrong
        for what, _, why in (r for r in results if r[1] == "refused"):
            assert why.startswith("kernel block: ") and "'tp'" in why, (what, why)
        assert len(ran) == 15, results  # a result split otherwise than it comes is all-to-all'd
