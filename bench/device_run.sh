#!/usr/bin/env bash
# Run ON the lent GPU machine (device tool, carry ['.whl'], filled by bench/device_wheels.sh here):
#   bash bench/device_run.sh [tests|bench|models|diagnose|sweep|all|none]   (default all: tests, then bench;
#   models: the gpu-models section, whole models in bf16; diagnose: bench/gpu_diagnose.py; sweep:
#   bench/gpu_sweep.py; none: install only)
# Installs TileLang into /tmp/tessera-site and Tessera (editable) next to that machine's own torch, then runs the
# GPU and nvcc tests (pytest -m "gpu or nvcc") and the GPU benchmark. Logs, the JUnit report and the
# benchmark table go to $OUT (the device tool brings them back), else to bench/device-out/.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
what="${1:-all}"
out="${OUT:-bench/device-out}"
mkdir -p "$out"
site=/tmp/tessera-site
export PYTHONUNBUFFERED=1
if [ ! -f "$site/.installed" ]; then
    python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        .whl/*.whl || exit 1
    # TileLang's libraries find libz3 at ../../z3/lib (their RUNPATH). z3/ gets an __init__ that
    # raises ImportError: as a bare folder it imported as a namespace package, and torch.export,
    # which uses z3's Python API when `import z3` works, then failed ("module 'z3' has no attribute
    # 'ExprRef'", 2026-11-26). TileLang only logs that z3's Python API is missing.
    mkdir -p "$site/z3/lib" && xz -dc .whl/libz3.so.4.15.xz > "$site/z3/lib/libz3.so.4.15" || exit 1
    echo 'raise ImportError("only libz3 (for TileLang) is installed here, not z3-solver'"'"'s Python API")' \
        > "$site/z3/__init__.py"
    # Editable, as tessera.sh installs it: tessera_tvm.transform/.target/.configs map to src/ and configs/.
    python3 -m pip install --quiet --no-index --no-deps --no-build-isolation -e . || exit 1
    touch "$site/.installed"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export TESSERA_CACHE_DIR=/tmp/tessera-cache
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvcc --version | tail -2
  python3 -c "import torch, tilelang, tessera; print('torch', torch.__version__, torch.cuda.get_device_name(0)); print('tilelang', tilelang.__version__)"; } \
    2>&1 | tee "$out/machine.txt"
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
    # In 12 workers (TESSERA_TEST_WORKERS) where pytest-xdist came along: most of the time is nvcc,
    # one compile per core (16 cores there).
    workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${TESSERA_TEST_WORKERS:-12} --dist loadgroup" || true)
    # Device time is scarce (15 min a session): the whole test run and each test are capped. A run
    # cut at its cap prints no summary and writes no JUnit report, so each result and each failure's
    # traceback also go to $out/progress.txt as they happen (tests/conftest.py).
    export TESSERA_TEST_PROGRESS="${TESSERA_TEST_PROGRESS:-$out/progress.txt}"
    per_test=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout=${TESSERA_TEST_TIMEOUT:-150}" || true)
    timeout -k 10 "${TESSERA_TESTS_LIMIT:-240}" python3 -m pytest -q -rfE --tb=short -m "gpu or nvcc" $workers $per_test \
        -p no:cacheprovider -p no:benchmark --junitxml="$out/gpu-tests.xml" tests 2>&1 \
        | tee "$out/gpu-tests.log"
    rc=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    timeout -k 10 "${TESSERA_BENCH_LIMIT:-240}" python3 bench/bench.py --only gpu --out "$out/RESULTS-gpu.md" 2>&1 \
        | tee "$out/bench-gpu.log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
if [ "$what" = models ]; then
    # Issue #39 item 9: whole models in bf16 on the GPU against torch eager and torch.compile (a run of
    # its own: building each model and torch.compile's first calls take minutes).
    timeout -k 10 "${TESSERA_BENCH_LIMIT:-400}" python3 bench/bench.py --quick --only gpu-models \
        --out "$out/RESULTS-gpu-models.md" 2>&1 | tee "$out/bench-gpu-models.log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
if [ "$what" = diagnose ]; then
    # Where a model built for Hopper first differs from its CPU build, call by call (bench/gpu_diagnose.py)
    for model in ${TESSERA_DIAGNOSE_MODELS:-hf-llama}; do
        timeout -k 10 "${TESSERA_BENCH_LIMIT:-240}" python3 bench/gpu_diagnose.py --model "$model" 2>&1 \
            | grep -v "Warning\|cls.__new__" | tee "$out/diagnose-$model.log"
        [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    done
fi
if [ "$what" = sweep ]; then
    timeout -k 10 "${TESSERA_BENCH_LIMIT:-240}" python3 bench/gpu_sweep.py --out "$out/sweep.txt" 2>&1 | tee "$out/sweep.log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
exit "$rc"
