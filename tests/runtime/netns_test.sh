#!/bin/bash
# Peers on hosts of their own (label net): network namespaces on three subnets joined by a router
# namespace, each peer started as docs/peer.md says, with `--listen 0.0.0.0:7000`. Addresses come
# from the documentation ranges and nothing is routed out of the namespaces.
# Then peers behind NAT routers (nftables masquerade): one reachable through a port forward with
# --advertise; two behind different NATs without forwards, found outbound-only by the dial-back check,
# linked to each other through the public peer as relay; the only reachable peer dying (the others
# say why they cannot go on), and with a second reachable peer (they go on).
# Needs root (ip netns); without it the test says so and skips (exit 77).
# Usage: netns_test.sh path/to/gossamer
set -u
G="$(readlink -f "$1")"
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null 2>&1; then
  echo "netns: skipped: network namespaces need root and iproute2"; exit 77
fi
# The topology's pieces are examples/netns_internet.sh's (also usable by hand).
source "$(dirname "$(readlink -f "$0")")/../../examples/netns_internet.sh"
tag="g$$"
WORK=$(mktemp -d)
FAILED=0
R="${tag}r"; H=()
cleanup() {
  internet_down
  [ $FAILED -eq 0 ] && rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; FAILED=1; exit 1; }

internet_core "$tag" 2>/dev/null || { echo "netns: skipped: cannot create a network namespace here"; exit 77; }

SETS=(--set model.layers=1 --set model.width=32 --set model.heads=2 --set model.context=32 --set train.batch_size=4
      --set train.steps=40 --set train.warmup_steps=5 --set train.eval_every=20 --set diloco.inner_steps=10 --set train.threads=1
      --set train.round_timeout_s=30)
"$G" keygen --out "$WORK/run.key" >/dev/null 2>&1 || fail "keygen failed"

# Scenario: docs/peer.md's commands verbatim, every peer on 0.0.0.0:7000, three hosts on three subnets.
cd "$WORK"
ip netns exec "${H[0]}" timeout 120 "$G" peer --listen 0.0.0.0:7000 "${SETS[@]}" --key run.key --wait-for 3 --out p0 > p0.log 2>&1 &
sleep 1.5
for i in 1 2; do
  ip netns exec "${H[$i]}" timeout 120 "$G" peer --listen 0.0.0.0:7000 --join "${NETS[0]}.2:7000" --key run.key --out "p$i" > "p$i.log" 2>&1 &
done
wait
for i in 0 1 2; do
  [ -f "p$i/summary.json" ] || { tail -n 20 "p$i.log"; fail "wildcard: peer $i did not finish"; }
done
digest() { sed -n 's/.*"params_digest": "\([0-9a-f]*\)".*/\1/p' "$1/summary.json"; }
d0=$(digest p0)
[ -n "$d0" ] && [ "$(digest p1)" = "$d0" ] && [ "$(digest p2)" = "$d0" ] || fail "wildcard: the peers ended with different parameters"
grep -q '"skipped_rounds": 0' p0/summary.json || { cat p0/summary.json; fail "wildcard: rounds were skipped"; }
echo "netns: three peers on three subnets, each on 0.0.0.0:7000, trained to the end with the same parameters"

# Scenario: a SkipPipe pipeline over six peers, two on each of the three hosts (0.0.0.0:7000 and
# 0.0.0.0:7100), keyed: the nodes find each other's links through gossip and finish with the
# validation loss of the same config in one process.
PSETS=(--set pipeline.enabled=true --set model.layers=6 --set model.width=16 --set model.heads=2 --set model.context=16
       --set train.batch_size=2 --set train.steps=8 --set train.warmup_steps=2 --set train.lr=0.01 --set train.eval_every=4
       --set train.eval_batches=2 --set pipeline.nodes=6 --set pipeline.stages=3 --set pipeline.path_length=2
       --set pipeline.mbs_per_origin=2 --set pipeline.mbs_per_agent=1 --set pipeline.network=uniform --set pipeline.gcma_trials=50
       --set train.threads=1 --set train.round_timeout_s=30)
# Six pipeline peers q0 .. q5 in the current folder, two per host; the first with PSETS and "$@".
six_pipeline_peers() {
  ip netns exec "${H[0]}" timeout 120 "$G" peer --listen 0.0.0.0:7000 "${PSETS[@]}" "$@" --key ../run.key --out q0 > q0.log 2>&1 &
  sleep 1.5
  local k=1 i port
  for i in 0 1 2; do
    for port in 7000 7100; do
      [ "$i/$port" = 0/7000 ] && continue
      ip netns exec "${H[$i]}" timeout 120 "$G" peer --listen "0.0.0.0:$port" --join "${NETS[0]}.2:7000" --key ../run.key --out "q$k" > "q$k.log" 2>&1 &
      k=$((k + 1))
    done
  done
  wait
}
mkdir -p "$WORK/pipe" && cd "$WORK/pipe"
six_pipeline_peers
for k in 0 1 2 3 4 5; do
  grep -q '"iterations": 8' "q$k/summary.json" 2>/dev/null || { tail -n 20 "q$k.log"; fail "pipeline: peer $k did not finish"; }
done
"$G" --log-level warn pipeline "${PSETS[@]}" --out one > one.log 2>&1 || fail "pipeline: one process failed"
one=$(grep -o '"val_loss":[0-9.e+-]*' one/metrics.jsonl | tail -n 1)
many=$(grep -ho '"val_loss":[0-9.e+-]*' q*/metrics.jsonl | tail -n 1)
[ -n "$one" ] && [ "$one" = "$many" ] || fail "pipeline: the peers' validation loss ($many) is not one process's ($one)"
echo "netns: a pipeline over six peers on three subnets (0.0.0.0, two per host) trained to the end: $many, as in one process"

# Scenario: the same six peers planning on what they measure (pipeline.network = measured), host c's
# link held to 20 Mbit/s each way by the kernel's tbf: every node measures the same network, in
# which host c's pairs are the slow ones, and plans the same schedule on it.
if command -v tc >/dev/null 2>&1 && ip netns exec "${H[2]}" tc qdisc add dev "${tag}v2" root tbf rate 20mbit burst 32kbit latency 400ms 2>/dev/null; then
  ip netns exec "$R" tc qdisc add dev "${tag}w2" root tbf rate 20mbit burst 32kbit latency 400ms
  mkdir -p "$WORK/measured" && cd "$WORK/measured"
  six_pipeline_peers --set pipeline.network=measured
  ip netns exec "${H[2]}" tc qdisc del dev "${tag}v2" root
  ip netns exec "$R" tc qdisc del dev "${tag}w2" root
  for k in 0 1 2 3 4 5; do
    grep -q '"iterations": 8' "q$k/summary.json" 2>/dev/null || { tail -n 20 "q$k.log"; fail "measured: peer $k did not finish"; }
  done
  python3 - q0 q1 q2 q3 q4 q5 <<'PY' || fail "measured: the nodes' networks differ or miss host c's slow link"
import json, sys
sums = [json.load(open(d + "/summary.json")) for d in sys.argv[1:]]
nets = [s["measured_network"] for s in sums]
assert all(n == nets[0] for n in nets), "the nodes measured different networks"
assert len({s["schedule_hash"] for s in sums}) == 1, "the nodes planned different schedules"
n, bw = nets[0]["nodes"], nets[0]["bandwidth_Bps"]
pairs = [bw[a * n + b] for a in range(n) for b in range(a + 1, n)]
slow = [x for x in pairs if x < 40e6 / 8]
fast = [x for x in pairs if x > 60e6 / 8]
# Host c's two peers each reach the four others through the 20 Mbit/s link (8 pairs); the pair on
# host c itself and the pairs between hosts a and b do not.
assert len(slow) == 8, f"{len(slow)} slow pairs: {sorted(pairs)}"
assert len(fast) >= 5, f"{len(fast)} fast pairs: {sorted(pairs)}"
print(f"netns: measured {min(pairs) * 8 / 1e6:.0f} to {max(pairs) * 8 / 1e6:.0f} Mbit/s between the six peers")
PY
  echo "netns: six peers planned a pipeline on the links they measured (host c held to 20 Mbit/s by tbf) and trained it to the end"
else
  echo "netns: measured-network scenario skipped: tc (iproute2) cannot add tbf here"
fi
cd "$WORK"

# Scenario: a peer behind a NAT router whose port forward maps other ports (9000, 9001 outside to 7000,
# 7001 inside): it is reachable only at the address it advertises.
if ! command -v nft >/dev/null 2>&1; then echo "netns: port-forward scenario skipped: nft (Debian nftables) is missing"; exit 0; fi
N="${tag}n"; P="${tag}p"
nat_site "$N" "$P" "${tag}w2" 203.0.113 198.18.0
nat_forward "$N" 198.18.0.2 9000 7000 9001 7001 || fail "nft could not set up the NAT"
mkdir -p fwd && cd fwd
ip netns exec "${H[0]}" timeout 120 "$G" peer --listen 0.0.0.0:7000 "${SETS[@]}" --key ../run.key --wait-for 2 --out p0 > p0.log 2>&1 &
sleep 1.5
ip netns exec "$P" timeout 120 "$G" peer --listen 0.0.0.0:7000 --advertise 203.0.113.2:9000 --join "${NETS[0]}.2:7000" --key ../run.key --out p1 > p1.log 2>&1 &
wait
for i in 0 1; do [ -f "p$i/summary.json" ] || { tail -n 20 "p$i.log"; fail "advertise: peer $i did not finish"; }; done
[ "$(digest p0)" = "$(digest p1)" ] || fail "advertise: the peers ended with different parameters"
echo "netns: a peer behind a NAT's port forward (9000 -> 7000) trained to the end with --advertise 203.0.113.2:9000"

# A second site behind its own NAT router (masquerade only, no port forward), in place of host b.
M="${tag}m"; Q="${tag}q"
nat_site "$M" "$Q" "${tag}w1" 198.51.100 198.19.0
nat_masquerade "$M" || fail "nft could not set up the second NAT"
summary_num() { sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$1/summary.json" | head -n 1; }

# Scenario: two peers behind different NATs, without port forwards, and one public peer. The dial-back
# check finds both outbound-only; they dial the public peer, and their link to each other goes through
# it as a relay.
cd "$WORK" && mkdir -p nat2 && cd nat2
ip netns exec "${H[0]}" timeout 120 "$G" peer --listen 0.0.0.0:7000 "${SETS[@]}" --key ../run.key --wait-for 3 --out p0 > p0.log 2>&1 &
sleep 1.5
# The sites are far apart: 50 Mbit/s and 20 ms each way on the NAT sites' links (the userspace shaper).
ip netns exec "$P" timeout 120 "$G" peer --listen 0.0.0.0:7000 --join "${NETS[0]}.2:7000" --key ../run.key --shape 50,20 --out p1 > p1.log 2>&1 &
ip netns exec "$Q" timeout 120 "$G" peer --listen 0.0.0.0:7000 --join "${NETS[0]}.2:7000" --key ../run.key --shape 50,20 --out p2 > p2.log 2>&1 &
wait
for i in 0 1 2; do [ -f "p$i/summary.json" ] || { tail -n 20 "p$i.log"; fail "two NATs: peer $i did not finish"; }; done
d0=$(digest p0)
[ -n "$d0" ] && [ "$(digest p1)" = "$d0" ] && [ "$(digest p2)" = "$d0" ] || fail "two NATs: the peers ended with different parameters"
for i in 1 2; do
  grep -q '"outbound_only": true' "p$i/summary.json" || { grep -i "connect back\|reachable" "p$i.log"; fail "two NATs: peer $i was not found outbound-only"; }
  grep -q "could not connect back" "p$i.log" || fail "two NATs: peer $i did not say why it is outbound-only"
  [ "$(summary_num "p$i" relayed_bytes_sent)" -gt 0 ] || fail "two NATs: peer $i sent nothing through the relay"
done
grep -q '"outbound_only": false' p0/summary.json || fail "two NATs: the public peer was taken for outbound-only"
fwd=$(summary_num p0 relay_forwarded_bytes)
[ "$fwd" -gt 0 ] || fail "two NATs: the public peer relayed nothing"
grep -q '"skipped_rounds": 0' p1/summary.json || { cat p1/summary.json; fail "two NATs: rounds were skipped"; }
echo "netns: two peers behind different NATs and one public peer trained to the end with the same parameters ($fwd bytes relayed by the public one)"

# Scenario: the same without a key, as docs/peer.md reads without --key. Relays need the key, so of
# the two behind NAT only one can take part (its links go to the public peer directly): the other is
# refused in one line that says what to pass, and the two that can train finish, identical. A third
# behind NAT joining the run under way is refused alike, and the run goes on.
cd "$WORK" && mkdir -p nokey && cd nokey
ip netns exec "${H[0]}" timeout 120 "$G" peer --listen 0.0.0.0:7000 "${SETS[@]}" --set train.steps=1500 --set train.eval_every=500 --wait-for 2 --out p0 > p0.log 2>&1 &
sleep 1.5
ip netns exec "$P" timeout 120 "$G" peer --listen 0.0.0.0:7000 --join "${NETS[0]}.2:7000" --out p1 > p1.log 2>&1 &
pid1=$!
ip netns exec "$Q" timeout 120 "$G" peer --listen 0.0.0.0:7000 --join "${NETS[0]}.2:7000" --out p2 > p2.log 2>&1 &
pid2=$!
# The refused one ends within seconds; the other trains on.
wait -n $pid1 $pid2; rc=$?
if kill -0 $pid1 2>/dev/null; then refused=2; kept=1; kept_pid=$pid1; else refused=1; kept=2; kept_pid=$pid2; fi
kill -0 $kept_pid 2>/dev/null || { tail -n 5 p1.log p2.log; fail "no key: both peers behind NAT ended at once"; }
[ "$rc" -eq 2 ] || { tail -n 20 "p$refused.log"; fail "no key: the refused peer exited with $rc, not 2"; }
grep -q "a run without a key relays nothing: start the run's peers with --key FILE" "p$refused.log" || { tail -n 5 "p$refused.log"; fail "no key: the refused peer did not say what to pass"; }
[ "$(grep -c ' E\]' "p$refused.log")" -eq 1 ] || { cat "p$refused.log"; fail "no key: the refusal is not one line"; }
# A third behind NAT (the second site again, its first peer gone) joins the run under way: refused.
for i in $(seq 1 100); do grep -q '"rounds":3' "p$kept/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
other=$([ "$kept" = 1 ] && echo "$Q" || echo "$P")
rc3=0
ip netns exec "$other" timeout 60 "$G" peer --listen 0.0.0.0:7000 --join "${NETS[0]}.2:7000" --out p3 > p3.log 2>&1 || rc3=$?
[ "$rc3" -eq 2 ] && grep -q "a run without a key relays nothing" p3.log || { tail -n 5 p3.log; fail "no key: a late peer behind NAT exited $rc3 without the reason"; }
kill -0 $kept_pid 2>/dev/null || fail "no key: the run ended before the late peer was refused (the check is then untested)"
wait $kept_pid; rc=$?
wait
[ "$rc" -eq 0 ] && [ -f p0/summary.json ] && [ -f "p$kept/summary.json" ] || { tail -n 20 p0.log "p$kept.log"; fail "no key: the peers that can train did not finish"; }
[ "$(digest p0)" = "$(digest "p$kept")" ] || fail "no key: the two that trained ended with different parameters"
grep -q "relays only in a run with a key" p0.log && fail "no key: a relay was asked for after all"
echo "netns: without a key, one peer behind NAT trained with the public one; the second, and a third joining later, were refused in one line"

# Scenario: a pipeline's peer behind NAT without a port forward: pipeline nodes must accept
# connections, so it is refused, saying what to do, instead of hanging the pipeline.
cd "$WORK" && mkdir -p pipenat && cd pipenat
ip netns exec "${H[0]}" timeout 60 "$G" peer --listen 0.0.0.0:7000 "${PSETS[@]}" --key ../run.key --out q0 > q0.log 2>&1 &
first=$!
sleep 1.5
rc=0
ip netns exec "$P" timeout 60 "$G" peer --listen 0.0.0.0:7000 --join "${NETS[0]}.2:7000" --key ../run.key --out q1 > q1.log 2>&1 || rc=$?
kill -INT $first 2>/dev/null; wait
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { tail -n 20 q1.log; fail "pipeline behind NAT: the peer exited with $rc"; }
grep -q "a pipeline node must accept connections" q1.log || { tail -n 20 q1.log; fail "pipeline behind NAT: the peer did not say why"; }
echo "netns: a pipeline's peer behind NAT without a port forward was refused with what to do"

# Scenario: the only reachable peer dies mid-run (a crash, as kill -9 leaves it). The two behind NAT
# can reach nobody: each ends, saying why and what to do.
LONG=("${SETS[@]}" --set train.steps=400 --set train.eval_every=200)
cd "$WORK" && mkdir -p dies && cd dies
ip netns exec "${H[0]}" timeout 120 "$G" peer --listen 0.0.0.0:7000 "${LONG[@]}" --key ../run.key --wait-for 3 --crash-at-step 60 --out p0 > p0.log 2>&1 &
sleep 1.5
ip netns exec "$P" timeout 120 "$G" peer --listen 0.0.0.0:7000 --join "${NETS[0]}.2:7000" --key ../run.key --out p1 > p1.log 2>&1 &
pid1=$!
ip netns exec "$Q" timeout 120 "$G" peer --listen 0.0.0.0:7000 --join "${NETS[0]}.2:7000" --key ../run.key --out p2 > p2.log 2>&1 &
pid2=$!
wait $pid1; rc1=$?
wait $pid2; rc2=$?
wait
for i in 1 2; do
  rc=$([ $i -eq 1 ] && echo $rc1 || echo $rc2)
  [ "$rc" -eq 1 ] || { tail -n 20 "p$i.log"; fail "the reachable peer died: peer $i exited with $rc, not 1"; }
  grep -q "every peer that accepts connections has left or died" "p$i.log" || { tail -n 20 "p$i.log"; fail "the reachable peer died: peer $i did not say why it stopped"; }
  [ -f "p$i/checkpoint.bin" ] || fail "the reachable peer died: peer $i left no checkpoint to resume from"
done
echo "netns: the only reachable peer died: both peers behind NAT stopped with exit 1 and said why"

# The same with a second reachable peer (another port of the public host): the run goes on.
cd "$WORK" && mkdir -p dies2 && cd dies2
ip netns exec "${H[0]}" timeout 150 "$G" peer --listen 0.0.0.0:7000 "${LONG[@]}" --key ../run.key --wait-for 4 --crash-at-step 60 --out p0 > p0.log 2>&1 &
sleep 1.5
ip netns exec "${H[0]}" timeout 150 "$G" peer --listen 0.0.0.0:7100 --join "${NETS[0]}.2:7000" --key ../run.key --out p3 > p3.log 2>&1 &
ip netns exec "$P" timeout 150 "$G" peer --listen 0.0.0.0:7000 --join "${NETS[0]}.2:7000" --key ../run.key --out p1 > p1.log 2>&1 &
ip netns exec "$Q" timeout 150 "$G" peer --listen 0.0.0.0:7000 --join "${NETS[0]}.2:7000" --key ../run.key --out p2 > p2.log 2>&1 &
wait
for i in 1 2 3; do [ -f "p$i/summary.json" ] || { tail -n 20 "p$i.log"; fail "second reachable peer: peer $i did not finish"; }; done
d3=$(digest p3)
[ -n "$d3" ] && [ "$(digest p1)" = "$d3" ] && [ "$(digest p2)" = "$d3" ] || fail "second reachable peer: the survivors ended with different parameters"
[ "$(summary_num p3 relay_forwarded_bytes)" -gt 0 ] || fail "second reachable peer: it relayed nothing after the first died"
echo "netns: the first reachable peer died; the second relayed for the two behind NAT and all three finished with the same parameters"
