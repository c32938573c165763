"""Fixtures for the Tenstorrent tests: kernel/plan directories and one emulator cache per session.

``TESSERA_TT_EMU_CACHE`` is where compiled emulator objects go: tests/conftest.py points it into the
run's cache, so the runner and each kernel are built once per run, shared by the xdist workers; set
it yourself to reuse them across runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def kernels_dir() -> Path:
    return HERE / "kernels"


@pytest.fixture(scope="session")
def plans_dir() -> Path:
    return HERE / "plans"


@pytest.fixture(scope="session")
def tt_cache(tmp_path_factory) -> Path:
    env = os.environ.get("TESSERA_TT_EMU_CACHE")
    if env:
        return Path(env)
    return tmp_path_factory.mktemp("tt_emu_cache")
