#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, and run the main job on built-in defaults.
# Arguments are passed to the main job, e.g. scripts/run.sh --out runs/first
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
out="runs/quickstart-$(date +%Y%m%d-%H%M%S)"
exec ./build/src/app/gossamer train --out "$out" "$@"
