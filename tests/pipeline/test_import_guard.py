"""import tessera_tvm refuses a foreign TVM that was imported first, and says how to fix it."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_foreign_tvm_first_is_a_clear_import_error(tmp_path):
    fake = tmp_path / "tvm"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '0.27.0'\n")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import tvm
        try:
            import tessera_tvm
        except ImportError as exc:
            print("IMPORT-ERROR:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120).stdout
    assert "IMPORT-ERROR:" in out
    assert "another TVM was imported first" in out and "import tessera_tvm" in out


def test_tessera_tvm_gives_tilelangs_tvm():
    import tessera_tvm

    assert "tilelang" in tessera_tvm.tvm.__file__
