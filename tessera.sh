#!/usr/bin/env bash
# The two commands a fresh machine needs. Each sets everything up (a virtual environment in .venv
# with Tessera, TileLang 0.1.15 and the CPU build of torch 2.13.0), then:
#   ./tessera.sh demo [--out DIR]   lowers the example GEMM for every target and shows the stages
#   ./tessera.sh test [PYTEST ARGS] runs the test suite (GPU tests skip without a GPU)
#   ./tessera.sh setup              only sets up (the toolchain venv an apache-tvm process uses)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

VENV="${TESSERA_VENV:-.venv}"
PY="$VENV/bin/python"

setup() {
    if [ ! -x "$PY" ]; then
        echo "tessera.sh: creating $VENV" >&2
        python3 -m venv "$VENV"
    fi
    local stamp="$VENV/.tessera-installed"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        echo "tessera.sh: installing Tessera and its pinned dependencies into $VENV" >&2
        # torch first and pinned: 2.13.0 resolves to the small CPU build that tilelang needs at import.
        "$PY" -m pip install --quiet "torch==2.13.0"
        "$PY" -m pip install --quiet -e ".[test]"
        touch "$stamp"
    fi
}

case "${1:-}" in
    demo)
        shift
        setup
        exec "$PY" examples/main_job.py "$@"
        ;;
    test)
        shift
        setup
        exec "$PY" -m pytest "$@"
        ;;
    setup)
        setup
        echo "tessera.sh: $VENV is ready (TESSERA_TOOLCHAIN_PYTHON=$(cd "$VENV" && pwd)/bin/python)" >&2
        ;;
    *)
        echo "usage: ./tessera.sh demo [--out DIR] | ./tessera.sh test [pytest args] | ./tessera.sh setup" >&2
        exit 2
        ;;
esac
