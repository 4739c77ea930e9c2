#!/usr/bin/env bash
# Bad input at the command line, as new users type it: every case must end with the documented exit
# code (2 bad input, 0 nothing to do) and one message that names the option or key and what to do,
# without a stack trace, an "internal error" or a limit nobody typed; and no result may be lost: a
# refused command leaves every file of an earlier run byte for byte as it was.
# Usage: bad_inputs_test.sh path/to/gossamer
set -u
G="$1"
name=bad-inputs
source "$(dirname "$0")/bad_inputs_lib.sh"
# Copies a folder's files aside, to check later that a refused command left them alone.
snapshot() { rm -rf "$tmp/snap"; cp -a "$1" "$tmp/snap"; }
unchanged() { diff -r "$tmp/snap" "$1" >/dev/null || { diff -r "$tmp/snap" "$1"; fail "$2: the run folder changed"; }; }

TINY=(--set model.layers=1 --set model.width=32 --set model.heads=2 --set model.context=16
      --set data.synthetic.bytes=40000 --set train.batch_size=4 --set train.steps=12
      --set train.warmup_steps=2 --set train.eval_every=4 --set train.eval_batches=2)
PEERTINY=("${TINY[@]}" --set diloco.inner_steps=4)
SIMTINY=("${TINY[@]}" --set sim.workers=2 --set sim.compute=fixed --set diloco.inner_steps=4 --set noloco.inner_steps=4)

# --- Commands and options typed wrong.
run 2 "$G" trian
says "unknown command 'trian'"; says "did you mean 'train'"
run 2 "$G" comapre --out "$tmp/x"
says "did you mean 'compare'"
run 2 "$G" frobnicate
says "unknown command 'frobnicate'"
run 2 "$G" train --stop-at 0 --out "$tmp/x"
says "--stop-at"; says "expected an integer in [1,"
run 2 "$G" train --stop-at 1.5 --out "$tmp/x"
says "'1.5' is not an integer"
run 2 "$G" train --stop-at abc --out "$tmp/x"
says "--stop-at"
[ -e "$tmp/x" ] && fail "a refused command must not create its run folder"

# --- Numbers: NaN, infinity and out-of-range values are refused with the allowed range.
run 2 "$G" train --set train.lr=nan --out "$tmp/x"
says "train.lr"
run 2 "$G" config --set train.lr=inf
says "train.lr"
run 2 "$G" config --set model.init_seed=-1
says "an integer >= 0"
run 2 "$G" sim "${SIMTINY[@]}" --target-loss nan --out "$tmp/x"
says "--target-loss"; says "not a finite number"
run 2 "$G" sim "${SIMTINY[@]}" --target-loss -1 --out "$tmp/x"
says "expected a number > 0"
run 2 "$G" compare "${SIMTINY[@]}" --target-loss 0 --out "$tmp/x"
says "--target-loss"
run 2 "$G" plan --params nan
says "--params"
run 2 "$G" plan --params inf
says "--params"
run 2 "$G" plan --layers 0
says "--layers"
run 2 "$G" plan --utilization 1.5
says "--utilization"; says "[0.01, 0.9999]"
run 2 "$G" plan --step-time -0.1
says "--step-time"
run 2 "$G" bench quant --min-time nan
says "--min-time"
run 2 "$G" bench quant --elements -5
says "--elements"
run 2 "$G" bench quant --elements 1e3
says "not an integer"
run 2 "$G" peer --set model.layers=1 --join-timeout nan --out "$tmp/x"
says "--join-timeout"
run 2 "$G" peer --set model.layers=1 --dead-after inf --out "$tmp/x"
says "--dead-after"
# Peer options that contradict each other, or a drill that could never fire: refused before anything starts.
run 2 "$G" peer "${PEERTINY[@]}" --listen 127.0.0.1:0 --join 127.0.0.1:7 --outbound-only --advertise 198.51.100.7 --out "$tmp/x"
says "--outbound-only"; says "--advertise"
run 2 "$G" peer "${PEERTINY[@]}" --listen 127.0.0.1:0 --outbound-only --out "$tmp/x"
says "the first peer of a run must accept connections"
run 2 "$G" peer "${PEERTINY[@]}" --listen 127.0.0.1:0 --crash-at-step 100 --out "$tmp/x"
says "--crash-at-step 100 is past the run's last step (train.steps = 12)"
# Options that would do nothing where they were given: refused, naming where they apply.
run 2 "$G" peer --listen 127.0.0.1:0 --join 127.0.0.1:7 --wait-for 3 --out "$tmp/x"
says "--wait-for applies to \`peer without --join\` only"
run 2 "$G" peer "${PEERTINY[@]}" --listen 127.0.0.1:0 --join-timeout 5 --out "$tmp/x"
says "--join-timeout applies to \`peer --join\` only"
run 2 "$G" train "${TINY[@]}" --stop-at 12 --out "$tmp/x"
says "--stop-at 12 is not before the run's end (train.steps = 12)"
[ -e "$tmp/x" ] && fail "a refused peer must not create its run folder"

# --- Strings: a path that looks like a number is a path.
run 2 "$G" train "${TINY[@]}" --set data.path=123 --out "$tmp/x"
says "data.path"; says "123"
grep -qF "wrong type" "$tmp/out" && fail "data.path=123 taken for an integer"
# Data that is not text is trained on as bytes, with a warning that gives the figure.
head -c 60000 /dev/urandom > "$tmp/random.bin"
run 0 "$G" train "${TINY[@]}" --set data.path="$tmp/random.bin" --out "$tmp/rnd"
says "does not look like text"
head -c 60000 /dev/zero > "$tmp/zeros.bin"
run 0 "$G" train "${TINY[@]}" --set data.path="$tmp/zeros.bin" --out "$tmp/zeros"
says "100.0% of its bytes are NUL or control characters"

# --- Addresses: refused within a second of start, before anything starts. Loading LibTorch alone
# takes most of a second here, so the second is counted from a bare start (`--version`, fastest of 3).
startup_ms=100000
for i in 1 2 3; do
  start=$(date +%s%N); "$G" --version >/dev/null 2>&1; ms=$(( ($(date +%s%N) - start) / 1000000 ))
  [ "$ms" -lt "$startup_ms" ] && startup_ms=$ms
done
limit_ms=$((startup_ms + 1000))
for addr in 127.0.0.1 127.0.0.1:abc 127.0.0.1:99999 not:an:addr 127.0.0.1:0 0.0.0.0:7000 "" "[::1"; do
  start=$(date +%s%N)
  run 2 "$G" peer --set model.layers=1 --join "$addr" --out "$tmp/x"
  says "--join"
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  [ "$ms" -lt "$limit_ms" ] || fail "--join '$addr' took $ms ms to refuse (a bare start takes $startup_ms ms)"
done
for addr in 127.0.0.1:70000 127.0.0.1:99999 127.0.0.1 host_name:7000; do
  run 2 "$G" peer --set model.layers=1 --listen "$addr" --out "$tmp/x"
  says "--listen"
done
start=$(date +%s%N)
run 2 "$G" peer "${PEERTINY[@]}" --join nosuchhost.invalid:7000 --out "$tmp/x"
says "cannot be resolved"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$ms" -lt "$limit_ms" ] || fail "an unresolvable --join took $ms ms to refuse (a bare start takes $startup_ms ms)"
# An address that is not this machine's: refused when gossip cannot bind it.
start=$(date +%s%N)
run 2 "$G" peer "${PEERTINY[@]}" --listen 192.0.2.250:7000 --out "$tmp/notmine"
says "--listen 192.0.2.250:7000"; says "cannot listen there"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$ms" -lt "$limit_ms" ] || fail "a foreign --listen address took $ms ms to refuse (a bare start takes $startup_ms ms)"

run 2 "$G" peer "${PEERTINY[@]}" --listen 127.0.0.1:0 --advertise 192.0.2.9:9000 --out "$tmp/x"
says "--advertise needs fixed ports"
run 2 "$G" peer "${PEERTINY[@]}" --listen 127.0.0.1:7300 --link-port 7300 --out "$tmp/x"
says "--link-port 7300"
run 2 "$G" peer "${PEERTINY[@]}" --listen 127.0.0.1:65535 --out "$tmp/x"
says "--link-port"
run 2 "$G" peer "${PEERTINY[@]}" --set outer.method=ddp --set ddp.engine=gloo --listen 0.0.0.0:0 --out "$tmp/x"
says "gloo"
# ddp on NCCL in a build without it (LibTorch without CUDA): refused before anything starts.
if ! "$G" --version | grep -q "ddp engines built:.*nccl"; then
  run 2 "$G" peer "${PEERTINY[@]}" --set outer.method=ddp --set ddp.engine=nccl --listen 127.0.0.1:0 --out "$tmp/nccl"
  says "this build has no NCCL"; says "ddp.engine = links or gloo"
  [ ! -e "$tmp/nccl" ] || fail "a refused ddp.engine = nccl left a run folder"
fi
run 2 "$G" sim "${SIMTINY[@]}" --set outer.method=ddp --set ddp.engine=nccl
says "nccl are for real peers"
# A links port already taken by another program: refused at start, naming the way out.
busy_port=$(( 20000 + RANDOM % 20000 ))
"$G" peer "${PEERTINY[@]}" --listen 127.0.0.1:0 --link-port "$busy_port" --wait-for 2 --out "$tmp/holder" > "$tmp/holder.log" 2>&1 &
holder=$!
for i in $(seq 1 100); do grep -qF "waiting for" "$tmp/holder.log" 2>/dev/null && break; sleep 0.05; done
run 2 "$G" peer "${PEERTINY[@]}" --listen 127.0.0.1:$((busy_port - 1)) --out "$tmp/x"
says "in use"; says "--link-port"
kill -9 "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
[ -e "$tmp/x" ] && fail "a refused command must not create its run folder"

# --- Settings that make a run do nothing.
run 2 "$G" sim "${SIMTINY[@]}" --set diloco.inner_steps=100 --out "$tmp/x"
says "never synchronize"; says "diloco.inner_steps"
run 2 "$G" compare "${SIMTINY[@]}" --methods noloco --set noloco.inner_steps=13 --out "$tmp/x"
says "noloco.inner_steps"
# A fragment larger than the model is legitimate (one fragment, the whole model) but said plainly.
run 0 "$G" sim "${SIMTINY[@]}" --set outer.method=streaming_diloco --set streaming_diloco.fragment_layers=3 --set streaming_diloco.inner_steps=4 --out "$tmp/onefrag"
says "streaming_diloco.fragment_layers (3) exceeds model.layers (1)"
run 2 "$G" peer "${PEERTINY[@]}" --set diloco.inner_steps=13 --out "$tmp/x"
says "never synchronize"
[ -e "$tmp/x" ] && fail "a refused command must not create its run folder"

# --- Memory: a configuration that cannot fit is one error with the figures, before allocating.
run 2 "$G" train --set model.context=65536 --out "$tmp/x"
says "memory"; says "model.context"
run 2 "$G" train --set model.width=65536 --set model.heads=1 --out "$tmp/x"
says "memory"; says "parameters"
run 2 "$G" train --set train.batch_size=2000000000 --out "$tmp/x"
says "train.batch_size"
run 2 "$G" sim --set model.width=16384 --set sim.workers=64 --out "$tmp/x"
says "64 workers"
[ -e "$tmp/x" ] && fail "a refused command must not create its run folder"

# --- keygen and empty --out.
run 2 "$G" keygen --out "$tmp/nodir/run.key"
says "$tmp/nodir"; says "does not exist"
run 2 "$G" keygen --out ""
says "--out is empty"
mkdir -p "$tmp/keys"
run 2 "$G" keygen --out "$tmp/keys"
says "is a folder"
run 2 "$G" train "${TINY[@]}" --out ""
says "--out is empty"

# --- Run folders: never written into by another command, never lost.
run 0 "$G" train "${TINY[@]}" --out "$tmp/run"
[ -f "$tmp/run/summary.json" ] || fail "the tiny run did not finish"
snapshot "$tmp/run"
# Resuming a finished run: nothing to do, nothing changed.
run 0 "$G" train --out "$tmp/run" --resume
says "nothing to do"
unchanged "$tmp/run" "resume of a finished run"
# The newer commands: a run's own files are never written over, not even with --force; another
# existing file only with --force; numbers that are not finite refused.
run 2 "$G" export --from "$tmp/run" --out "$tmp/run/checkpoint.bin" --force
says "is a file of the run in"; says "choose another name"
unchanged "$tmp/run" "export over the run's checkpoint"
run 2 "$G" export --from "$tmp/run" --out "$tmp/run/summary.json" --force
unchanged "$tmp/run" "export over the run's summary"
run 2 "$G" sample --from "$tmp/run" --prompt "a" --temperature nan
says "--temperature"; says "not a finite number"
run 2 "$G" sample --from "$tmp/run" --prompt "a" --temperature inf
says "--temperature"
echo "not a schedule" > "$tmp/kept.bin"
run 2 "$G" schedule --nodes 20 --gcma-trials 10 --out "$tmp/kept.bin"
says "already exists: pass --force"
[ "$(cat "$tmp/kept.bin")" = "not a schedule" ] || fail "schedule wrote over an existing file without --force"
run 2 "$G" schedule --nodes 20 --gcma-trials 10 --out "$tmp/run/run.json" --force
unchanged "$tmp/run" "schedule over the run's run.json"
run 0 "$G" schedule --nodes 20 --gcma-trials 10 --out "$tmp/kept.bin" --force
says "wrote"
echo "not a schedule" | cmp -s - "$tmp/kept.bin" && fail "schedule --force did not replace the file"
# Fewer steps than the checkpoint: refused.
run 2 "$G" train --out "$tmp/run" --resume --set train.steps=5
says "cannot go backwards"
unchanged "$tmp/run" "resume backwards"
# Another model shape through --set: refused, naming the key.
run 2 "$G" train --out "$tmp/run" --resume --set model.width=64 --set train.steps=20
says "model.width"
unchanged "$tmp/run" "resume with another width"
# Another data set through --set: refused.
run 2 "$G" train --out "$tmp/run" --resume --set data.synthetic.seed=7 --set train.steps=20
says "data.synthetic.seed"
unchanged "$tmp/run" "resume with other data"
# A checkpoint of another shape copied into the folder: refused, config.toml kept.
run 0 "$G" train "${TINY[@]}" --set model.width=64 --out "$tmp/other" --stop-at 3
cp "$tmp/other/checkpoint.bin" "$tmp/run/checkpoint.bin"
snapshot "$tmp/run"
run 2 "$G" train --out "$tmp/run" --resume --set train.steps=20
says "belongs to another run"; says "model.width"
unchanged "$tmp/run" "resume of a foreign checkpoint"
# sim, compare and peer never write into a train run.
run 2 "$G" sim "${SIMTINY[@]}" --out "$tmp/run"
says "holds a \`gossamer train\` run"
run 2 "$G" compare "${SIMTINY[@]}" --methods ddp --out "$tmp/run"
says "holds a \`gossamer train\` run"
run 2 "$G" peer "${PEERTINY[@]}" --out "$tmp/run"
says "holds a \`gossamer train\` run"
unchanged "$tmp/run" "other commands on a train folder"
# A folder with someone else's files in it.
mkdir -p "$tmp/mine" && echo "notes" > "$tmp/mine/notes.txt"
run 2 "$G" train "${TINY[@]}" --out "$tmp/mine"
says "other files"
echo "x" > "$tmp/afile"
run 2 "$G" sim "${SIMTINY[@]}" --out "$tmp/afile"
says "is a file"

# compare: repeated methods, and an earlier comparison kept.
run 2 "$G" compare "${SIMTINY[@]}" --methods ddp,ddp --out "$tmp/x"
says "twice"
run 0 "$G" compare "${SIMTINY[@]}" --methods ddp --out "$tmp/cmp"
snapshot "$tmp/cmp"
run 2 "$G" compare "${SIMTINY[@]}" --methods noloco --out "$tmp/cmp"
says "already holds a run"
run 2 "$G" sim "${SIMTINY[@]}" --out "$tmp/cmp"
says "holds a \`gossamer compare\` run"
run 2 "$G" train --out "$tmp/cmp" --resume
says "nothing to resume"
unchanged "$tmp/cmp" "commands on a comparison"
# An empty folder, or one where a run failed before writing results, may be used.
mkdir -p "$tmp/empty"
run 0 "$G" sim "${SIMTINY[@]}" --out "$tmp/empty"
[ -f "$tmp/empty/summary.json" ] || fail "sim into an empty folder wrote no summary"
[ -e "$tmp/notmine" ] && fail "a peer refused for its --listen address created its run folder"
run 1 "$G" peer --listen 127.0.0.1:0 --join 127.0.0.1:9 --join-timeout 1 --out "$tmp/failed"
says "no run spec heard"
[ -f "$tmp/failed/run.json" ] || fail "the failed peer left no run marker"
run 1 "$G" peer --listen 127.0.0.1:0 --join 127.0.0.1:9 --join-timeout 1 --out "$tmp/failed"
says "no run spec heard"

# --- Nothing hangs: a peer waiting for others, or for the run spec, stops at Ctrl-C or SIGTERM.
wait_exit() {  # wait_exit PID LOG SIGNAL WHAT: sends SIGNAL once LOG says WHAT, expects exit 130 within 2 s
  local pid=$1 log=$2 sig=$3 what=$4 i
  for i in $(seq 1 200); do grep -qF "$what" "$log" 2>/dev/null && break; sleep 0.05; done
  grep -qF "$what" "$log" || { cat "$log"; kill -9 "$pid"; fail "the peer never said '$what'"; }
  local start; start=$(date +%s%N)
  kill -"$sig" "$pid"
  wait "$pid"; local code=$?
  local ms=$(( ($(date +%s%N) - start) / 1000000 ))
  cases=$((cases + 1))
  [ "$code" -eq 130 ] || { cat "$log"; fail "after SIG$sig while '$what' the peer exited $code, expected 130"; }
  [ "$ms" -lt 2000 ] || fail "after SIG$sig while '$what' the peer took $ms ms to exit"
}
"$G" peer "${PEERTINY[@]}" --listen 127.0.0.1:0 --wait-for 2 --out "$tmp/first" > "$tmp/first.log" 2>&1 &
wait_exit $! "$tmp/first.log" INT "waiting for 2 peer(s)"
"$G" peer "${PEERTINY[@]}" --listen 127.0.0.1:0 --wait-for 2 --out "$tmp/first2" > "$tmp/first2.log" 2>&1 &
wait_exit $! "$tmp/first2.log" TERM "waiting for 2 peer(s)"
"$G" peer --listen 127.0.0.1:0 --join 127.0.0.1:9 --out "$tmp/joiner" > "$tmp/joiner.log" 2>&1 &
wait_exit $! "$tmp/joiner.log" TERM "gossip on"
# Fetching the state of a run under way (its members offer it at their next round, far off here),
# then the member training.
addr_of() { for i in $(seq 1 200); do [ -s "$1/address" ] && break; sleep 0.05; done; head -n 1 "$1/address"; }
"$G" peer "${TINY[@]}" --set train.steps=1000000 --set diloco.inner_steps=1000000 --set train.eval_every=1000000 --listen 127.0.0.1:0 \
  --out "$tmp/long" > "$tmp/long.log" 2>&1 &
long=$!
addr=$(addr_of "$tmp/long")
for i in $(seq 1 200); do grep -qF "training on shard" "$tmp/long.log" 2>/dev/null && break; sleep 0.05; done
"$G" peer --listen 127.0.0.1:0 --join "$addr" --out "$tmp/fetching" > "$tmp/fetching.log" 2>&1 &
wait_exit $! "$tmp/fetching.log" INT "fetching its state to join"
wait_exit "$long" "$tmp/long.log" TERM "training on shard"
[ -f "$tmp/long/checkpoint.bin" ] || fail "a peer stopped while training left no checkpoint"
# Finishing: waiting for the other members at the end. The other member is frozen (SIGSTOP) after its
# last round, in the local steps that follow it, so this one waits for it (its failure detector
# patient: --dead-after 60).
FIN=("${TINY[@]}" --set train.steps=1000 --set diloco.inner_steps=300 --set train.eval_every=1000 --set train.round_timeout_s=60)
"$G" peer "${FIN[@]}" --listen 127.0.0.1:0 --wait-for 2 --dead-after 60 --out "$tmp/fin0" > "$tmp/fin0.log" 2>&1 &
fin0=$!
addr=$(addr_of "$tmp/fin0")
"$G" peer --listen 127.0.0.1:0 --join "$addr" --out "$tmp/fin1" > "$tmp/fin1.log" 2>&1 &
fin1=$!
for i in $(seq 1 1200); do grep -qF '"rounds":3' "$tmp/fin1/metrics.jsonl" 2>/dev/null && break; sleep 0.05; done
kill -STOP "$fin1"
wait_exit "$fin0" "$tmp/fin0.log" INT "step 1000/1000"
grep -qF "stopped while finishing" "$tmp/fin0.log" || { cat "$tmp/fin0.log"; fail "a peer stopped while finishing did not say so"; }
[ -f "$tmp/fin0/summary.json" ] || fail "a peer stopped while finishing wrote no summary"
kill -9 "$fin1"; wait "$fin1" 2>/dev/null

# A simulation interrupted: exit 130, no results, and the same --out may be used again.
"$G" sim "${SIMTINY[@]}" --set train.steps=100000 --set train.warmup_steps=2 --out "$tmp/simint" > "$tmp/simint.log" 2>&1 &
simpid=$!
for i in $(seq 1 200); do grep -qF "data:" "$tmp/simint.log" 2>/dev/null && break; sleep 0.05; done
# A second command given the same --out while the first runs: refused, the first goes on.
run 2 "$G" sim "${SIMTINY[@]}" --out "$tmp/simint"
says "in use by another running gossamer command"
wait_exit "$simpid" "$tmp/simint.log" INT "data:"
[ -e "$tmp/simint/summary.json" ] && fail "an interrupted simulation wrote a summary"
grep -qF "gossamer: interrupted" "$tmp/simint.log" || fail "the interrupted simulation did not say so"

# A second stop signal while the first one's graceful stop is under way (it waits for the step in
# progress) ends the command at once, with 130 and a line saying so. SIGINT then SIGTERM: two
# signals of one kind sent back to back may be delivered as one.
"$G" train --set train.steps=100000 --set model.width=256 --set model.layers=4 --set train.batch_size=64 --out "$tmp/twice" > "$tmp/twice.log" 2>&1 &
twice=$!
for i in $(seq 1 300); do grep -qF "step 1/" "$tmp/twice.log" 2>/dev/null && break; sleep 0.1; done
kill -INT "$twice"; kill -TERM "$twice"
wait "$twice"; code=$?
cases=$((cases + 1))
[ "$code" -eq 130 ] || { cat "$tmp/twice.log"; fail "a second Ctrl-C: exit $code, expected 130"; }
grep -qF "interrupted again" "$tmp/twice.log" || { cat "$tmp/twice.log"; fail "a second Ctrl-C did not end the command at once"; }

echo "bad inputs: all $cases cases passed"
