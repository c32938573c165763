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
import shutil
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
    assert "Contracts: 6 kept, 0 broken." in report, report


def with_function_import(layout: Path, module: str, imported: str) -> None:
    """``module``'s file in the view gains a function importing ``imported`` (the checkout is untouched)."""
    path = layout.joinpath(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        path = path.with_suffix("") / "__init__.py"
    for linked in [p for p in (path, *path.parents) if p.is_symlink()][::-1]:  # outermost first
        real = linked.resolve()
        linked.unlink()  # a link to this checkout: a copy replaces it in the view only
        if real.is_dir():
            shutil.copytree(real, linked)
        else:
            shutil.copyfile(real, linked)
    name, _, attribute = imported.rpartition(".")
    path.write_text(
        path.read_text() + f"\n\ndef _upward():\n    from {name} import {attribute}\n\n    return {attribute}\n"
    )


def test_an_upward_import_inside_a_function_breaks_the_layers(tmp_path):
    """The contract can fail, and a lazy import counts: infra's errors.py importing the driver in a function."""
    layout = installed_layout(tmp_path)
    with_function_import(layout, "tessera_tvm.errors", "tessera_tvm.lower.lower")
    result = lint_imports(layout, "layers")
    report = result.stdout + result.stderr
    assert result.returncode != 0, report
    assert "tessera_tvm.errors is not allowed to import tessera_tvm.lower" in report, report


def test_tenstorrents_passes_are_above_the_rest_of_its_slice(tmp_path):
    """Tenstorrent's passes live in its slice (src/target/tt/transform) but in the passes layer: its code
    generator, in the backends layer, may not import them."""
    layout = installed_layout(tmp_path)
    with_function_import(layout, "tessera_tvm.target.tt.codegen", "tessera_tvm.target.tt.transform.common")
    result = lint_imports(layout, "layers", "tenstorrent")
    report = result.stdout + result.stderr
    assert result.returncode != 0, report
    assert "Contracts: 0 kept, 2 broken." in report, report
    words = " ".join(report.split())  # the report wraps at 80 columns
    assert "tessera_tvm.target.tt.codegen is not allowed to import tessera_tvm.target.tt.transform" in words, report
