"""Robustness tests: property-based fuzzing against numpy, bad input, toolchain failures, determinism."""
