"""Reports how many fuzz cases each property test tried (the figure docs/testing.md quotes)."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter):
    from .fuzz import TRIED

    if TRIED:
        terminalreporter.write_sep("-", f"fuzz cases tried: {sum(TRIED.values())}")
        for name, n in sorted(TRIED.items()):
            terminalreporter.write_line(f"  {name}: {n}")
