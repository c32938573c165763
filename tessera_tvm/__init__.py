"""tessera_tvm: Tessera's TVM extension.

Target configs, the named pass registry, the LowerAndLegalize / OptimizeForTarget pipelines and
the codegens, for TileLang tile programs. ``import tessera_tvm`` makes TileLang's TVM the ``tvm``
of the process (and refuses, with a fix, when another TVM was imported first).
"""

from __future__ import annotations

from ._tvm import tilelang, tvm  # noqa: F401  (first: installs TileLang's TVM)
from .config import TargetConfig, available_configs, load_config  # noqa: F401
from .errors import (  # noqa: F401
    ConfigError,
    LoweringError,
    PassNotFoundError,
    ResourceError,
    TesseraError,
    ToolchainError,
    ToolchainMissingError,
)
from .lower import LoweredModule, lower  # noqa: F401
from .pipeline import CodegenPrep, LowerAndLegalize, OptimizeForTarget, format_pass_list, pass_names  # noqa: F401
from .registry import BuildContext, Param, get_pass, list_passes, register_pass  # noqa: F401
from .relax import partition_for_tessera  # noqa: F401  (registers the tessera.<config> TIR pipelines)
