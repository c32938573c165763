"""Target configs (one YAML per target) shipped as package data; see tessera_tvm.config."""
