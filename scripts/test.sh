#!/usr/bin/env bash
# Quick start, command 2: install what is missing, build, and run the whole test suite.
# Arguments are passed to ctest, e.g. scripts/test.sh -L core
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure --parallel "$(nproc)" --timeout 900 "$@"
