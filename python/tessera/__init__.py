"""Tessera: a tile-centric kernel language lowered through TVM/TileLang."""

__version__ = "0.1.0"
