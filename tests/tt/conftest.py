"""Fixtures for the Tenstorrent tests: kernel/plan directories and one emulator cache per session.

Set ``TESSERA_TT_EMU_CACHE`` to reuse compiled emulator objects across sessions; by default the
session compiles the emulator runner once into a temporary directory and every kernel once.
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
