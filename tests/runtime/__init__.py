"""Compiled kernels as runtime modules: tvm-ffi libraries loaded outside Tessera."""
