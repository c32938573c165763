"""tessera.SerializeSelfUpdatingIfs: an ``if`` that writes what its condition reads keeps one
evaluation of the condition, where TileLang 0.1.15's VectorizeLoop evaluates it again per statement."""

from __future__ import annotations

import re

import numpy as np

import tessera_tvm
from tessera_tvm._tvm import T, tilelang, tvm

N = 64


@T.prim_func
def running_max_and_source(
    V: T.Tensor((N,), "float32"),
    W: T.Tensor((N,), "float32"),
    Best: T.Tensor((N,), "float32"),
    Which: T.Tensor((N,), "int32"),
):
    # Best = max(V, W) and Which = 1 where W won: the if writes best, which its condition reads.
    with T.Kernel(1) as _:
        best = T.alloc_local((N,), "float32")
        which = T.alloc_local((N,), "int32")
        for i in T.vectorized(N):
            best[i] = V[i]
            which[i] = 0
        for i in T.vectorized(N):
            if W[i] > best[i]:
                best[i] = W[i]
                which[i] = 1
        for i in T.vectorized(N):
            Best[i] = best[i]
            Which[i] = which[i]


@T.prim_func
def argmax_over_fragments(V: T.Tensor((512,), "float32"), Out: T.Tensor((512,), "int32")):
    # A running best over fragments, as argmax kernels keep it: each thread owns 4 elements.
    with T.Kernel(1, threads=128) as _:
        cand = T.alloc_fragment((512,), "float32")
        best = T.alloc_fragment((512,), "float32")
        best_idx = T.alloc_fragment((512,), "int32")
        T.fill(best, 0)
        T.fill(best_idx, -1)
        for i in T.Parallel(512):
            cand[i] = V[i]
        for i in T.Parallel(512):
            if cand[i] > best[i]:
                best[i] = cand[i]
                best_idx[i] = i
        for i in T.Parallel(512):
            Out[i] = best_idx[i]


@T.prim_func
def guarded_without_feedback(
    V: T.Tensor((N,), "float32"),
    W: T.Tensor((N,), "float32"),
    Best: T.Tensor((N,), "float32"),
    Which: T.Tensor((N,), "int32"),
):
    # The same loops, but the guarded stores write what the condition does not read: left alone.
    with T.Kernel(1) as _:
        base = T.alloc_local((N,), "float32")
        best = T.alloc_local((N,), "float32")
        which = T.alloc_local((N,), "int32")
        for i in T.vectorized(N):
            base[i] = V[i]
            best[i] = V[i]
            which[i] = 0
        for i in T.vectorized(N):
            if W[i] > base[i]:
                best[i] = W[i]
                which[i] = 1
        for i in T.vectorized(N):
            Best[i] = best[i]
            Which[i] = which[i]


def test_the_cpu_kernel_gives_the_written_answer():
    kernel = tessera_tvm.lower(running_max_and_source, "cpu")
    rng = np.random.default_rng(0)
    v, w = rng.standard_normal(N, dtype=np.float32), rng.standard_normal(N, dtype=np.float32)
    best, which = np.zeros(N, np.float32), np.zeros(N, np.int32)
    kernel(v, w, best, which)
    np.testing.assert_array_equal(best, np.maximum(v, w))
    np.testing.assert_array_equal(which, (w > v).astype(np.int32))  # all zeros without the pass


def _loop_bodies(source: str) -> list[str]:
    return re.findall(r"for \(int \w+ = 0; \w+ < 4; \+\+\w+\) \{(.*?)\n  \}", source, re.S)


def test_the_hopper_kernel_tests_the_condition_once_for_both_stores():
    ours = tessera_tvm.lower(argmax_over_fragments, "hopper", build=False).source
    (body,) = _loop_bodies(ours)  # one loop: best and best_idx under one evaluation
    assert body.count("if (") == 1 and "best[" in body and "best_idx[" in body
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}) as target:
        theirs = tilelang.lower(argmax_over_fragments, target=target).kernel_source
    # TileLang 0.1.15 splits it into two loops, the second re-testing best after the first set it.
    assert [b.count("if (") for b in _loop_bodies(theirs)] == [1, 1]


def _around_the_pass(program, tmp_path) -> tuple[str, str]:
    """The IR just before and just after tessera.SerializeSelfUpdatingIfs, as TVMScript."""
    tessera_tvm.lower(program, "cpu", build=False, dump_dir=tmp_path)
    (after,) = sorted(tmp_path.rglob("*_tessera.SerializeSelfUpdatingIfs.py"))
    before = sorted(p for p in after.parent.iterdir() if p.name < after.name)[-1]
    return before.read_text(), after.read_text()


def _guarded_loop_kind(script: str) -> str:
    """How the loop holding the ``if`` runs: ``T.vectorized``, ``T.grid``..."""
    (loop,) = [chunk for chunk in script.split("for ")[1:] if re.search(r"\n\s+if ", chunk)]
    return loop.split(" in ", 1)[1].split("(", 1)[0]


def test_only_the_loop_whose_if_feeds_its_condition_becomes_serial(tmp_path):
    before, after = _around_the_pass(running_max_and_source, tmp_path / "a")
    assert (_guarded_loop_kind(before), _guarded_loop_kind(after)) == ("T.vectorized", "T.grid")
    before, after = _around_the_pass(guarded_without_feedback, tmp_path / "b")
    assert before == after  # (the corpus shows the same for 45 programs: their sources equal TileLang's)
