# ruff: noqa: F821  (dim names in Tensor[...] are not Python names)
"""Observability never breaks the program it watches (issue #37, item 6): TESSERA_METRICS and
TESSERA_TRACE naming unusable paths warn and switch off, a full disk stops the rows with a warning,
the writers never replace or append to anything but a regular file, and ts.metrics/ts.trace raise
an OutputFileError naming the file."""

import errno
import os

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops
from tessera_tvm import metrics, trace
from tessera_tvm.errors import OutputFileError, TesseraError, TesseraWarning


@ts.kernel
def relu(x: Tensor["N", ts.f32]) -> Tensor["N", ts.f32]:
    return ops.relu(x)


@pytest.fixture
def not_a_directory(tmp_path):
    """A path whose parent is a regular file: nothing can be written there, even as root."""
    (tmp_path / "file").write_text("")
    return tmp_path / "file"


@pytest.mark.parametrize("name", ["calls.jsonl", "calls.txt"])
def test_a_bad_tessera_metrics_warns_and_leaves_metrics_off(not_a_directory, monkeypatch, name):
    monkeypatch.setenv("TESSERA_METRICS", str(not_a_directory / name))
    monkeypatch.setattr(metrics, "_ACTIVE", None)
    with pytest.warns(TesseraWarning, match="TESSERA_METRICS=.*metrics are off"):
        metrics._from_environment()  # what `import tessera` runs
    assert metrics.active() is None


def test_a_bad_tessera_trace_warns_and_leaves_tracing_off(not_a_directory, tmp_path, monkeypatch):
    monkeypatch.setattr(trace, "_ACTIVE", None)
    monkeypatch.setenv("TESSERA_TRACE", str(not_a_directory / "trace.json"))
    with pytest.warns(TesseraWarning, match="tracing is off"):
        trace._from_environment()
    assert trace.active() is None
    target = tmp_path / "target.json"
    target.write_text("keep")
    (tmp_path / "link.json").symlink_to(target)
    monkeypatch.setenv("TESSERA_TRACE", str(tmp_path / "link.json"))
    with pytest.warns(TesseraWarning, match="symbolic link"):
        trace._from_environment()
    assert trace.active() is None and (tmp_path / "link.json").is_symlink()


def test_a_full_disk_stops_the_rows_with_one_warning_and_the_calls_go_on(tmp_path, monkeypatch):
    k = ts.compile(relu, target="cpu", shapes={"N": 64})
    x = np.arange(64, dtype=np.float32) - 32

    class FullDisk:
        def write(self, line):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with ts.metrics(tmp_path / "calls.jsonl") as recorder:
        monkeypatch.setattr(recorder, "_file", FullDisk())
        with pytest.warns(TesseraWarning, match=r"calls\.jsonl: cannot write a row .*No space left") as seen:
            for _ in range(3):
                np.testing.assert_array_equal(k(x), np.maximum(x, 0))
    assert len([w for w in seen if issubclass(w.category, TesseraWarning)]) == 1


def test_writers_refuse_links_and_fifos_and_name_the_file(tmp_path, not_a_directory):
    target = tmp_path / "target.json"
    target.write_text("keep")
    link = tmp_path / "trace.json"
    link.symlink_to(target)
    with pytest.raises(OutputFileError, match=r"trace\.json: found a symbolic link"):
        with ts.trace(link):
            pass
    assert link.is_symlink() and target.read_text() == "keep"
    fifo = tmp_path / "calls.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(OutputFileError, match=r"calls\.jsonl: found a FIFO"):  # not blocked on it either
        with ts.metrics(fifo):
            pass
    os.mkfifo(tmp_path / "process.json")  # what TESSERA_TRACE's writer meets at exit
    with pytest.raises(OutputFileError, match=r"process\.json: found a FIFO"):
        trace.Trace(tmp_path / "process.json").write()
    for api in (ts.metrics, ts.trace):
        path = not_a_directory / ("calls.jsonl" if api is ts.metrics else "trace.json")
        with pytest.raises(OutputFileError) as raised:
            with api(path):
                pass
        assert str(path) in str(raised.value) and isinstance(raised.value, TesseraError)
