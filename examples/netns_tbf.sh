#!/usr/bin/env bash
# Cross-checks the userspace shaper (transport/shaped_link.h) against the kernel: the same transfer
# (a) between two network namespaces joined by a veth pair whose egress is limited by `tc tbf`, and
# (b) on loopback through a ShapedLink with the same rate. Needs root (ip netns, tc).
# Usage: examples/netns_tbf.sh [RATE_MBIT=100] [MIB=64]
set -euo pipefail
cd "$(dirname "$0")/.."
rate="${1:-100}"
mib="${2:-64}"
probe=build/examples/link_probe
[ -x "$probe" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "netns_tbf.sh needs root (ip netns, tc)" >&2; exit 1; }

ns_a="gsm-a-$$"; ns_b="gsm-b-$$"
cleanup() { ip netns del "$ns_a" 2>/dev/null || true; ip netns del "$ns_b" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$ns_a"
ip netns add "$ns_b"
ip link add "va-$$" netns "$ns_a" type veth peer name "vb-$$" netns "$ns_b"
ip -n "$ns_a" addr add 198.18.77.1/24 dev "va-$$"
ip -n "$ns_b" addr add 198.18.77.2/24 dev "vb-$$"
ip -n "$ns_a" link set "va-$$" up
ip -n "$ns_b" link set "vb-$$" up
ip -n "$ns_a" link set lo up
ip -n "$ns_b" link set lo up
# Egress of both ends limited by a token bucket: rate, a burst of 64 KiB, 50 ms of queue.
tc -n "$ns_a" qdisc add dev "va-$$" root tbf rate "${rate}mbit" burst 64kb latency 50ms
tc -n "$ns_b" qdisc add dev "vb-$$" root tbf rate "${rate}mbit" burst 64kb latency 50ms

echo "== kernel tbf at ${rate} Mbit/s between namespaces, ${mib} MiB"
ip netns exec "$ns_b" "$probe" serve 198.18.77.2:47700 > /tmp/netns_tbf_server.$$ &
server=$!
sleep 0.5
ip netns exec "$ns_a" "$probe" send 198.18.77.2:47700 "$mib"
wait "$server"
cat /tmp/netns_tbf_server.$$ | tail -1

echo "== userspace shaper at ${rate} Mbit/s on loopback, ${mib} MiB"
"$probe" serve 127.0.0.1:47701 > /tmp/netns_tbf_server.$$ &
server=$!
sleep 0.5
"$probe" send 127.0.0.1:47701 "$mib" "$rate"
wait "$server"
tail -1 /tmp/netns_tbf_server.$$
rm -f /tmp/netns_tbf_server.$$
