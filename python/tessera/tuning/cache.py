"""The tuning cache: the key one fused kernel's search is stored under (its spec with its shapes, the
fixed fields, the space, the surviving candidates, the config fingerprint, the versions of
Tessera/TileLang/TVM/compiler, the machine, ``repeats`` and ``compile_timeout``), where the records live
(``$TESSERA_CACHE_DIR/autotune``, next to the kernels), and the kernel cache the compile workers build
into and this process measures from (a private one when ``TESSERA_DISABLE_CACHE`` is set).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from tessera_tvm.cache import KernelCache, versions
from tessera_tvm.capture import cpu_info

from .._environ import environment_set
from .space import _Plan

_FORMAT = 2  # of the tuning cache's records (2: fastest sample, not the median)


def _machine() -> str:
    """What the timings were measured on (timings from another CPU are not this one's)."""
    model = cpu_info().get("model name", platform.processor() or platform.machine())
    return f"{platform.system()} {platform.machine()} {model} x{os.cpu_count()}"


def _tuning_key(plan: _Plan, config, fixed: dict, space: dict, repeats: int, compile_timeout: float | None) -> str:
    payload = json.dumps(
        {
            "format": _FORMAT,
            "kernel": plan.name,
            "spec": plan.spec.fingerprint(),  # the fused computation with its shapes and dtypes
            "fixed": fixed,
            "space": {k: list(v) for k, v in space.items()},
            "candidates": [c.schedule.tile_schedule().fingerprint() for c in plan.live],
            "config": config.fingerprint(),
            "versions": versions(config),
            "machine": _machine(),
            "repeats": repeats,
            "compile_timeout": compile_timeout,  # a longer limit may compile what this one failed
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _tuning_cache(kernels: KernelCache) -> KernelCache:
    """The tuning results live next to the kernels: ``$TESSERA_CACHE_DIR/autotune``."""
    return KernelCache(kernels.root / "autotune" if kernels.enabled else None)


@contextmanager
def _kernel_cache_for_tuning() -> Iterator[dict[str, str]]:
    """A kernel cache for the workers to build into and this process to measure from; yields the
    workers' environment. With the cache disabled (``TESSERA_DISABLE_CACHE``) a private one serves
    this run and is removed after."""
    if KernelCache.from_env().enabled:
        yield {}
        return
    root = tempfile.mkdtemp(prefix="tessera_tune_")
    try:
        with environment_set({"TESSERA_CACHE_DIR": root, "TESSERA_DISABLE_CACHE": None}):
            yield {"TESSERA_CACHE_DIR": root}
    finally:
        shutil.rmtree(root, ignore_errors=True)
