"""The graph phase: registered Relax passes from a traced function to fused kernels.

The config's ``graph:`` list (by default configs/shared/graph.yaml) names them; each is a registry
entry in its own file:

    relax.CanonicalizeBindings   drop aliases (``y = x``)
    tessera.Simplify             algebraic simplification (simplify.py)
    relax.DeadCodeElimination    drop unused bindings
    tessera.InsertCollectives    a sharded kernel's collectives, as bindings fusion does not cross (insert_collectives.py)
    tessera.FuseEpilogues        matmul + transposes + epilogue, attention + its layout permutes
    tessera.FuseKernels          softmax / norms / reductions (+ trailing cast), element-wise trees
    tessera.OutlineKernels       one private Relax function per kernel; the kernel calls them in order

:func:`tessera_tvm.pipeline.run_graph_passes` (the driver) runs the list like the TIR phases
(``PassContext`` acts on it, each pass is recorded and dumped) and returns a :class:`GraphIR`: the
traced module, the outlined one, the kernel groups read back from it, and one :class:`PassRecord`
per pass (``phase="graph"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..pass_log import PassRecord
from . import (  # noqa: F401  (register the passes)
    decompose,
    fuse_epilogues,
    fuse_kernels,
    insert_collectives,
    outline_kernels,
    simplify,
)
from .fusion import KernelGroup
from .nodes import FlatFunction


@dataclass
class GraphIR:
    """A kernel's Graph IR: the traced function, the simplified one, its fused kernels, the pass log."""

    name: str
    traced: Any  # IRModule as traced
    simplified: FlatFunction | None = None
    module: Any = None  # IRModule after every pass (kernels outlined)
    groups: list[KernelGroup] = field(default_factory=list)
    records: list[PassRecord] = field(default_factory=list)

    @property
    def params(self) -> list[Any]:
        return self.simplified.params

    @property
    def outputs(self) -> list[Any]:
        return self.simplified.outputs

    def text(self, traced: bool = False) -> str:
        return (self.traced if traced else self.module).script()


def graph_pass_names(config=None) -> list[str]:
    """The names in ``config``'s graph list (the shared list when None)."""
    from ..config import load_config
    from ..config_pipeline import graph_phase_default

    entries = graph_phase_default() if config is None else load_config(config).phase("graph")
    return [entry.name for entry in entries]
