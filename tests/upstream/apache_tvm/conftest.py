"""These tests run in a venv holding upstream apache-tvm (``./tessera.sh apache-tvm``), never in the
main one: there, ``tessera_tvm`` is the upstream API over Tessera's toolchain process."""

import importlib.util

if importlib.util.find_spec("tilelang") is not None:  # the main venv: nothing here to run
    collect_ignore_glob = ["test_*.py"]
