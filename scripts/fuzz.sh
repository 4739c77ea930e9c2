#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (installing clang and its runtime if missing) and runs each
# for a while. Usage: scripts/fuzz.sh [seconds per target, default 60]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
scripts/setup.sh
need=()
for pkg in clang libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "fuzz: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if [ ! -f build-fuzz/CMakeCache.txt ]; then
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
        -DGOSSAMER_FUZZ=ON
fi
targets=(quant_decode_fuzz sparse_decode_fuzz checkpoint_decode_fuzz protocol_decode_fuzz gossip_fuzz secure_channel_fuzz round_message_fuzz
         spec_announcement_fuzz join_board_fuzz state_manifest_fuzz state_transfer_fuzz relay_request_fuzz
         update_decode_fuzz)
cmake --build build-fuzz --target "${targets[@]}"
for target in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$target" build-fuzz/artifacts
  if [ "$target" = sparse_decode_fuzz ] && [ ! -e build-fuzz/corpus/$target/seed ]; then
    # The golden payload of tests/quant/sparse_test.cpp, so the fuzzer starts past the header checks.
    printf '\x47\x53\x50\x52\x01\x02\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x08\x00\x00\x00\x04\x00\x00\x00\x0b\x00\x00\x00\x00\x00\x00\x00\x00\x00\x20\x40\x00\x00\xd0\x40\x99\x0f\x87' \
      > build-fuzz/corpus/$target/seed
  fi
  echo "fuzz: $target for ${seconds}s"
  # Targets that take several messages per input write valid seeds into the corpus (tests/fuzz/records.h).
  GOSSAMER_FUZZ_SEED_DIR="build-fuzz/corpus/$target" \
    "build-fuzz/tests/fuzz/$target" -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=4096 -artifact_prefix=build-fuzz/artifacts/ "build-fuzz/corpus/$target"
done
