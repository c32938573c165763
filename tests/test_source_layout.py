"""The source tree's shape (issue #40): no source file over 800 lines."""

from __future__ import annotations

from tests.conftest import REPO

#: The longest a source file of the package may grow; past it, split it by job (ARCHITECTURE.md).
MAX_LINES = 800


def test_no_source_file_is_over_800_lines():
    files = [p for root in ("python", "tessera_tvm", "src") for p in (REPO / root).rglob("*.py")]
    assert len(files) > 100
    long = {p.relative_to(REPO).as_posix(): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines (split each by job): {long}"
