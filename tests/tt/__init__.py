"""Tests of the Tenstorrent target groundwork: arch table, API headers, emulator."""
