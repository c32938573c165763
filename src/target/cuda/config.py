"""What a CUDA config's ``target:`` must say: an ``sm_`` arch (``sm_90a`` for Hopper's wgmma and TMA)."""

from __future__ import annotations

from typing import Any


def check_target(target: dict[str, Any], check: Any) -> None:
    """Raise the config's ``ConfigError`` unless ``target.arch`` is a CUDA arch string."""
    arch = check.typed(target.get("arch"), "target.arch", str, "a CUDA arch string such as 'sm_90a'")
    if not arch.startswith("sm_"):
        raise check.fail("target.arch", f"expected a CUDA arch like 'sm_90a' or 'sm_80', found {arch!r}")
