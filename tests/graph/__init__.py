"""Tests of the graph phase's Relax passes (tessera_tvm/graph), one file per pass."""

import tessera_tvm  # noqa: F401  (makes TileLang's TVM the `tvm` the test modules import)
