#!/usr/bin/env bash
# Starts N real peers on this machine (default 4) that train one run together, each in its own
# process with its own run folder, and waits for them. With a shape, every peer's links behave like
# that network path, so the peers act as if continents apart.
# Usage: examples/local_peers.sh [CONFIG=examples/configs/peer_diloco.toml] [N=4] [SHAPE] [OUT=runs/peers]
#   SHAPE: a preset (see `gossamer peer --help`) or MBIT,MS, e.g. 100,50
# Each peer logs to OUT/pK.log; results in OUT/pK/ (summary.json, metrics.jsonl, checkpoint.bin).
# Ctrl-C stops every peer gracefully. With more peers than cores, peer k is pinned to core k mod
# cores (taskset), so peers that share cores run at one pace and the time they spend blocked measures
# the network rather than the scheduler; PIN=0 turns that off.
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-examples/configs/peer_diloco.toml}"
n="${2:-4}"
shape="${3:-}"
out="${4:-runs/peers}"
gossamer=build/src/app/gossamer
[ -x "$gossamer" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
[ -f "$config" ] || { echo "no config at $config" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"
shape_args=()
[ -n "$shape" ] && shape_args=(--shape "$shape")
pids=()
cores=$(nproc)
pin() {  # the command that runs peer $1
  if [ "${PIN:-1}" = 1 ] && [ "$n" -gt "$cores" ] && command -v taskset > /dev/null; then echo "taskset -c $(($1 % cores))"; fi
}
trap 'kill -INT "${pids[@]}" 2>/dev/null || true; wait' INT TERM

$(pin 0) "$gossamer" peer --listen 127.0.0.1:0 --config "$config" --wait-for "$n" --out "$out/p0" "${shape_args[@]}" > "$out/p0.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$out/p0/address" ] && break; sleep 0.1; done
[ -s "$out/p0/address" ] || { echo "peer 0 did not start: see $out/p0.log" >&2; exit 1; }
first=$(head -n1 "$out/p0/address")
echo "peer 0 listens on $first; starting $((n - 1)) more"
for k in $(seq 1 $((n - 1))); do
  $(pin "$k") "$gossamer" peer --listen 127.0.0.1:0 --join "$first" --out "$out/p$k" "${shape_args[@]}" > "$out/p$k.log" 2>&1 &
  pids+=($!)
done
status=0
for k in "${!pids[@]}"; do
  if wait "${pids[$k]}"; then
    echo "peer $k: $(tail -n 2 "$out/p$k.log" | head -n 1 | sed 's/^\[[^]]*\] //')"
  else
    echo "peer $k failed: see $out/p$k.log"; status=1
  fi
done
# Compute utilization: inner-step time over inner-step time plus time blocked on communication
# (agreeing on groups and waiting for the slowest member included).
field() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" "$2" | head -n1; }
for k in "${!pids[@]}"; do
  s="$out/p$k/summary.json"
  [ -f "$s" ] || continue
  awk -v k="$k" -v c="$(field compute_s "$s")" -v b="$(field blocked_s "$s")" -v sent="$(field bytes_sent "$s")" -v r="$(field rounds "$s")" \
    'BEGIN { printf "peer %s: compute %.2f s, blocked %.2f s, utilization %.3f, sent %.2f MB, rounds %d\n", k, c, b, c / (c + b), sent / 1e6, r }'
done
exit $status
