"""Tessera's own TIR passes, registered by name in the tessera_tvm pass registry.

Importing this package registers every pass below; pipelines then name them in configs.
"""

from . import verify_barrier_support  # noqa: F401
