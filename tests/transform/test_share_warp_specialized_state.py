"""tessera.ShareWarpSpecializedState: per-thread state that both warp groups of a warp-specialised
Hopper kernel read is updated in both, or the lowering fails with the workaround. TileLang 0.1.15's
own kernels for these programs hang (stream-K) or load the wrong tiles (a walking K offset)."""

from __future__ import annotations

import re

import pytest

import tessera_tvm
from tessera_tvm._tvm import T, tilelang, tvm
from tessera_tvm.errors import LoweringError
from tests.programs.gemm_family import gemm_stream_k

NO_WS = {"tl.disable_warp_specialized": True}


def _branches(source: str) -> tuple[str, str]:
    """The producer and consumer branches of a warp-specialised kernel's source."""
    start = source.index("if (((int)threadIdx.x) < 128) {")
    split = source.index("} else {", start)
    return source[start:split], source[split:]


def test_stream_k_advances_its_position_in_both_warp_groups():
    update = "it = ((it + k_end) - k_begin);"
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}) as target:
        theirs = tilelang.lower(gemm_stream_k(512, 512, 512), target=target).kernel_source
    producer, consumer = _branches(theirs)
    assert update not in producer and update in consumer  # TileLang's: the producer never moves on
    ours = tessera_tvm.lower(gemm_stream_k(512, 512, 512), "hopper", build=False).source
    producer, consumer = _branches(ours)
    assert update in producer and update in consumer
    # The producer's copy comes after its loads, where the segment's loop and the outer test read it.
    assert producer.index(update) > producer.rindex("tma_load")
    assert ours.replace(update, "", 2).count(update) == 0 and ours.count(update) == 2


def test_without_warp_specialisation_nothing_changes():
    ours = tessera_tvm.lower(gemm_stream_k(512, 512, 512), "ampere", build=False).source
    with tvm.target.Target({"kind": "cuda", "arch": "sm_80"}) as target:
        assert ours == tilelang.lower(gemm_stream_k(512, 512, 512), target=target).kernel_source


def walking_k(M=256, K=512, block_k=32):
    # A K offset kept in a variable and stepped after each block's GEMM: the split gives the step to
    # the consumer and leaves the producer loading block 0 every time.
    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, 128), "float16"), C: T.Tensor((M, 128), "float32")):
        with T.Kernel(M // 128, threads=128) as bx:
            a = T.alloc_shared((128, block_k), "float16")
            b = T.alloc_shared((block_k, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            cur = T.alloc_var("int32")
            cur = 0
            T.clear(acc)
            for _ in T.Pipelined(K // block_k, num_stages=2):
                T.copy(A[bx * 128, cur * block_k], a)
                T.copy(B[cur * block_k, 0], b)
                T.gemm(a, b, acc)
                cur = cur + 1
            T.copy(acc, C[bx * 128, 0])

    return main


def test_a_step_the_producer_would_miss_is_an_error_that_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    with pytest.raises(LoweringError) as info:
        tessera_tvm.lower(walking_k(), "hopper", build=False)
    message = str(info.value)
    assert "'cur'" in message and "tl.ProducerConsumerWarpSpecialized" in message
    assert "tl.disable_warp_specialized" in message and "warp_specialization: false" in message
    # TileLang builds it: the producer's loads stay at cur = 0 (`cur * 32` with cur never stepped).
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}) as target:
        theirs = tilelang.lower(walking_k(), target=target).kernel_source
    producer, consumer = _branches(theirs)
    assert "cur * 32" in producer and "cur = (cur + 1)" not in producer and "cur = (cur + 1)" in consumer
    # The workaround the message names builds it, with the step where every thread sees it.
    with tvm.transform.PassContext(config=NO_WS):
        source = tessera_tvm.lower(walking_k(), "hopper", build=False).source
    assert "threadIdx.x) < 128" not in source and re.search(r"cur = \(cur \+ 1\)", source)


def test_state_only_one_warp_group_reads_is_left_alone():
    # The pipeline phase counters are each warp group's own: every GEMM keeps TileLang's source.
    from tests.programs import gemm as programs

    func = programs.gemm(1024, 1024, 1024, 128, 128, 32, stages=3)
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}) as target:
        theirs = tilelang.lower(func, target=target).kernel_source
    assert "producer_phase_cnt" in theirs or "threadIdx.x) < 128" in theirs
    assert (
        tessera_tvm.lower(programs.gemm(1024, 1024, 1024, 128, 128, 32, stages=3), "hopper", build=False).source
        == theirs
    )
