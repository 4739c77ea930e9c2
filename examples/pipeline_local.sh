#!/usr/bin/env bash
# Starts a SkipPipe pipeline across processes on this machine: one `gossamer pipeline --node K`
# process per pipeline node (pipeline.nodes of the config, 8 by default), linked over TCP on
# loopback, and waits for them. With a shape, every node's links behave like that network path.
# With CHECK=1 it then trains the same config in one process and compares the validation losses,
# which must be equal to the last digit (the nodes follow the planned timetable).
# Usage: examples/pipeline_local.sh [CONFIG=examples/configs/pipeline_local.toml] [SHAPE] [OUT=runs/pipeline-local] [PORT=47100]
#   SHAPE: a preset (see `gossamer peer --help`) or MBIT,MS, e.g. 100,25
#   PORT: node K listens on 127.0.0.1:(PORT + K); the ports must be free.
# KILL=K (environment): node K's process is killed (SIGKILL) KILL_AFTER seconds (default 3) after
# the start; the others reschedule without it and go on (each one's summary.json counts lost_nodes).
# Each node logs to OUT/nK.log; results in OUT/nK/ (metrics.jsonl, summary.json); the node that
# evaluates reports the validation loss. Ctrl-C stops every node.
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-examples/configs/pipeline_local.toml}"
shape="${2:-}"
out="${3:-runs/pipeline-local}"
port="${4:-47100}"
gossamer=build/src/app/gossamer
[ -x "$gossamer" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
[ -f "$config" ] || { echo "no config at $config" >&2; exit 1; }
n=$("$gossamer" config --config "$config" | awk '/^\[pipeline\]/ {p = 1; next} /^\[/ {p = 0} p && $1 == "nodes" {print $3}')
[ -n "$n" ] || { echo "cannot read pipeline.nodes from $config" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"
addresses=""
for k in $(seq 0 $((n - 1))); do addresses+="127.0.0.1:$((port + k)),"; done
addresses="${addresses%,}"
shape_args=()
[ -n "$shape" ] && shape_args=(--shape "$shape")
pids=()
stop() { kill -INT "${pids[@]}" 2>/dev/null || true; }
trap stop INT TERM
echo "starting $n pipeline nodes at $addresses${shape:+, links shaped as $shape}"
for k in $(seq 0 $((n - 1))); do
  "$gossamer" --log-level warn pipeline --config "$config" --node "$k" --addresses "$addresses" "${shape_args[@]}" --out "$out/n$k" > "$out/n$k.log" 2>&1 &
  pids+=($!)
done
if [ -n "${KILL:-}" ]; then
  sleep "${KILL_AFTER:-3}"
  echo "killing node $KILL"
  kill -KILL "${pids[$KILL]}"
fi
failed=0
for k in $(seq 0 $((n - 1))); do
  [ "$k" = "${KILL:-}" ] && { wait "${pids[$k]}" 2>/dev/null || true; continue; }
  if ! wait "${pids[$k]}"; then
    echo "node $k failed: $(tail -n 1 "$out/n$k.log")" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1
for k in $(seq 0 $((n - 1))); do [ "$k" = "${KILL:-}" ] || tail -n 1 "$out/n$k.log"; done
if [ "${CHECK:-0}" = 1 ] && [ -z "${KILL:-}" ]; then
  "$gossamer" --log-level warn pipeline --config "$config" --out "$out/one" > "$out/one.log" 2>&1
  one=$(grep -o '"val_loss":[0-9.e+-]*' "$out/one/metrics.jsonl" | tail -n 1)
  many=$(grep -ho '"val_loss":[0-9.e+-]*' "$out"/n*/metrics.jsonl | tail -n 1)
  echo "one process: $one; $n processes: $many"
  [ "$one" = "$many" ] || { echo "the losses differ" >&2; exit 1; }
  echo "the same validation loss, bit for bit"
fi
