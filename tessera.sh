#!/usr/bin/env bash
# The two commands a fresh machine needs. Each sets everything up (a virtual environment in .venv
# with Tessera, TileLang 0.1.15 and the CPU build of torch 2.13.0), then:
#   ./tessera.sh demo [--out DIR]   lowers the example GEMM for every target and shows the stages
#   ./tessera.sh test [PYTEST ARGS] runs the test suite (GPU tests skip without a GPU); --quick runs
#                                   the edit-test subset (about 3 minutes)
#   ./tessera.sh setup              only sets up (the toolchain venv an apache-tvm process uses)
#   ./tessera.sh apache-tvm [ARGS]  runs tests/upstream/apache_tvm in a second venv, .venv-apache-tvm,
#                                   holding upstream apache-tvm 0.27 (Tessera offloads through .venv)
#   ./tessera.sh apache-tvm-run SCRIPT [ARGS]   runs a Python script in that venv
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

VENV="${TESSERA_VENV:-.venv}"
PY="$VENV/bin/python"

# ensure_venv DIR WHAT INSTALL: make the venv DIR if it is missing, then run INSTALL DIR once, and
# again whenever its requirements change: the stamp holds a digest of pyproject.toml and of INSTALL's
# own text (the pins it passes to pip), so an unchanged venv is reused between runs.
ensure_venv() {
    local dir="$1" what="$2" install="$3"
    if [ ! -x "$dir/bin/python" ]; then
        echo "tessera.sh: creating $dir" >&2
        python3 -m venv "$dir"
    fi
    local stamp="$dir/.tessera-installed" want
    want="$( (cat pyproject.toml; declare -f "$install") | sha256sum | cut -d' ' -f1)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        echo "tessera.sh: installing $what into $dir" >&2
        "$install" "$dir/bin/python"
        echo "$want" >"$stamp"
    fi
}

# byte_compile PYTHON: compile the venv's installed modules on every core. pip does it on one (40 of a
# 70 s set-up on 2 cores), so it installs with --no-compile and this follows. The .pyc files must be
# there: where PYTHONDONTWRITEBYTECODE=1 (CI's environment has it) Python never writes them, and every
# process would compile torch's modules again (the suite took 2.5 minutes longer). Left out, as nothing
# here imports them: transformers' models other than those the tests and bench build (2600 of its
# 2900 files), Ray's libraries above its core (serve, tune, train, data, ...), pip and setuptools:
# 29 -> 20 s on 2 cores. A module left out still imports (compiled in memory, as without the step).
BYTE_COMPILE_SKIP='/transformers/models/(?!(auto|gpt2|llama|bert|qwen2)/)|/ray/(serve|tune|train|data|air|llm|rllib|workflow)/|/site-packages/(pip|setuptools)/'
byte_compile() {
    "$1" -m compileall -q -j 0 -x "$BYTE_COMPILE_SKIP" \
        "$("$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
}

install_tessera() {
    # torch first and pinned: 2.13.0 resolves to the small CPU build that tilelang needs at import.
    "$1" -m pip install --quiet --no-compile "torch==2.13.0"
    "$1" -m pip install --quiet --no-compile -e ".[test]"
    byte_compile "$1"
}

# A user's own TVM environment: upstream apache-tvm, torch (CPU), and Tessera without its
# dependencies (tilelang cannot share a venv with apache-tvm; DESIGN.md §3.1).
# torch is the main venv's own install (the same pinned 2.13.0 CPU build, set up first), linked in
# rather than unpacked a second time (750 MB, ~20 s); its small dependencies are installed here.
install_apache_tvm() {
    local deps main_site site
    deps="$("$PY" -c 'from importlib.metadata import requires; print(" ".join(r.split(";")[0].replace(" ", "") for r in requires("torch") if "extra ==" not in r))')"
    # shellcheck disable=SC2086
    "$1" -m pip install --quiet --no-compile "apache-tvm==0.27.*" "numpy>=1.26,<3" "pytest>=8,<10" $deps
    main_site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    site="$("$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    for pkg in torch torchgen functorch "torch-2.13.0+cpu.dist-info"; do
        rm -rf "${site:?}/$pkg"
        ln -s "$main_site/$pkg" "$site/$pkg"
    done
    "$1" -c 'import torch; assert torch.__version__ == "2.13.0+cpu", torch.__version__'
    "$1" -m pip install --quiet --no-compile --no-deps PyYAML -e .
    byte_compile "$1"
}

setup() {
    ensure_venv "$VENV" "Tessera and its pinned dependencies" install_tessera
}

setup_apache_tvm() {
    ensure_venv .venv-apache-tvm "apache-tvm 0.27, torch 2.13.0 (CPU) and Tessera (--no-deps)" install_apache_tvm
}

# apache_tvm_python ARGS: both venvs set up, then the apache-tvm venv's python, with the main venv as
# Tessera's toolchain. TileLang's variables (set when this runs under the main venv's pytest) would
# make apache-tvm load TileLang's TVM, so they are removed.
apache_tvm_python() {
    setup
    setup_apache_tvm
    TESSERA_TOOLCHAIN_PYTHON="$(cd "$VENV" && pwd)/bin/python" exec env -u PYTHONPATH -u TVM_LIBRARY_PATH \
        -u TL_CUTLASS_PATH -u TL_TEMPLATE_PATH .venv-apache-tvm/bin/python "$@"
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
        # --quick: the edit-test subset (tests/conftest.py QUICK_FILES, about 3 minutes on 2 cores).
        args=()
        for arg in "$@"; do
            if [ "$arg" = "--quick" ]; then args+=(-m quick); else args+=("$arg"); fi
        done
        # One worker per core and one more, at most 8 (each holds TVM and torch, ~1 GB); `-n 0` runs in
        # this process. The extra worker uses the time the others wait on a child (ranks, Ray, a
        # toolchain, a venv): on 2 cores 3 workers took 827 s of pytest where 2 took 861 s (fresh
        # clones, session 37; session 36: 816 s against 836 s). loadgroup: tests marked with one
        # xdist_group share a worker (the corpus lowers a pair once).
        workers=$(( $(nproc 2>/dev/null || echo 1) + 1 ))
        [ "$workers" -le 8 ] || workers=8
        exec "$PY" -m pytest -n "$workers" --dist loadgroup "${args[@]}"
        ;;
    apache-tvm)
        shift
        apache_tvm_python -m pytest --confcutdir tests/upstream/apache_tvm -p no:cacheprovider \
            tests/upstream/apache_tvm "$@"
        ;;
    apache-tvm-run)
        shift
        apache_tvm_python "$@"
        ;;
    setup)
        setup
        echo "tessera.sh: $VENV is ready (TESSERA_TOOLCHAIN_PYTHON=$(cd "$VENV" && pwd)/bin/python)" >&2
        ;;
    *)
        echo "usage: ./tessera.sh demo [--out DIR] | test [pytest args] | setup | apache-tvm [pytest args] | apache-tvm-run SCRIPT" >&2
        exit 2
        ;;
esac
