#!/usr/bin/env bash
# Configures and builds Gossamer (Release) into ./build. Extra arguments go to CMake's configure step,
# e.g. scripts/build.sh -DGOSSAMER_SANITIZE=address,undefined
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
elif [ $# -gt 0 ]; then
  cmake -S . -B build "$@"
fi
cmake --build build --parallel "$(nproc)"
