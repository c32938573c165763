"""The client side of the toolchain process (tessera_tvm/upstream/toolchain.py, standard library
only, so it runs here too): finding or making the toolchain's Python, and a toolchain that is
missing, crashes, hangs or speaks another protocol, each a clear ToolchainProcessError."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tessera_tvm.errors import ToolchainProcessError
from tessera_tvm.upstream import toolchain as client


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_a_named_toolchain_python_is_used_or_its_absence_explained(tmp_path, monkeypatch):
    python = _script(tmp_path / "bin" / "python", "exit 0")
    monkeypatch.setenv("TESSERA_TOOLCHAIN_PYTHON", str(python))
    assert client.toolchain_python() == python
    monkeypatch.setenv("TESSERA_TOOLCHAIN_PYTHON", str(tmp_path / "missing"))
    with pytest.raises(ToolchainProcessError, match="TESSERA_TOOLCHAIN_PYTHON=.*missing is not an executable"):
        client.toolchain_python()


def test_without_one_the_first_use_makes_it_with_the_checkouts_setup(tmp_path, monkeypatch, capsys):
    checkout = tmp_path / "checkout"  # no .venv in it; its tessera.sh makes $TESSERA_VENV/bin/python
    _script(checkout / "tessera.sh", 'mkdir -p "$TESSERA_VENV/bin" && printf "#!/bin/sh\\n" > "$TESSERA_VENV/bin/python"'
            ' && chmod +x "$TESSERA_VENV/bin/python" && echo "installing..."')  # fmt: skip
    monkeypatch.delenv("TESSERA_TOOLCHAIN_PYTHON", raising=False)
    monkeypatch.setenv("TESSERA_TOOLCHAIN_DIR", str(tmp_path / "cache" / "toolchain"))
    monkeypatch.setattr(client, "_SOURCE_ROOT", checkout)
    made = client.toolchain_python()
    assert made == tmp_path / "cache" / "toolchain" / "bin" / "python" and made.is_file()
    assert "making the toolchain venv" in capsys.readouterr().err
    assert client.toolchain_python() == made  # found the second time, not made again
    made.unlink()
    _script(checkout / "tessera.sh", "echo 'pip: no network' >&2; exit 7")
    with pytest.raises(ToolchainProcessError, match="exited 7"):
        client.toolchain_python()


@pytest.mark.parametrize(
    ("body", "timeout", "message"),
    [
        ("exit 3", 30, r"exited \(status 3\) before answering"),
        ("echo 'Traceback: boom' >&2; exit 1", 30, "Traceback: boom"),  # its stderr is in the message
        ("sleep 30", 1, "did not answer within 1 s"),
        ('read line; echo \'{"ok": true, "protocol": 99}\'; cat > /dev/null', 30, "speaks protocol 99"),
    ],
    ids=["crashes", "crashes with output", "hangs", "another protocol"],
)
def test_a_toolchain_that_fails_is_a_clear_error(tmp_path, body, timeout, message):
    python = _script(tmp_path / "python", body)
    with pytest.raises(ToolchainProcessError, match=message):
        client.Toolchain(python, timeout=timeout)


def test_the_real_toolchain_answers_and_reports_errors_as_answers():
    import sys

    toolchain = client.Toolchain(Path(sys.executable))  # this venv is a toolchain venv
    try:
        assert toolchain.info["protocol"] == client.PROTOCOL
        with pytest.raises(ToolchainProcessError, match="unknown request"):
            toolchain.request({"op": "no such op"})
        assert toolchain.request({"op": "hello"})["protocol"] == client.PROTOCOL  # still serving
    finally:
        toolchain.close()
    assert toolchain.proc.poll() is not None  # closing its input ends it
