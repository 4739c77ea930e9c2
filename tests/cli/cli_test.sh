#!/usr/bin/env bash
# End-to-end checks of the `gossamer` command: help, exit codes and messages for bad configuration,
# a short run stopped and resumed, training on a text file, and the config round trip.
# Usage: cli_test.sh path/to/gossamer
set -u
G="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run EXPECTED_CODE command...
  local want=$1; shift
  "$@" >"$tmp/out" 2>&1
  local got=$?
  if [ "$got" -ne "$want" ]; then cat "$tmp/out"; fail "exit code $got, expected $want: $*"; fi
}
says() { grep -qF -- "$1" "$tmp/out" || { cat "$tmp/out"; fail "output lacks '$1'"; }; }

TINY=(--set model.layers=1 --set model.width=32 --set model.heads=2 --set model.context=16
      --set data.synthetic.bytes=40000 --set train.batch_size=4 --set train.steps=12
      --set train.warmup_steps=2 --set train.eval_every=4 --set train.eval_batches=2)

run 0 "$G" --help
says "train"
run 0 "$G" train --help
says "--resume"
run 0 "$G" config --keys
says "model.layers"
run 2 "$G" nosuchcommand
# A device that is not there is exit 2 naming the key (no CUDA here, or not 65 GPUs there).
run 2 "$G" train "${TINY[@]}" --set train.device=cuda:64 --out "$tmp/nodevice"
says "train.device = cuda:64"
run 2 "$G" train "${TINY[@]}" --set train.device=gpu --out "$tmp/nodevice"
says "use auto, cpu, cuda or cuda:N"

# gossamer peer: help, and what a user must fix is exit code 2 with a message saying what to do.
run 0 "$G" peer --help
says "--join"; says "--resume"
run 2 "$G" peer --out "$tmp/peer"
says "pass --config"
run 2 "$G" peer --set model.layers=1 --shape fast --out "$tmp/peer"
says "--shape fast"
run 2 "$G" peer "${TINY[@]}" --set outer.method=local --out "$tmp/peer-local"
says "use gossamer train"
run 2 "$G" peer --resume --out "$tmp/peer-none"
says "nothing to resume"
run 2 "$G" peer "${TINY[@]}" --dead-after 0.1 --out "$tmp/peer-quick"
says "--dead-after"

# Bad configuration: exit code 2 and one message naming the key and what is allowed.
run 2 "$G" train --set model.layerz=3 --out "$tmp/a"
says "model.layerz"; says "did you mean 'model.layers'"
run 2 "$G" train --set model.layers=0 --out "$tmp/a"
says "model.layers"; says "[1, 256]"
run 2 "$G" train --set train.lr=fast --out "$tmp/a"
says "train.lr"; says "wrong type"
run 2 "$G" train --config "$tmp/missing.toml" --out "$tmp/a"
says "missing.toml"
printf '[model]\nlayers = = 2\n' > "$tmp/bad.toml"
run 2 "$G" train --config "$tmp/bad.toml" --out "$tmp/a"
says "bad.toml:2"
run 2 "$G" train --set model.heads=3 --out "$tmp/a"
says "divisible"
[ -e "$tmp/a" ] && fail "a failed config must not create the run folder"

# A run stopped at step 5 and resumed to the end.
run 0 "$G" train "${TINY[@]}" --out "$tmp/run" --stop-at 5
says "--resume"
[ -f "$tmp/run/checkpoint.bin" ] || fail "no checkpoint after --stop-at"
[ -f "$tmp/run/summary.json" ] && fail "summary.json written for an unfinished run"
run 2 "$G" train "${TINY[@]}" --out "$tmp/run"
says "already holds a run"
run 0 "$G" train --out "$tmp/run" --resume
says "done: 12 steps"
[ "$(wc -l < "$tmp/run/metrics.jsonl")" -eq 12 ] || fail "metrics.jsonl should hold 12 lines"
grep -q '"val_loss"' "$tmp/run/metrics.jsonl" || fail "no val_loss in metrics"
grep -q '"entropy_floor"' "$tmp/run/summary.json" || fail "no entropy_floor in summary"
run 2 "$G" train --out "$tmp/nothing" --resume
says "nothing to resume"
# A corrupted checkpoint is refused with a clear message.
printf 'XXXX' | dd of="$tmp/run/checkpoint.bin" bs=1 seek=100 conv=notrunc status=none
run 1 "$G" train --out "$tmp/run" --resume --set train.steps=20
says "corrupted"

# Training on a text file.
for i in $(seq 1 400); do echo "the quick brown fox $i jumps over the lazy dog"; done > "$tmp/corpus.txt"
run 0 "$G" train "${TINY[@]}" --set data.path="$tmp/corpus.txt" --out "$tmp/text"
says "corpus.txt"
run 2 "$G" train "${TINY[@]}" --set data.path="$tmp/none.txt" --out "$tmp/text2"
says "none.txt"
[ -e "$tmp/text2" ] && fail "a missing corpus must not create the run folder"

# The printed config loads back to the same config.
"$G" config --set model.layers=3 --set train.lr=0.00025 > "$tmp/c.toml" || fail "config failed"
"$G" config --config "$tmp/c.toml" > "$tmp/c2.toml" || fail "config --config failed"
diff -q "$tmp/c.toml" "$tmp/c2.toml" >/dev/null || fail "config does not round-trip"
cmp -s "$tmp/c.toml" "$tmp/run/config.toml" && fail "config.toml should hold the run's own config"
# The codec benchmark runs and prints its table.
run 0 "$G" bench quant --elements 4096 --min-time 0.01 --no-naive
says "| fp4_e2m1 | 4.250 |"
says "memcpy of the same buffer"

# The transport benchmark runs end to end (small sizes).
run 0 "$G" bench transport --rounds 1 --message-mib 1 --gossip-peers 4
says "ratio"
says "gossip: 4 peers reached full membership"

# Simulation: one method, then a comparison, each with its summary and report.
SIMTINY=("${TINY[@]}" --set sim.workers=2 --set sim.compute=fixed --set diloco.inner_steps=4 --set noloco.inner_steps=4)
run 0 "$G" compare --help
says "--methods"
run 2 "$G" compare --methods ddp,sgd --out "$tmp/cmpbad"
says "sgd"
run 2 "$G" sim "${SIMTINY[@]}" --set sim.crash_worker=5 --out "$tmp/simbad"
says "sim.crash_worker"
run 0 "$G" sim "${SIMTINY[@]}" --set outer.method=diloco --out "$tmp/sim"
says "report:"
grep -q '"time_to_target_s"' "$tmp/sim/summary.json" || fail "sim: summary.json lacks time_to_target_s"
[ -s "$tmp/sim/diloco/metrics.jsonl" ] || fail "sim: no metrics.jsonl"
run 0 "$G" sim "${SIMTINY[@]}" --set sim.workers=3 --set sim.join_worker=2 --set sim.join_at_step=5 --set sim.sites=2 --out "$tmp/simjoin"
says "joined at round"
grep -q '"state_bytes_received"' "$tmp/simjoin/diloco/metrics.jsonl" || fail "sim: the newcomer's state transfer is not in its metrics"
run 2 "$G" sim "${SIMTINY[@]}" --set sim.join_worker=1 --set sim.join_at_step=1 --out "$tmp/simbad"
says "sim.join_at_step"
run 0 "$G" compare "${SIMTINY[@]}" --methods ddp,noloco --out "$tmp/cmp"
says "ddp"; says "noloco"; says "x less"
grep -q '<svg' "$tmp/cmp/report.html" || fail "compare: report.html has no chart"

# The plan: Table 4 within 25%, and a plan for a given model.
run 0 "$G" plan --table4
says "largest difference"
worst=$(grep -o 'largest difference: [0-9]*' "$tmp/out" | grep -o '[0-9]*$')
[ "$worst" -le 25 ] || fail "plan: Table 4 off by $worst%"
run 0 "$G" plan --params 1e8 --layers 12 --workers 8 --inner-steps 100
says "streaming_diloco"
run 2 "$G" plan --codec fp7

# SkipPipe: the scheduler's modes side by side, and a pipeline trained in one process.
run 0 "$G" schedule --help
says "--path-length"
run 0 "$G" schedule --gcma-trials 200
says "skippipe-noca"; says "pipeline-full"; says "hash"
run 2 "$G" schedule --nodes 4 --stages 6
says "--nodes must be at least --stages"
run 0 "$G" pipeline --help
says "--omit"
PIPETINY=(--set model.layers=3 --set model.width=16 --set model.heads=2 --set model.context=16 --set data.synthetic.bytes=40000
          --set train.batch_size=2 --set train.steps=3 --set train.warmup_steps=1 --set train.eval_every=3 --set train.eval_batches=2
          --set pipeline.nodes=8 --set pipeline.stages=3 --set pipeline.path_length=2 --set pipeline.mbs_per_origin=2
          --set pipeline.mbs_per_agent=1 --set pipeline.gcma_trials=50)
run 0 "$G" pipeline "${PIPETINY[@]}" --omit 2 --out "$tmp/pipe"
says "left out"
grep -q '"omitted_val_loss"' "$tmp/pipe/summary.json" || fail "pipeline: summary.json lacks omitted_val_loss"
grep -q '"val_loss_as_trained"' "$tmp/pipe/summary.json" || fail "pipeline: summary.json lacks the unscaled loss"
says "pipeline.depth_scaling"  # a skipping run's model is depth-scaled, and says so
# Its model: sampled and exported as a trained run's.
run 0 "$G" sample --from "$tmp/pipe" --prompt "ab" --tokens 12 --temperature 0
run 0 "$G" export --from "$tmp/pipe" --out "$tmp/pipe.safetensors"
run 2 "$G" pipeline "${PIPETINY[@]}" --set pipeline.network=measured --out "$tmp/pipemeasured"
says "run it with --node"
[ -e "$tmp/pipemeasured" ] && fail "a refused pipeline left a folder"
run 2 "$G" sim --pipeline "${PIPETINY[@]}" --set pipeline.network=measured --out "$tmp/simmeasured"
says "--set pipeline.network=geo"
[ -e "$tmp/simmeasured" ] && fail "a refused simulation left a folder"
run 2 "$G" pipeline "${PIPETINY[@]}" --omit 0 --out "$tmp/pipebad"
says "--omit"
run 2 "$G" pipeline "${PIPETINY[@]}" --set model.layers=4 --out "$tmp/pipebad2"
says "divisible by pipeline.stages"
# Pipelines across processes: what a node must be given.
run 2 "$G" pipeline "${PIPETINY[@]}" --node 0 --out "$tmp/pipenode0"
says "addresses"
run 2 "$G" pipeline "${PIPETINY[@]}" --node 0 --addresses 127.0.0.1:1,127.0.0.1:2 --out "$tmp/pipenode1"
says "pipeline.nodes is 8"
run 2 "$G" pipeline "${PIPETINY[@]}" --node 9 --addresses 127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4,127.0.0.1:5,127.0.0.1:6,127.0.0.1:7,127.0.0.1:8 --out "$tmp/pipenode2"
says "use 0 .. 7"
run 2 "$G" pipeline "${PIPETINY[@]}" --node 0 --addresses 127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4,127.0.0.1:5,127.0.0.1:6,127.0.0.1:7,127.0.0.1:8 --shape fast --out "$tmp/pipenode3"
says "MBIT,MS"
# Pipelines in the simulator: the variants side by side, and one alone.
run 0 "$G" compare --methods pipeline-full,skippipe-cbs "${PIPETINY[@]}" --out "$tmp/pipecmp"
says "predicted"; says "skippipe-cbs"
grep -q 'skippipe-cbs: the first iteration' "$tmp/pipecmp/report.html" || fail "compare: the pipeline report lacks its timeline"
grep -q '"predicted_makespan_s"' "$tmp/pipecmp/summary.json" || fail "compare: summary.json lacks the pipeline's makespans"
run 2 "$G" compare --methods ddp,skippipe-cbs --out "$tmp/pipemix"
says "compare them in two runs"
run 0 "$G" sim --pipeline "${PIPETINY[@]}" --set pipeline.mode=noca --out "$tmp/pipesim"
[ -f "$tmp/pipesim/skippipe-noca/metrics.jsonl" ] || fail "sim --pipeline: no metrics for skippipe-noca"
run 2 "$G" sim --pipeline "${PIPETINY[@]}" --set pipeline.network=moon --out "$tmp/pipesim2"
says "geo-fixed"
# A config peers run as a pipeline is simulated as one without --pipeline, with the same losses.
run 0 "$G" sim "${PIPETINY[@]}" --set pipeline.mode=noca --set pipeline.enabled=true --out "$tmp/pipesim3"
[ -f "$tmp/pipesim3/skippipe-noca/metrics.jsonl" ] || fail "sim with pipeline.enabled: no pipeline metrics"
[ "$(grep -o '"val_loss":[0-9.e+-]*' "$tmp/pipesim3/skippipe-noca/metrics.jsonl")" = "$(grep -o '"val_loss":[0-9.e+-]*' "$tmp/pipesim/skippipe-noca/metrics.jsonl")" ] ||
  fail "sim with pipeline.enabled: other losses than sim --pipeline"
# `gossamer peer` with a pipeline config: the outer method's rules do not apply, and the help says
# what --wait-for means for it.
run 0 "$G" peer --help
says "pipeline.enabled"

echo "cli: all checks passed"
