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
    if "TESSERA_CACHE_DIR" not in os.environ:
        os.environ["TESSERA_CACHE_DIR"] = tempfile.mkdtemp(prefix="tessera_test_cache_")
        _OWN_CACHE.append(os.environ["TESSERA_CACHE_DIR"])


def pytest_unconfigure(config):
    # The cache holds ~70 MB of precompiled prelude (tessera_tvm.target.cpu) besides the kernels.
    for path in _OWN_CACHE:
        shutil.rmtree(path, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
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
