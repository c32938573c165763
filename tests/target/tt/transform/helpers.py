"""Shared pieces of the ``tt.*`` pass tests: running one pass, and the attrs earlier passes leave."""

from __future__ import annotations

import copy

from tessera_tvm._tvm import tvm
from tessera_tvm.config import TargetConfig, load_config, parse_config
from tessera_tvm.registry import BuildContext, get_pass, take_pending_error

#: ``tt.arch`` as tt.ApplyTTDefaults writes it for the shipped config (Wormhole n150).
WORMHOLE = {
    "name": "wormhole_b0",
    "board": "n150",
    "grid": [8, 8],
    "l1_bytes": 1499136,
    "num_cbs": 32,
    "dst_tiles": 16,
    "dram_banks": 12,
    "tile_shape": [32, 32],
}
DEFAULTS = {"schedule_policy": "contiguous", "schedule_order": "row_major", "memory": "dram_interleaved"}
COMPUTE_CONFIG = {"math_fidelity": "HiFi4", "fp32_dest_acc_en": False, "math_approx_mode": False}


def tt_config(**changes) -> TargetConfig:
    """The shipped tenstorrent config with top-level sections replaced or merged (dicts merge)."""
    base = load_config("tenstorrent")
    data = copy.deepcopy(dict(base.raw))
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_config(data, f"{base.source} (test)")


def run_pass(name: str, mod, config: TargetConfig | None = None, **args):
    """Apply the registered pass ``name`` (with ``args``) to ``mod`` (a PrimFunc or IRModule)."""
    config = config or load_config("tenstorrent")
    if isinstance(mod, tvm.tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    try:
        return get_pass(name).factory(BuildContext(config, config.tvm_target()), **args)(mod)
    except Exception:
        error = take_pending_error()  # the TesseraError the pass raised, before TVM's FFI wrapped it
        if error is not None:
            raise error from None
        raise


def _anonymous(func):
    """``func`` without ``global_symbol`` (TVMScript adds one only to functions without func_attr)."""
    return func.without_attr("global_symbol") if func.attrs and "global_symbol" in func.attrs else func


def assert_pass(name: str, before, expected, config: TargetConfig | None = None, **args) -> None:
    """``name`` applied to ``before`` is ``expected`` (TVMScript Before/Expected, structurally)."""
    after = run_pass(name, _anonymous(before), config, **args)
    tvm.ir.assert_structural_equal(after["main"], _anonymous(expected))
