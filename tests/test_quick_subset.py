"""``./tessera.sh test --quick`` selects the files of tests/conftest.py's QUICK_FILES, and they touch every folder."""

from __future__ import annotations

import subprocess

from tests.conftest import QUICK_FILES, REPO


def test_every_quick_file_exists_and_every_test_folder_has_one():
    assert all((REPO / name).is_file() for name in QUICK_FILES), [n for n in QUICK_FILES if not (REPO / n).is_file()]
    folders = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("test_*.py")}
    folders -= {"tests/upstream/apache_tvm"}  # runs in the apache-tvm venv (tests/upstream/test_apache_tvm_venv.py)
    covered = {name.rsplit("/", 1)[0] for name in QUICK_FILES}
    assert folders <= covered, f"folders with no quick file: {sorted(folders - covered)}"


def test_tessera_sh_quick_selects_exactly_those_files():
    folders = ["tests/config", "tests/graph", "tests/target/tt"]  # a few folders: collecting them all takes ~15 s
    done = subprocess.run(
        [
            "bash",
            "tessera.sh",
            "test",
            "--quick",
            "--collect-only",
            "-q",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            *folders,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = {line.split(":")[0] for line in done.stdout.splitlines() if line.startswith("tests/")}
    assert collected == {name for name in QUICK_FILES if name.startswith(tuple(folders))}, done.stdout


def test_an_xdist_group_runs_on_one_worker(tmp_path):
    # ./tessera.sh test runs --dist loadgroup so that tests sharing an expensive result (a corpus pair's
    # lowering, a gloo process group, a Ray cluster) run in one worker. With pytest 9.2, pytest-xdist
    # 3.8's grouping was silently a no-op (it renames item._nodeid, which pytest 9.2 no longer reads).
    import sys

    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\n"
        "@pytest.mark.xdist_group('one')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_grouped(i):\n"
        "    with open('workers.txt', 'a') as f:\n"
        "        f.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_free(i):\n"
        "    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    workers = (tmp_path / "workers.txt").read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers
