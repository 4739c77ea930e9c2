#!/usr/bin/env bash
# Starts N real peers on this machine (default 4) that train one run together, each in its own
# process with its own run folder, and waits for them. With a shape, every peer's links behave like
# that network path, so the peers act as if continents apart.
# Usage: examples/local_peers.sh [CONFIG=examples/configs/peer_diloco.toml] [N=4] [SHAPE] [OUT=runs/peers]
#   SHAPE: a preset (see `gossamer peer --help`) or MBIT,MS, e.g. 100,50 (userspace, the peers' links)
#   TBF=MBIT (environment, needs root): each peer runs in a network namespace of its own, joined to
#     the others through a bridge by a veth pair whose both directions the kernel limits with tc tbf
#     to MBIT Mbit/s. That shapes every byte a peer moves (gossip, and Gloo's own connections for
#     ddp.engine = "gloo", which the userspace shaper does not see). tbf has no delay line (netem is
#     not always there): add a SHAPE for latency.
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
tbf="${TBF:-}"
gossamer=build/src/app/gossamer
[ -x "$gossamer" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
[ -f "$config" ] || { echo "no config at $config" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"
shape_args=()
[ -n "$shape" ] && shape_args=(--shape "$shape")
pids=()
cores=$(nproc)

# Namespaces: gsm-hub-PID holds the bridge; peer k lives in gsm-pK-PID at 198.18.78.(k+1).
hub="gsm-hub-$$"
ns_of() { echo "gsm-p$1-$$"; }
cleanup_netns() {
  for k in $(seq 0 $((n - 1))); do ip netns del "$(ns_of "$k")" 2>/dev/null || true; done
  ip netns del "$hub" 2>/dev/null || true
}
if [ -n "$tbf" ]; then
  [ "$(id -u)" -eq 0 ] || { echo "TBF needs root (ip netns, tc)" >&2; exit 1; }
  trap cleanup_netns EXIT
  ip netns add "$hub"
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  for k in $(seq 0 $((n - 1))); do
    ns=$(ns_of "$k")
    ip netns add "$ns"
    ip link add "gp$k-$$" netns "$ns" type veth peer name "gh$k-$$" netns "$hub"
    ip -n "$ns" addr add "198.18.78.$((k + 1))/24" dev "gp$k-$$"
    ip -n "$ns" link set "gp$k-$$" up
    ip -n "$ns" link set lo up
    ip -n "$hub" link set "gh$k-$$" master br0 up
    # Both directions: the peer's uplink (its veth end) and its downlink (the hub's end).
    tc -n "$ns" qdisc add dev "gp$k-$$" root tbf rate "${tbf}mbit" burst 64kb latency 100ms
    tc -n "$hub" qdisc add dev "gh$k-$$" root tbf rate "${tbf}mbit" burst 64kb latency 100ms
  done
  echo "$n namespaces joined by a bridge, every peer's link limited to ${tbf} Mbit/s each way by tbf"
fi
host_of() { if [ -n "$tbf" ]; then echo "198.18.78.$(($1 + 1))"; else echo 127.0.0.1; fi; }
# What runs peer $1: in its namespace, pinned to a core when peers outnumber cores.
launcher() {
  if [ -n "$tbf" ]; then echo "ip netns exec $(ns_of "$1")"; fi
  if [ "${PIN:-1}" = 1 ] && [ "$n" -gt "$cores" ] && command -v taskset > /dev/null; then echo "taskset -c $(($1 % cores))"; fi
}
trap 'kill -INT "${pids[@]}" 2>/dev/null || true; wait; [ -z "$tbf" ] || cleanup_netns' INT TERM

$(launcher 0) "$gossamer" peer --listen "$(host_of 0):0" --config "$config" --wait-for "$n" --out "$out/p0" "${shape_args[@]}" > "$out/p0.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$out/p0/address" ] && break; sleep 0.1; done
[ -s "$out/p0/address" ] || { echo "peer 0 did not start: see $out/p0.log" >&2; exit 1; }
first=$(head -n1 "$out/p0/address")
echo "peer 0 listens on $first; starting $((n - 1)) more"
for k in $(seq 1 $((n - 1))); do
  $(launcher "$k") "$gossamer" peer --listen "$(host_of "$k"):0" --join "$first" --out "$out/p$k" "${shape_args[@]}" > "$out/p$k.log" 2>&1 &
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
