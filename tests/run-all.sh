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
  PYTHONPATH="$PWD/hosts/python${PYTHONPATH:+:$PYTHONPATH}" \
    DDPLUG_BUILD_DIR="$(cd "$BUILD" && pwd)" "$VENV/bin/python" -m pytest -q tests/python
fi
# The C tests again under AddressSanitizer + UndefinedBehaviorSanitizer
# (LeakSanitizer checks every forked case and rank). The big collective
# matrix is left to the normal build (its code paths run in test-cpu-api
# here too). DDPLUG_SANITIZE_PASS=0 skips this pass.
if [[ "${DDPLUG_SANITIZE_PASS:-1}" != 0 ]]; then
  ASAN_BUILD="$BUILD-asan"
  echo "== C tests under ASan + UBSan ($ASAN_BUILD)"
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$ASAN_BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDDPLUG_SANITIZE=address,undefined -DDDPLUG_BUILD_BENCH=OFF \
    -DDDPLUG_PYTHON="$(cd "$(dirname "$VENV")" && pwd)/$(basename "$VENV")/bin/python" \
    >"$ASAN_BUILD.configure.log" 2>&1 || { cat "$ASAN_BUILD.configure.log"; exit 1; }
  cmake --build "$ASAN_BUILD" -j "$JOBS" >"$ASAN_BUILD.build.log" 2>&1 || { tail -50 "$ASAN_BUILD.build.log"; exit 1; }
  ctest --test-dir "$ASAN_BUILD" --output-on-failure -j "$JOBS" -E '^test-cpu-coll$'
fi
echo "== all tests passed"
