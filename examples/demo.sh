#!/usr/bin/env bash
# make demo: the README's main job.
# Until the Lightning adapter lands, it runs the C trainer on 2 local ranks
# through the `ddplug run` launcher.
# usage: examples/demo.sh BUILD_DIR VENV_DIR
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
export DDPLUG_PLUGIN_PATH="$PWD/$BUILD/lib"
echo "== ddplug demo: a data-parallel C trainer on 2 ranks (ddplug run -n 2)"
"$BUILD/bin/ddplug" info host | sed 's/^/   /'
exec "$BUILD/bin/ddplug" run -n 2 -- "$BUILD/bin/ddplug-c-trainer" examples/c-trainer/demo.json
