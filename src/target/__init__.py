"""Tessera's backends, one vertical slice per codegen kind: ``cuda/``, ``hip/``, ``cpu/`` (kind ``c``)
and ``tt/``, each registering its manifest in ``<kind>/backend.py`` (:mod:`.backend` is the registry),
plus what they share: the source generator call (:mod:`.codegen`) and the toolchain helpers
(:mod:`.toolchain`)."""
