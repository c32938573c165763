"""The HIP backend (codegen kind ``hip``): TileLang's HIP source for AMD GPUs; no toolchain runs here."""
