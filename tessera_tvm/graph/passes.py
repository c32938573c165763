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

:func:`run_graph_passes` runs the list like the TIR phases (``PassContext`` acts on it, each pass
is recorded and dumped) and returns a :class:`GraphIR`: the traced module, the outlined one, the
kernel groups read back from it, and one :class:`PassRecord` per pass (``phase="graph"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..pipeline import PassRecord, PassRecorder, recording, run_phase
from . import decompose, fuse_epilogues, fuse_kernels, insert_collectives, simplify  # noqa: F401  (register the passes)
from .fusion import KernelGroup
from .nodes import FlatFunction
from .outline_kernels import read_kernels


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


def run_graph_passes(traced, name: str, config=None, dump_dir: Path | None = None) -> GraphIR:
    """Run the graph phase of ``config`` (the shared list when None) on ``traced``, an IRModule
    whose function ``name`` is the kernel; ``dump_dir`` receives the module after each pass."""
    graph = GraphIR(name, traced)
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        (dump_dir / "000_input.py").write_text(traced.script())
    with recording(PassRecorder(dump_dir)) as recorder:
        graph.module = run_phase(traced, config, "graph")
    graph.records = recorder.records
    if dump_dir is not None:
        (dump_dir / "timing.txt").write_text(recorder.timing_table())
    graph.simplified, graph.groups = read_kernels(graph.module, name)
    return graph


def graph_pass_names(config=None) -> list[str]:
    """The names in ``config``'s graph list (the shared list when None)."""
    from ..config import load_config
    from ..config_pipeline import graph_phase_default

    entries = graph_phase_default() if config is None else load_config(config).phase("graph")
    return [entry.name for entry in entries]


def graph_phase_key(config=None) -> tuple | None:
    """What decides the graph phase's result besides the traced module: the config's fingerprint
    and the current ``PassContext``'s settings. None when the PassContext has instruments, which
    must see every pass run (the caller does not reuse an earlier result then)."""
    from .._tvm import tvm
    from ..cache import pass_context_settings
    from ..config import load_config

    if list(tvm.transform.PassContext.current().instruments):
        return None
    settings = pass_context_settings()
    return (
        None if config is None else load_config(config).fingerprint(),
        tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(settings.items())),
    )
