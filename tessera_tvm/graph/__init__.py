"""Graph IR for Tessera kernels: Relax construction, graph passes, fusion into tile kernel specs.

The ``tessera`` frontend builds its Graph IR through :class:`GraphBuilder` (it never imports TVM),
runs its passes through the driver (:func:`tessera_tvm.pipeline.run_graph_passes`: named, recorded
passes ending in one Relax function per fused kernel) and maps each fused kernel onto a tile spec
with :func:`kernel_spec`.
"""

from __future__ import annotations

from .builder import OPS, GraphBuilder, GraphBuildError, Value  # noqa: F401
from .fusion import KernelGroup  # noqa: F401
from .kernels import KernelBinding, kernel_spec  # noqa: F401
from .nodes import GraphIRError  # noqa: F401
from .passes import GraphIR, graph_pass_names  # noqa: F401
