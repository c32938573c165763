"""Tessera's version, one number for the frontend (``tessera.__version__``) and the TVM extension
(the kernel cache keys on it), kept here so that neither reads it from the other."""

__version__ = "0.1.0"
