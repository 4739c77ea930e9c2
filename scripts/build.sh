#!/usr/bin/env bash
# Configures and builds Gossamer (Release) into ./build. Extra arguments go to CMake's configure step,
# e.g. scripts/build.sh -DGOSSAMER_SANITIZE=address,undefined
# GOSSAMER_BUILD_TARGETS (space-separated) builds only those targets, e.g. GOSSAMER_BUILD_TARGETS=gossamer
# for the command alone (scripts/run.sh does), about 140 of the build's 200 compile steps.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
else
  # Configured again (seconds): packages installed since (pybind11 for the Python package) are found.
  cmake -S . -B build "$@" > /dev/null
fi
targets=()
for t in ${GOSSAMER_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
echo "build: compiling ${GOSSAMER_BUILD_TARGETS:-every target, tests included} with $(nproc) job(s); ninja counts the steps as it goes"
cmake --build build --parallel "$(nproc)" "${targets[@]}"
