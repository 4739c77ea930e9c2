#!/usr/bin/env bash
# An internet on one machine: network namespaces as hosts on different subnets, joined by a router
# namespace, and two sites behind NAT routers (nftables masquerade), one with a port forward. Only the
# documentation and benchmark address ranges are used, and nothing is routed out of the namespaces.
#
#   public host  TAGa  192.0.2.2       (TAGb 198.51.100.2 and TAGc 203.0.113.2 before the NAT sites)
#   NAT site 1   router TAGn: outside 203.0.113.2, port forward 9000/9001 -> 198.18.0.2:7000/7001
#                host   TAGp: 198.18.0.2 (behind it)
#   NAT site 2   router TAGm: outside 198.51.100.2, masquerade only (no port forward)
#                host   TAGq: 198.19.0.2 (behind it)
#
# Usage (root; iproute2 and nftables):
#   examples/netns_internet.sh up [TAG]     builds it (TAG defaults to "gi") and says how to use it
#   examples/netns_internet.sh down [TAG]   removes it, killing what runs inside
# Then, for example (latency between sites: give the peers --shape MBIT,MS):
#   ip netns exec gia gossamer peer --listen 0.0.0.0:7000 --config run.toml --key run.key --wait-for 3 --out p0
#   ip netns exec gip gossamer peer --listen 0.0.0.0:7000 --join 192.0.2.2:7000 --key run.key --shape 50,20 --out p1
#   ip netns exec giq gossamer peer --listen 0.0.0.0:7000 --join 192.0.2.2:7000 --key run.key --shape 50,20 --out p2
# (p1 and p2 find themselves outbound-only; their link goes through p0 as relay.)
# tests/runtime/netns_test.sh sources this file for the same functions.

# internet_core TAG: the router TAGr and three public hosts TAGa, TAGb, TAGc on 192.0.2.0/24,
# 198.51.100.0/24 and 203.0.113.0/24 (each .2, the router .1). Sets R, H (namespaces made) and NETS.
internet_core() {
  local tag=$1 i ns net
  R="${tag}r"; H=("${tag}a" "${tag}b" "${tag}c")
  NETS=(192.0.2 198.51.100 203.0.113)
  ip netns add "$R" || return 1
  ip -n "$R" link set lo up
  ip netns exec "$R" sysctl -qw net.ipv4.ip_forward=1
  for i in 0 1 2; do
    ns=${H[$i]}; net=${NETS[$i]}
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "${tag}v$i" type veth peer name "${tag}w$i"
    ip link set "${tag}v$i" netns "$ns"
    ip link set "${tag}w$i" netns "$R"
    ip -n "$ns" addr add "$net.2/24" dev "${tag}v$i"
    ip -n "$ns" link set "${tag}v$i" up
    ip -n "$R" addr add "$net.1/24" dev "${tag}w$i"
    ip -n "$R" link set "${tag}w$i" up
    ip -n "$ns" route add default via "$net.1"
  done
}

# nat_site ROUTER HOST LEG OUTSIDE_NET INSIDE_NET: a NAT router namespace whose outside leg takes the
# place of the host on OUTSIDE_NET (its .2, behind router R's .1; R's veth LEG to that host is put
# down), and a host namespace behind it at INSIDE_NET.2. The NAT rules: nat_masquerade, nat_forward.
nat_site() {
  local nr=$1 host=$2 leg=$3 out=$4 in=$5
  H+=("$nr" "$host")
  ip netns add "$nr"; ip netns add "$host"
  ip -n "$nr" link set lo up; ip -n "$host" link set lo up
  ip netns exec "$nr" sysctl -qw net.ipv4.ip_forward=1
  ip link add "${nr}o" type veth peer name "${nr}r"
  ip link set "${nr}o" netns "$nr"; ip link set "${nr}r" netns "$R"
  ip -n "$R" addr flush dev "$leg"; ip -n "$R" link set "$leg" down
  ip -n "$nr" addr add "$out.2/24" dev "${nr}o"; ip -n "$nr" link set "${nr}o" up
  ip -n "$R" addr add "$out.1/24" dev "${nr}r"; ip -n "$R" link set "${nr}r" up
  ip -n "$nr" route add default via "$out.1"
  ip link add "${nr}i" type veth peer name "${nr}h"
  ip link set "${nr}h" netns "$host"; ip link set "${nr}i" netns "$nr"
  ip -n "$host" addr add "$in.2/24" dev "${nr}h"; ip -n "$host" link set "${nr}h" up
  ip -n "$nr" addr add "$in.1/24" dev "${nr}i"; ip -n "$nr" link set "${nr}i" up
  ip -n "$host" route add default via "$in.1"
}

# nat_masquerade ROUTER: what leaves by the outside leg takes the router's address.
nat_masquerade() {
  ip netns exec "$1" nft -f - <<NFT
table ip nat {
  chain postrouting { type nat hook postrouting priority srcnat; oifname "${1}o" masquerade; }
}
NFT
}

# nat_forward ROUTER INSIDE_IP OUTSIDE_PORT INSIDE_PORT [OUTSIDE_PORT INSIDE_PORT ...]: masquerade,
# and port forwards from the outside leg to INSIDE_IP.
nat_forward() {
  local nr=$1 ip=$2 rules=""
  shift 2
  while [ $# -ge 2 ]; do
    rules+="iifname \"${nr}o\" tcp dport $1 dnat to $ip:$2; "
    shift 2
  done
  ip netns exec "$nr" nft -f - <<NFT
table ip nat {
  chain prerouting { type nat hook prerouting priority dstnat; $rules}
  chain postrouting { type nat hook postrouting priority srcnat; oifname "${nr}o" masquerade; }
}
NFT
}

# internet_down: kills what runs in the namespaces of H and R and removes them.
internet_down() {
  local ns
  for ns in "${H[@]}" "$R"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -u
  tag="${2:-gi}"
  case "${1:-}" in
    up)
      [ "$(id -u)" -eq 0 ] || { echo "netns_internet.sh needs root (ip netns, nft)" >&2; exit 1; }
      command -v nft > /dev/null || { echo "nft is missing: apt-get install nftables" >&2; exit 1; }
      internet_core "$tag" || exit 1
      nat_site "${tag}n" "${tag}p" "${tag}w2" 203.0.113 198.18.0 && nat_forward "${tag}n" 198.18.0.2 9000 7000 9001 7001
      nat_site "${tag}m" "${tag}q" "${tag}w1" 198.51.100 198.19.0 && nat_masquerade "${tag}m"
      echo "up: public host ${tag}a (192.0.2.2); behind NAT ${tag}n (203.0.113.2, forwards 9000/9001): host ${tag}p (198.18.0.2);"
      echo "    behind NAT ${tag}m (198.51.100.2, no forward): host ${tag}q (198.19.0.2). Run peers with: ip netns exec NAMESPACE gossamer peer ..."
      ;;
    down)
      R="${tag}r"; H=("${tag}a" "${tag}b" "${tag}c" "${tag}n" "${tag}p" "${tag}m" "${tag}q")
      internet_down
      echo "down: ${tag}*"
      ;;
    *)
      sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
      exit 2
      ;;
  esac
fi
