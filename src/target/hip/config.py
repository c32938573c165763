"""What a HIP config's ``target:`` must say: the AMD GPU (``mcpu: gfx942``)."""

from __future__ import annotations

from typing import Any


def check_target(target: dict[str, Any], check: Any) -> None:
    """Raise the config's ``ConfigError`` unless ``target.mcpu`` names an AMD GPU."""
    check.typed(target.get("mcpu"), "target.mcpu", str, "an AMD GPU name such as 'gfx942'")
