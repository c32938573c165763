"""Tessera's own TIR passes, registered by name in the tessera_tvm pass registry.

Importing this package registers every pass below; pipelines then name them in configs.
"""

from . import (
    annotate_kernel_metadata,  # noqa: F401
    exact_float_constants,  # noqa: F401
    guard_decoupled_casts,  # noqa: F401
    import_cpu_runtime,  # noqa: F401
    lower_parallel_grid,  # noqa: F401
    mark_parallel_grid,  # noqa: F401
    pad_partial_fragment_loops,  # noqa: F401
    record_tile_info,  # noqa: F401
    scalar_atomics_per_thread,  # noqa: F401
    serialize_self_updating_ifs,  # noqa: F401
    share_warp_specialized_state,  # noqa: F401
    unique_shared_buffer_names,  # noqa: F401
    verify_barrier_support,  # noqa: F401
    verify_resources,  # noqa: F401
    wrap_narrow_integers,  # noqa: F401
)
