"""A corpus of TileLang programs of the kinds TileLang users write, written for these tests.

Each family module (``gemm_family.py``, ``attention.py``, ...) lists its programs in ``CASES``;
``CORPUS`` gathers them. ``tests/pipeline/test_corpus.py`` lowers every case with
``tilelang.lower`` and with ``tessera_tvm.lower`` for hopper, ampere and rocm and compares them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Case:
    """One program of the corpus.

    ``build()`` returns what a user hands to ``tessera_tvm.lower``: a ``@T.prim_func`` program,
    an IRModule, or a ``@tilelang.jit`` kernel. ``features`` names the TileLang features it uses
    (``annotate_layout``, ``symbolic``, ``reducer``, ``atomic``, ``pipelined``, ``warp_specialized``,
    ``fp8``, ``int4``, ``fp4``, ``split_k``, ``stream_k``, ``jit_pass_configs``, ...).
    ``targets`` are the configs it is compared on. ``cpu``, when set, returns
    ``(program, run)`` for a CPU form of the kernel: ``run(lowered)`` calls the CPU build on numpy
    arrays and checks the result against numpy (dynamic-shape kernels run this way).
    ``pass_configs`` are TileLang pass configs the program needs (given to both lowerings).
    ``fixed_on`` are the configs where a Tessera pass in ``TESSERA_FIXES`` (tests/pipeline/test_corpus.py)
    deliberately changes TileLang's source, because TileLang's kernel is wrong there.
    ``gpu``, when set, runs the program's Hopper build on a GPU: ``gpu(kernel)`` makes torch
    inputs on ``device`` (a keyword, default ``"cuda"``), calls ``kernel(*tensors)`` (the tile
    program's buffers in order, outputs written in place) and checks the outputs against torch.
    Where there is no GPU, ``gpu(fake, device="cpu")`` with a torch stand-in for the kernel checks the
    check itself.
    """

    name: str
    build: Callable[[], Any]
    features: tuple[str, ...] = ()
    targets: tuple[str, ...] = ("hopper", "ampere", "rocm")
    cpu: Callable[[], tuple[Any, Callable[[Any], None]]] | None = None
    pass_configs: dict[str, Any] = field(default_factory=dict)
    gpu: Callable[..., None] | None = None
    fixed_on: tuple[str, ...] = ()


def corpus() -> dict[str, Case]:
    """Every case of every family module, by name."""
    from . import attention, dequant, gemm_family, grouped, misc, norms, scans, sparse_attention

    cases: dict[str, Case] = {}
    for module in (gemm_family, grouped, norms, attention, sparse_attention, dequant, misc, scans):
        for case in module.CASES:
            if case.name in cases:
                raise ValueError(f"two corpus programs are named {case.name!r}")
            cases[case.name] = case
    return cases
