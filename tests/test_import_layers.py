"""Layered imports (issue #40, ARCHITECTURE.md "Layers"): import-linter checks the contracts in
pyproject.toml's ``[tool.importlinter]``, and fails with its report.

import-linter finds a package by its directory; in this checkout ``tessera_tvm.target``,
``tessera_tvm.transform`` and ``tessera_tvm.configs`` live outside ``tessera_tvm/`` (setuptools
``package-dir``), so the check runs on a view of the installed layout: a temporary directory of
symbolic links made from ``[tool.setuptools.package-dir]``. The linter runs in its own process, where
``tessera_tvm`` is the view's and not the one this process imported. About a second per run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: import-linter depends on tomli there
    import tomli as tomllib

from tests.conftest import REPO

PYPROJECT = REPO / "pyproject.toml"
_RUN = "import json, sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(**json.loads(sys.argv[1])))"


def installed_layout(root: Path) -> Path:
    """``root`` holding each package of ``[tool.setuptools.package-dir]`` where installing puts it,
    as links to this checkout's files (a linked package's own subpackages come with it)."""
    package_dir = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-dir"]
    for package, where in sorted(package_dir.items(), key=lambda item: item[0].count(".")):
        target = root.joinpath(*package.split("."))
        if "." not in package:  # a top-level package: its files, so subpackages can be linked in beside them
            target.mkdir(parents=True)
            for entry in (REPO / where).iterdir():
                if entry.name != "__pycache__" and not (target / entry.name).exists():
                    (target / entry.name).symlink_to(entry)
        else:
            target.symlink_to(REPO / where)
    return root


def lint_imports(layout: Path, *contracts: str) -> subprocess.CompletedProcess:
    """Run import-linter over ``layout`` (from its directory, so that it finds the view's packages)."""
    options = {"config_filenames": [str(PYPROJECT)], "limit_to_contracts": list(contracts), "no_cache": True}
    env = {**os.environ, "PYTHONPATH": str(layout)}
    return subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(options)],
        cwd=layout,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_layer_contracts_hold(tmp_path):
    result = lint_imports(installed_layout(tmp_path))
    report = result.stdout + result.stderr
    assert result.returncode == 0, f"lint-imports found imports across the layers:\n{report}"
    assert "Contracts: 3 kept, 0 broken." in report, report


def test_an_upward_import_inside_a_function_breaks_the_layers(tmp_path):
    """The contract can fail, and a lazy import counts: infra's errors.py importing the driver in a function."""
    layout = installed_layout(tmp_path)
    errors = layout / "tessera_tvm" / "errors.py"
    text = errors.read_text()
    errors.unlink()  # a link to this checkout's file: the edited copy replaces it in the view only
    errors.write_text(text + "\n\ndef _upward():\n    from .lower import lower\n\n    return lower\n")
    result = lint_imports(layout, "layers")
    report = result.stdout + result.stderr
    assert result.returncode != 0, report
    assert "tessera_tvm.errors is not allowed to import tessera_tvm.lower" in report, report
