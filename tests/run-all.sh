#!/usr/bin/env bash
# Run every test: the C tests through ctest, then the Python tests (real
# Lightning, real subprocess ranks) through pytest when they exist.
# usage: tests/run-all.sh BUILD_DIR VENV_DIR
set -euo pipefail
BUILD=${1:-build}
VENV=${2:-.venv}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
cd "$(dirname "$0")/.."
echo "== C tests (ctest, $BUILD)"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS"
if compgen -G "tests/python/test_*.py" >/dev/null; then
  echo "== Python tests (pytest)"
  # This checkout's package, whatever the environment has installed.
  PYTHONPATH="$PWD/hosts/lightning/src${PYTHONPATH:+:$PYTHONPATH}" \
    DDPLUG_BUILD_DIR="$(cd "$BUILD" && pwd)" "$VENV/bin/python" -m pytest -q tests/python
fi
echo "== all tests passed"
