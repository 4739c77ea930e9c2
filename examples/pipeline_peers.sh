#!/usr/bin/env bash
# Starts a SkipPipe pipeline over `gossamer peer` processes on this machine: the first peer defines
# the run from the config (with pipeline.enabled = true), the others --join it and learn the run
# from it; once pipeline.nodes peers (8 in the default config) are ready, the peers there become the
# pipeline's nodes (in id order) and train. With a shape, every peer's links and gossip behave like
# that network path. With CHECK=1 it then trains the same config in one process (`gossamer
# pipeline`) and compares the validation losses, which must be equal to the last digit.
# Usage: examples/pipeline_peers.sh [CONFIG=examples/configs/pipeline_local.toml] [SHAPE] [OUT=runs/pipeline-peers]
#   SHAPE: a preset (see `gossamer peer --help`) or MBIT,MS, e.g. 100,25
# KILL=K (environment): the K-th peer started (0 is the first) dies, as if killed, before iteration
# KILL_AT (default 10); the others reschedule without it and go on (their summary.json counts
# lost_nodes). Each peer logs to OUT/pK.log; results in OUT/pK/ (metrics.jsonl, summary.json); the
# peer that holds stage 0's weights reports the validation loss. Ctrl-C stops every peer.
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-examples/configs/pipeline_local.toml}"
shape="${2:-}"
out="${3:-runs/pipeline-peers}"
gossamer=build/src/app/gossamer
[ -x "$gossamer" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
[ -f "$config" ] || { echo "no config at $config" >&2; exit 1; }
n=$("$gossamer" config --config "$config" | awk '/^\[pipeline\]/ {p = 1; next} /^\[/ {p = 0} p && $1 == "nodes" {print $3}')
[ -n "$n" ] || { echo "cannot read pipeline.nodes from $config" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"
common=(--log-level warn peer --listen 127.0.0.1:0)
[ -n "$shape" ] && common+=(--shape "$shape")
drill() { [ "${KILL:-}" = "$1" ] && echo "--crash-at-step ${KILL_AT:-10}"; true; }
pids=()
stop() { kill -INT "${pids[@]}" 2>/dev/null || true; }
trap stop INT TERM
"$gossamer" "${common[@]}" --config "$config" --set pipeline.enabled=true --out "$out/p0" $(drill 0) > "$out/p0.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$out/p0/address" ] && break; sleep 0.1; done
[ -s "$out/p0/address" ] || { echo "the first peer did not start: $(tail -n 1 "$out/p0.log")" >&2; stop; exit 1; }
seed=$(head -n 1 "$out/p0/address")
echo "first peer at $seed; starting $((n - 1)) more${shape:+, links shaped as $shape}"
for k in $(seq 1 $((n - 1))); do
  "$gossamer" "${common[@]}" --join "$seed" --out "$out/p$k" $(drill "$k") > "$out/p$k.log" 2>&1 &
  pids+=($!)
done
failed=0
for k in $(seq 0 $((n - 1))); do
  if ! wait "${pids[$k]}"; then
    [ "$k" = "${KILL:-}" ] && continue
    echo "peer $k failed: $(tail -n 1 "$out/p$k.log")" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1
for k in $(seq 0 $((n - 1))); do [ "$k" = "${KILL:-}" ] || grep -h '"node"' "$out/p$k/summary.json" | tr -d ' \n'; [ "$k" = "${KILL:-}" ] || echo " p$k"; done
grep -h '"final_val_loss"' "$out"/p*/summary.json | tr -d ' ,' || true
if [ "${CHECK:-0}" = 1 ] && [ -z "${KILL:-}" ]; then
  "$gossamer" --log-level warn pipeline --config "$config" --out "$out/one" > "$out/one.log" 2>&1
  one=$(grep -o '"val_loss":[0-9.e+-]*' "$out/one/metrics.jsonl" | tail -n 1)
  many=$(grep -ho '"val_loss":[0-9.e+-]*' "$out"/p*/metrics.jsonl | tail -n 1)
  echo "one process: $one; $n peers: $many"
  [ "$one" = "$many" ] || { echo "the losses differ" >&2; exit 1; }
  echo "the same validation loss, bit for bit"
fi
