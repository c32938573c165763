"""Tests of the Tenstorrent target groundwork: arch table, stub headers, emulator."""
