"""What a Tenstorrent config says beyond the common sections: its ``tt:`` section (the arch, math
fidelity, DST accumulation), validated here, and the resources its arch row fills in
(``l1_bytes_per_core``, ``circular_buffers_per_core``, ``dst_tiles``), which a config may tighten.
"""

from __future__ import annotations

from typing import Any

from .arch import UnknownArchError, get_arch

#: Keys of the ``tt:`` section (Tenstorrent configs only; ``arch`` names a row of the arch table).
TT_KEYS = {
    "arch": "wormhole_b0 (n150) | blackhole (p150): the row of the arch table the resources come from",
    "math_fidelity": "LoFi | HiFi2 | HiFi3 | HiFi4",
    "fp32_dest_acc_en": "accumulate in fp32 in DST (halves its capacity): true | false | auto (per kernel: "
    "on where the tile program holds float32)",
    "math_approx_mode": "approximate SFPU math",
}
_TT_ARCH_RESOURCES = {"l1_bytes_per_core": "l1_budget_bytes", "circular_buffers_per_core": "num_cbs"}


def parse_section(data: dict[str, Any], target: dict[str, Any], resources_: dict[str, int], check: Any) -> dict:
    """Validate the ``tt:`` section and fill the Tenstorrent resources from the arch table."""
    kind = target["kind"]
    keys = target.get("keys", [])
    if not isinstance(keys, list) or "tenstorrent" not in keys:
        raise check.fail(
            "target.keys",
            f"codegen tt needs target {{kind: {kind}, keys: [tenstorrent]}} so passes "
            f"can tell Tenstorrent functions apart; found keys {keys!r}",
        )
    tt = dict(check.mapping(data.get("tt", {}), "tt", TT_KEYS))
    if "arch" not in tt:
        raise check.fail("tt.arch", "is missing; expected wormhole_b0 (n150) or blackhole (p150)")
    try:
        arch = get_arch(check.typed(tt["arch"], "tt.arch", str, "an arch name (str)"))
    except UnknownArchError as exc:
        raise check.fail("tt.arch", str(exc)) from None
    tt["arch"] = arch.name
    fidelity = tt.setdefault("math_fidelity", "HiFi4")
    if fidelity not in ("LoFi", "HiFi2", "HiFi3", "HiFi4"):
        raise check.fail("tt.math_fidelity", f"expected LoFi, HiFi2, HiFi3 or HiFi4, found {fidelity!r}")
    check.typed(tt.setdefault("math_approx_mode", False), "tt.math_approx_mode", bool, "true or false")
    if tt.setdefault("fp32_dest_acc_en", "auto") != "auto":
        check.typed(tt["fp32_dest_acc_en"], "tt.fp32_dest_acc_en", bool, "true, false or auto")
    from_arch = {key: getattr(arch, field) for key, field in _TT_ARCH_RESOURCES.items()}
    from_arch["dst_tiles"] = arch.dst_tiles(tt["fp32_dest_acc_en"] is True)  # auto: decided per kernel
    for key, limit in from_arch.items():
        value = resources_.setdefault(key, limit)
        if value > limit:  # a config may tighten the arch's budget, never widen it
            raise check.fail(f"resources.{key}", f"{value} is more than arch {arch.name!r} has ({limit})")
    return tt
