"""Tests of the Tenstorrent slice, ``src/target/tt``, in its shape: the arch table, the API headers, the
emulator, the code generator, the config, ``ts.compile`` for Tenstorrent (``test_compile*.py``) and the
passes (``transform/``); the reference kernels and plans are in ``kernels/`` and ``plans/``."""
