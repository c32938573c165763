"""Fixtures of the Relax integration tests (models in tests/relax/models.py)."""

from __future__ import annotations

import pytest

from .models import block_module


@pytest.fixture(scope="session")
def cpu_block():
    """The block partitioned and compiled for the CPU once per session (tessera_tvm.relax.build)."""
    from tessera_tvm.relax import build

    mod, params = block_module("float32")
    return build(mod, "cpu"), params
