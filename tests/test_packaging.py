"""A normal (non-editable) install carries every package, config and data file the code uses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # Built from a copy of the source tree: setuptools writes build/ and tessera.egg-info where it
    # builds, and another test may be installing the tree at the same time (the apache-tvm venv's
    # `pip install -e .`), which made this build fail now and then.
    source = tmp_path_factory.mktemp("source") / "tessera"
    skip = shutil.ignore_patterns(".venv*", ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", "out")
    shutil.copytree(REPO, source, ignore=skip, symlinks=True)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(source),
        ],
        timeout=300,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("tessera-*.whl")
    return path


def _python_packages(root) -> set[str]:
    return {str(p.parent.relative_to(root)).replace(os.sep, ".") for p in root.rglob("__init__.py")}


def test_wheel_holds_every_source_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packaged = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("__init__.py")}
    expected = {"tessera." + p if p != "." else "tessera" for p in _python_packages(REPO / "python/tessera")}
    expected |= {"tessera_tvm." + p if p != "." else "tessera_tvm" for p in _python_packages(REPO / "tessera_tvm")}
    expected |= {
        "tessera_tvm.transform." + p if p != "." else "tessera_tvm.transform"
        for p in _python_packages(REPO / "src/transform")
    }
    expected |= {
        "tessera_tvm.target." + p if p != "." else "tessera_tvm.target" for p in _python_packages(REPO / "src/target")
    }
    expected = {e.replace("..", ".").rstrip(".") for e in expected}
    missing = expected - packaged
    assert not missing, f"packages missing from the wheel (add them to pyproject.toml): {sorted(missing)}"
    assert "tessera_tvm/configs/hopper.yaml" in names
    assert "tessera_tvm/configs/shared/lower_and_legalize.yaml" in names
    assert "tessera_tvm/configs/shared/graph.yaml" in names
    for header in ("cpu.h", "cpu_parallel.h", "cpu_gemm.h", "cpu_math.h"):  # included by every generated CPU kernel
        assert f"tessera_tvm/target/include/tessera/{header}" in names
    # The tsr* C runtime: its header and the source `tessera runtime` builds.
    assert "tessera_tvm/target/include/tessera/tsr.h" in names and "tessera_tvm/target/tsr/tsr.cc" in names
    assert "tessera_tvm/target/include/tessera/cuda_driver.h" in names  # CUDA libraries and tsr include it
    # Tenstorrent: the one copy of the tt-metal API headers (the syntax check's and the emulator's), its runner
    for header in ("dataflow_api.h", "compute_kernel_api/matmul.h", "tt-metalium/host_api.hpp", "tt_emu/runtime_api.h"):
        assert f"tessera_tvm/target/tt/include/{header}" in names
    assert "tessera_tvm/target/tt/emulator/src/runtime.cpp" in names


def test_installed_wheel_loads_configs_and_pass_lists(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    code = (
        "import tessera_tvm, sys; assert tessera_tvm.__file__.startswith(sys.argv[1]), tessera_tvm.__file__; "
        "print(len(tessera_tvm.pass_names('hopper')), tessera_tvm.available_configs())"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(target)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'hopper'" in out.stdout and "'cpu'" in out.stdout
