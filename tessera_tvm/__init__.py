"""tessera_tvm: Tessera's TVM extension.

Target configs, the named pass registry, the LowerAndLegalize / OptimizeForTarget pipelines and
the codegens, for TileLang tile programs. ``import tessera_tvm`` makes TileLang's TVM the ``tvm``
of the process (and refuses, with a fix, when another TVM was imported first).

In an environment with upstream apache-tvm and no tilelang, ``import tessera_tvm`` gives
``partition_for_tessera`` over Tessera's toolchain process instead (tessera_tvm/upstream).
"""

from __future__ import annotations

import importlib.util as _util


def _upstream_mode() -> bool:
    """A process with upstream apache-tvm and no tilelang: Tessera offloads through its toolchain
    process (tessera_tvm.upstream) instead of running TileLang's TVM here."""
    return _util.find_spec("tilelang") is None and _util.find_spec("tvm") is not None


if _upstream_mode():
    from .errors import ConfigError, TesseraError, ToolchainProcessError  # noqa: F401
    from .upstream import OffloadReport, export_library, export_options, partition_for_tessera  # noqa: F401
    from .upstream import patch_torch_frontend as _patch_torch_frontend

    _patch_torch_frontend()
    UPSTREAM = True
else:
    UPSTREAM = False
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
    from .relax import export_library, export_options, partition_for_tessera  # noqa: F401  (as upstream's names)
