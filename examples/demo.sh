#!/usr/bin/env bash
# make demo: the README's main job — a 2-process CPU Lightning training run with
# the ddplug strategy on synthetic variable-length sequences through ddplug's
# bucket sampler (examples/lightning/ddplug.json). It prints the plugin and ABI
# version, each loader's owner decision, the audit reports, steps per epoch and
# samples/s.
# usage: examples/demo.sh BUILD_DIR VENV_DIR   (the Makefile passes both)
set -euo pipefail
BUILD=${1:-build}
VENV=${2:-.venv}
cd "$(dirname "$0")/.."
export DDPLUG_BUILD_DIR="$(cd "$BUILD" && pwd)"
export DDPLUG_PLUGIN_PATH="$DDPLUG_BUILD_DIR/lib${DDPLUG_PLUGIN_PATH:+:$DDPLUG_PLUGIN_PATH}"
# The package from this checkout, also when it is not installed in VENV.
export PYTHONPATH="$PWD/hosts/python${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
exec "$VENV/bin/python" examples/lightning/train.py --config examples/lightning/ddplug.json "${@:3}"
