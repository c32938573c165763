"""Shared fixtures: marks for GPU and nvcc tests, and the repository root."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


_OWN_CACHE: list[str] = []


def pytest_configure(config):
    # Tests start from an empty kernel cache of their own, never the user's ~/.cache.
    # The xdist workers inherit this environment, so a run's workers share one cache (safe under
    # concurrency: one compile per key, tessera_tvm/cache.py) and reuse each other's kernels.
    if "TESSERA_CACHE_DIR" not in os.environ:
        os.environ["TESSERA_CACHE_DIR"] = tempfile.mkdtemp(prefix="tessera_test_cache_")
        _OWN_CACHE.append(os.environ["TESSERA_CACHE_DIR"])
    # Tests that need a cache of their own (an empty one, a damaged one) still share the run's
    # precompiled C prelude (~5 s of g++ each time otherwise); the prelude's own tests unset this.
    os.environ.setdefault("TESSERA_PCH_DIR", os.path.join(os.environ["TESSERA_CACHE_DIR"], "pch"))
    # The Tenstorrent emulator's runner and kernels likewise: built once per run, not per test.
    os.environ.setdefault("TESSERA_TT_EMU_CACHE", os.path.join(os.environ["TESSERA_CACHE_DIR"], "tt_emu"))
    # TVM's host C of the Relax builds at -O0 (the kernels keep the config's -O3): the same values,
    # about a third of the g++ time; users and the benchmarks get the config's flags
    # (tessera_tvm.target.cpu.host_library.HOST_OPT_ENV; test_host_library.py covers both).
    os.environ.setdefault("TESSERA_HOST_C_OPT", "-O0")
    # Kernels link Tessera's CPU runtime objects (tessera_tvm.target.cpu.build.RUNTIME_ENV): a GEMM
    # kernel's g++ 0.45 -> 0.15 s; the g++ children of the suite ~12% less CPU (session 40). The inline
    # default is what tile/test_gemm_microkernel.py's harnesses and test_cpu_runtime_objects.py build.
    os.environ.setdefault("TESSERA_CPU_RUNTIME", "linked")


def pytest_unconfigure(config):
    # The cache holds ~70 MB of precompiled prelude (tessera_tvm.target.cpu) besides the kernels.
    for path in _OWN_CACHE:
        shutil.rmtree(path, ignore_errors=True)


#: ``./tessera.sh test --quick`` (``pytest -m quick``): the edit-test loop, about 3 minutes on 2 cores.
#: Whole files, fast ones, at least one per folder of tests/ so that every package is touched
#: (tests/test_quick_subset.py checks that); the full suite is what CI runs.
QUICK_FILES = (
    "tests/config/test_load_config.py",
    "tests/distributed/test_sharding.py",
    "tests/frontend/test_compile.py",
    "tests/frontend/test_errors.py",
    "tests/frontend/test_graph.py",
    "tests/frontend/test_types.py",
    "tests/graph/test_fuse_epilogues.py",
    "tests/graph/test_simplify.py",
    "tests/pipeline/test_golden_passes.py",
    "tests/pipeline/test_pass_context.py",
    "tests/pipeline/test_registry.py",
    "tests/relax/test_usage_traps.py",
    "tests/robustness/test_pack_security.py",
    "tests/runtime/test_export.py",
    "tests/target/test_backend.py",
    "tests/target/test_toolchain.py",
    "tests/target/tt/test_arch.py",
    "tests/target/tt/test_emulator.py",
    "tests/target/tt/transform/test_verify_tt_ir.py",
    "tests/test_cache.py",
    "tests/test_import_layers.py",
    "tests/test_read_only_arrays.py",
    "tests/test_source_layout.py",
    "tests/tile/test_elementwise.py",
    "tests/tile/test_spec.py",
    "tests/transform/test_parallel_grid.py",
    "tests/transform/test_verify_resources.py",
    "tests/transform/test_wrong_code_guards.py",
    "tests/upstream/test_bridge.py",
)


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(item.path).resolve()
        name = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else None
        if name in QUICK_FILES:
            item.add_marker(pytest.mark.quick)
        if name in ONE_WORKER_FILES:
            item.add_marker(pytest.mark.xdist_group(name))
    _skip_without_gpu_or_nvcc(items)
    # The files with the slowest tests (marked slow: a minute or more alone) start first, so that the
    # xdist workers do not end with one of them running while the others wait. Whole files move, in
    # their order: a worker that left a file midway would build its module fixtures again.
    slow_files = {i.path for i in items if "slow" in i.keywords}
    items[:] = [i for i in items if i.path in slow_files] + [i for i in items if i.path not in slow_files]


#: Files whose module fixtures cost seconds (a Ray cluster, a runtime built with the sanitizers, a
#: lowered module or CUDA library): one xdist worker runs each, so they are built once, not per worker.
ONE_WORKER_FILES = (
    "tests/frontend/test_autotune_ray.py",
    "tests/pipeline/test_lower.py",
    "tests/runtime/test_cuda_module.py",
    "tests/runtime/test_tsr.py",
    "tests/runtime/test_tvm_ffi_module.py",
    "tests/target/test_cuda_build.py",
)


def _skip_without_gpu_or_nvcc(items):
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (none found)")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc on PATH")
    from tessera_tvm.target.cuda import nvcc_available

    has_gpu, has_nvcc = _has_gpu(), nvcc_available()
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not has_nvcc:
            item.add_marker(skip_nvcc)


@pytest.fixture
def repo() -> Path:
    return REPO


def emu_cache() -> Path:
    """The run's Tenstorrent emulator cache (runner and kernels, shared by the xdist workers)."""
    return Path(os.environ["TESSERA_TT_EMU_CACHE"])


def pytest_runtest_logreport(report):
    # TESSERA_TEST_PROGRESS=FILE: one line per test phase that ran, and each failure's traceback, as
    # it happens (bench/device_run.sh: a run cut short by its time limit still says what failed).
    path = os.environ.get("TESSERA_TEST_PROGRESS")
    if not path or (report.when != "call" and not report.failed) or os.environ.get("PYTEST_XDIST_WORKER"):
        # (under pytest-xdist the controller writes: it sees every worker's reports)
        return
    with open(path, "a") as f:
        f.write(f"{report.outcome.upper()} {report.nodeid} ({report.when}, {report.duration:.1f} s)\n")
        if report.failed:
            f.write(report.longreprtext + "\n\n")
