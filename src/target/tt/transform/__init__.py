"""Tenstorrent passes (``tt.*``): from a TileLang tile program to annotated, verified TT IR.

Importing this package registers the passes; ``configs/tenstorrent.yaml`` names them in order:

    tt.ApplyTTDefaults   arch row, compute config and defaults onto every function
    (shared LowerAndLegalize passes that keep tile operations recognisable)
    tt.InferSchedule     output tiles per core (contiguous, row-major)
    tt.InferShard        DRAM buffers: interleaved, 32x32 tile pages
    tt.GridToPersistent  the block grid -> one persistent loop per core
    tt.ShardToCoreMap    schedule entries -> worker core coordinates
    tt.LowerMemorySpace  DRAM <-> core tiles -> L1 circular buffers
    tt.TilePad           buffers padded to whole tiles, edge masks dropped
    tt.Tensorize         tile operations recognised and annotated for the code generator
    tt.VerifyTTIR        every invariant checked; violations fail the compile

``common`` holds the attribute names the passes and ``tessera_tvm.target.tt.codegen`` share.
"""

from . import (  # noqa: F401
    apply_tt_defaults,
    grid_to_persistent,
    infer_schedule,
    infer_shard,
    lower_memory_space,
    shard_to_core_map,
    tensorize,
    tile_pad,
    verify_tt_ir,
)
