#!/usr/bin/env bash
# Run HERE (a machine with the package registries), before a session's first call to the lent GPU
# machine: fills .whl/ (ignored by git) with what that machine lacks for Tessera. It has Python 3.12,
# a CUDA build of torch, nvcc, numpy, ml-dtypes, PyYAML, pytest and hypothesis, but no registry.
# What travels to it is capped at 64 MiB, so libz3 (which TileLang's libraries link) goes as one
# stripped, xz-compressed library instead of its 29 MB wheel.   Then: bench/device_run.sh there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
WHL=.whl
mkdir -p "$WHL"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$WHL" tilelang==0.1.15 apache-tvm-ffi==0.1.12
# pytest-xdist (and its execnet), ~90 kB: the GPU tests compile with nvcc on that machine's 16 cores.
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    -d "$WHL" pytest-xdist==3.8.0 execnet==2.1.2
if [ ! -f "$WHL/libz3.so.4.15.xz" ]; then
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$tmp" z3-solver==4.15.4.0
    unzip -q -o "$tmp"/z3_solver-*.whl 'z3/lib/libz3.so*' -d "$tmp"
    lib=$(ls "$tmp"/z3/lib/libz3.so* | head -1)
    strip --strip-unneeded -o "$tmp/libz3.so.4.15" "$lib"
    xz -9 -T2 -c "$tmp/libz3.so.4.15" > "$WHL/libz3.so.4.15.xz"
    rm -rf "$tmp"
fi
du -ch "$WHL"/* | tail -1
echo "device_wheels.sh: $WHL is ready; call the device tool with carry=['.whl'] and 'bash bench/device_run.sh'"
