#!/usr/bin/env bash
# make demo: the README's main job. Filled in as the layers land.
set -euo pipefail
echo "ddplug demo: not available yet"
exit 1
