"""Setting ``TESSERA_*`` variables of this process for a while (a replay's recorded build settings,
an autotuning run's private kernel cache)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def environment_set(values: Mapping[str, str | None]) -> Iterator[None]:
    """``os.environ`` with each of ``values`` set (None: unset) inside the block, as it was after it."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        _assign(values)
        yield
    finally:
        _assign(saved)


def _assign(values: Mapping[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
