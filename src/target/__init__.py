"""Tessera's codegens and toolchain drivers (nvcc, g++), one module per target."""
