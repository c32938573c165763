"""``metadata.json``: the kernel metadata a lowering writes beside its source.

The driver writes it after codegen (``tessera_tvm.lower``); a backend writes it again when its build
adds to it (CUDA: ptxas's registers per thread).
"""

from __future__ import annotations

import json

from .toolchain import write_text_atomic


def metadata_json(metadata: list[dict]) -> str:
    """The text of metadata.json: one entry per kernel, keys in the seed's order."""
    return json.dumps(metadata, indent=2) + "\n"


def write_metadata(lowered) -> None:
    """Write ``lowered.metadata`` (a LoweredModule's) to its ``metadata`` artifact, atomically."""
    write_text_atomic(lowered.artifacts["metadata"], metadata_json(lowered.metadata))
