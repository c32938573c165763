"""The packed panel layout of the CPU GEMM micro-kernel, defined once.

The micro-kernel of ``tessera/cpu_gemm.h`` reads its B operand in *strips* of ``strip`` columns
(the register tile's NR): element (k, c) of a ``count x depth`` panel sits at
``(c // strip) * strip * depth + k * strip + c % strip``, and the last strip is zero-padded to
``strip`` columns. ``tessera_cpu_pack_b_<dtype>`` writes that layout for one block's K step at run
time; :func:`pack_strips` is its definition in numpy, against which the tests check the C packing.

A GEMM whose B is a constant (a linear layer's weight, from Relax) can take B already packed:
:class:`PackedPanels` lays out every (column block, K step) panel the CPU tile program reads, one
after the other, so the program passes each panel's address to the micro-kernel instead of packing
it (``GemmSpec.packed_b``; tile/gemm.py). :meth:`PackedPanels.pack` computes it with numpy when the
module is built; :meth:`PackedPanels.offset` is where the program finds a panel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .base import _check_positive


def _round_up(value: Any, multiple: int) -> Any:
    """``value`` rounded up to a multiple of ``multiple`` (an int, or a TIR expression: ``//`` floors)."""
    return (value + (multiple - 1)) // multiple * multiple


def pack_strips(panel: np.ndarray, strip: int) -> np.ndarray:
    """``panel`` ([count, depth]: element c's k values in row c) in strips of ``strip`` elements,
    flat: ``out[(c // strip) * strip * depth + k * strip + c % strip] = panel[c, k]``, the last strip
    zero-padded. What ``tessera_pack_strips<strip>`` in tessera/cpu_gemm.h writes (B in strips of NR
    columns, A in strips of MR rows)."""
    count, depth = panel.shape
    padded = np.zeros((_round_up(count, strip), depth), dtype=panel.dtype)
    padded[:count] = panel
    return padded.reshape(-1, strip, depth).transpose(0, 2, 1).reshape(-1)


@dataclass(frozen=True)
class PackedPanels:
    """B packed ahead for a CPU GEMM of ``block_n``-column blocks and ``block_k`` K steps, in strips
    of ``strip`` columns (:func:`pack_strips`), in fp32.

    Panel (column block ``bx``, K step ``kb``) holds columns ``bx * block_n`` .. and k
    ``kb * block_k`` .., ``cols = min(block_n, N - bx * block_n)`` by ``depth = min(block_k, K - kb *
    block_k)``, in ``round_up(cols, strip) * depth`` floats. A column block's panels follow each
    other in K order, and the column blocks follow each other: a whole column block takes
    ``round_up(cols, strip) * K`` floats.
    """

    block_n: int
    block_k: int
    strip: int

    def __post_init__(self) -> None:
        for field in ("block_n", "block_k", "strip"):
            _check_positive("PackedPanels", field, getattr(self, field))

    def elements(self, N: int, K: int) -> int:
        """Floats of the packed B of an ``N``-column, ``K``-deep operand (one batch element)."""
        full, last = divmod(N, self.block_n)
        return (full * _round_up(self.block_n, self.strip) + (_round_up(last, self.strip) if last else 0)) * K

    def offset(self, N: Any, K: Any, bx: Any, kb: Any) -> Any:
        """Where panel (``bx``, ``kb``) starts, in floats (ints, or TIR expressions in a tile program)."""
        cols = _min(self.block_n, N - bx * self.block_n)
        return bx * (_round_up(self.block_n, self.strip) * K) + _round_up(cols, self.strip) * (kb * self.block_k)

    def pack(self, b: np.ndarray, *, transposed: bool) -> np.ndarray:
        """``b`` ([*batch, K, N], or [*batch, N, K] when ``transposed``: a linear's weight) packed:
        ``[*batch, elements(N, K)]`` float32. fp16/bf16 are widened exactly, as the C packing does."""
        kn = np.swapaxes(b, -1, -2) if transposed else b
        *batch, K, N = kn.shape
        packed = np.zeros((*batch, self.elements(N, K)), dtype=np.float32)
        flat_in = kn.reshape(-1, K, N)
        flat_out = packed.reshape(-1, packed.shape[-1])
        for bx in range(-(-N // self.block_n)):
            c0 = bx * self.block_n
            cols = min(self.block_n, N - c0)
            for kb in range(-(-K // self.block_k)):
                k0 = kb * self.block_k
                depth = min(self.block_k, K - k0)
                start = self.offset(N, K, bx, kb)
                size = _round_up(cols, self.strip) * depth
                for i, matrix in enumerate(flat_in):
                    panel = matrix[k0 : k0 + depth, c0 : c0 + cols].T.astype(np.float32)
                    flat_out[i, start : start + size] = pack_strips(panel, self.strip)
        return packed


def _min(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    from .._tvm import T

    return T.min(a, b)
