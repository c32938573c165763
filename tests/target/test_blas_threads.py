"""One set of threads (src/target/cpu/blas_threads.py): numpy's OpenBLAS runs its parallel work on
the CPU kernels' OpenMP threads, gives the same results, never runs a call's jobs one after another
(they wait for one another), and a forked child neither hangs in a kernel nor in numpy."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from tessera_tvm.target.cpu import blas_threads

DOJOB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
RUN_JOBS = ctypes.CFUNCTYPE(None, ctypes.c_int, DOJOB, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int)


def _run_jobs_together(numjobs: int) -> list[int]:
    """Call the callback as OpenBLAS does with ``numjobs`` jobs that each wait at a barrier for all
    the others (as a level-3 call's jobs wait for one another's panels); return the indices passed."""
    run = RUN_JOBS(blas_threads._callback_address())  # built and loaded even where no OpenBLAS is switched
    barrier = threading.Barrier(numjobs, timeout=20)
    seen: list[int] = []
    data = (ctypes.c_int * numjobs)(*range(numjobs))

    @DOJOB
    def job(index, jobdata, dojob_data):
        seen.append(ctypes.cast(jobdata, ctypes.POINTER(ctypes.c_int))[0] * 1000 + index + dojob_data)
        barrier.wait()  # raises BrokenBarrierError (swallowed by ctypes) if the others never come

    run(1, job, numjobs, ctypes.sizeof(ctypes.c_int), ctypes.cast(data, ctypes.c_void_p), 0)
    assert not barrier.broken, "the jobs did not all run at the same time"
    return sorted(seen)


def test_every_job_runs_at_the_same_time_with_its_own_index():
    assert _run_jobs_together(5) == [i * 1000 + i for i in range(5)]
    assert _run_jobs_together(1) == [0]


def test_numpy_blas_runs_on_the_kernel_threads_with_the_same_results():
    if not blas_threads.share_blas_threads():
        pytest.skip("no pthreads OpenBLAS with a threads callback in this numpy")
    rng = np.random.default_rng(0)
    cases = [
        rng.standard_normal((512, 384), dtype=np.float32),
        rng.standard_normal((300, 700)),  # float64
        rng.standard_normal((256, 256)).astype(np.complex128),
    ]

    def results():
        out = [x @ x.T for x in cases] + [x @ x[0] for x in cases]  # GEMM, GEMV
        out.append(np.linalg.solve(cases[1] @ cases[1].T + np.eye(300), np.ones(300)))
        return out

    blas_threads.stop_sharing_blas_threads()
    try:
        own = results()
    finally:
        blas_threads.share_blas_threads()
    before = blas_threads.calls_on_kernel_threads()
    shared = results()
    assert blas_threads.calls_on_kernel_threads() > before  # the calls were handed to the callback
    for got, want in zip(shared, own, strict=True):
        np.testing.assert_array_equal(got, want)

    # numpy from several Python threads at once: one call at a time on the kernel threads, each right.
    x = cases[0]
    want = x @ x.T
    failures: list[str] = []

    def hammer():
        for _ in range(20):
            if not np.array_equal(x @ x.T, want):
                failures.append("wrong result")

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures and not any(t.is_alive() for t in threads)


def test_switched_off_by_the_environment(monkeypatch):
    blas_threads.stop_sharing_blas_threads()
    monkeypatch.setenv("TESSERA_SHARE_BLAS_THREADS", "0")
    try:
        assert blas_threads.share_blas_threads() == []
        np.ones((512, 512), np.float32) @ np.ones((512, 512), np.float32)
    finally:
        monkeypatch.delenv("TESSERA_SHARE_BLAS_THREADS")
        blas_threads.share_blas_threads()


def _python(script: str, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_smaller_openmp_team_starts_threads_for_the_other_jobs():
    """OMP_THREAD_LIMIT=1: the team has one thread, so the jobs past it get threads of their own
    (run one after another they would deadlock); numpy's threaded GEMM is still right."""
    out = _python(
        """
        import numpy as np
        from tessera_tvm.target.cpu import blas_threads
        from tests.target.test_blas_threads import _run_jobs_together
        assert _run_jobs_together(3) == [0, 1001, 2002]
        assert blas_threads._callback.tessera_blas_jobs_spawned() == 2
        if blas_threads.shared_blas_libraries():
            x = np.random.default_rng(1).standard_normal((512, 512))
            blas_threads.stop_sharing_blas_threads()
            want = x @ x
            blas_threads.share_blas_threads()
            assert np.array_equal(x @ x, want)
        print("ok")
        """,
        OMP_THREAD_LIMIT="1",
    )
    assert out.strip() == "ok"


def test_a_forked_child_runs_kernels_and_numpy_after_the_parent_did():
    """GNU OpenMP does not survive a fork: before blas_threads, a kernel called in the child of a
    process that had run one waited forever. Now the child's kernels run on one thread and its
    numpy on OpenBLAS's own threads."""
    out = _python(
        """
        import os, signal
        import numpy as np
        import tessera as ts
        from tessera import Tensor, ops

        @ts.kernel
        def mm(A: Tensor["M", "K", ts.f32], B: Tensor["K", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
            return ops.matmul(A, B)

        a = np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32)
        k = ts.compile(mm, target="cpu", shapes={"M": 256, "N": 256, "K": 256})
        want = np.asarray(k(a, a)).copy()
        blas = a.astype(np.float64) @ a.astype(np.float64)  # on the kernel threads where switched
        pid = os.fork()
        if pid == 0:
            signal.alarm(30)  # a hang ends the child with SIGALRM
            ok = np.array_equal(np.asarray(k(a, a)), want) and np.array_equal(
                a.astype(np.float64) @ a.astype(np.float64), blas)
            ok = ok and os.environ["TESSERA_NUM_THREADS"] == "1"
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """
    )
    assert out.strip() == "0"
