#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, and run the main job on built-in defaults.
# The main job is `gossamer compare`: ddp, diloco, streaming_diloco, noloco and co2 on the same model,
# data and emulated network, with summary.json and report.html. Arguments are passed to it, e.g.
# scripts/run.sh --out runs/first --methods ddp,diloco
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh main
# Only the gossamer command: the tests and benchmarks' helpers are built by scripts/test.sh.
GOSSAMER_BUILD_TARGETS=gossamer scripts/build.sh
echo "run: gossamer compare on built-in defaults (a few minutes; progress below, the table at the end)"
# A fresh output folder each run, unless the arguments name one.
for arg in "$@"; do
  case "$arg" in --out|--out=*) exec ./build/src/app/gossamer compare "$@" ;; esac
done
exec ./build/src/app/gossamer compare --out "runs/compare-$(date +%Y%m%d-%H%M%S)" "$@"
