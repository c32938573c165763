"""Tests of Tessera's own passes (src/transform), one file per pass."""

import tessera_tvm  # noqa: F401  (makes TileLang's TVM the `tvm` the test modules import)
