#!/usr/bin/env bash
# Bad input to the commands that use or prepare runs (pipeline, schedule, sample, export, bench, plan,
# keygen, config), a section per command, as bad_inputs_test.sh does for train, sim, compare and
# peer. Every case must end with the documented exit code (2 bad input) and one message that names
# the option or key and what to do, without a stack trace or an "internal error"; an option that
# would do nothing for what was asked is refused, naming where it applies; and no command may touch
# the files of a run: each run folder is compared byte for byte before and after.
# Usage: bad_inputs_commands_test.sh path/to/gossamer
set -u
G="$1"
name=bad-commands
source "$(dirname "$0")/bad_inputs_lib.sh"
snapshot() { rm -rf "$tmp/snap.$2"; cp -a "$1" "$tmp/snap.$2"; }
unchanged() { diff -r "$tmp/snap.$2" "$1" >/dev/null || { diff -r "$tmp/snap.$2" "$1"; fail "$3: the run folder $1 changed"; }; }
absent() { [ ! -e "$1" ] || fail "$2: a refused command created $1"; }

TINY=(--set model.layers=1 --set model.width=32 --set model.heads=2 --set model.context=16
      --set data.synthetic.bytes=40000 --set train.batch_size=4 --set train.steps=12
      --set train.warmup_steps=2 --set train.eval_every=4 --set train.eval_batches=2)
PIPE=(--set model.layers=2 --set model.width=32 --set model.heads=2 --set model.context=16
      --set data.synthetic.bytes=40000 --set train.batch_size=2 --set train.steps=2 --set train.warmup_steps=1
      --set train.eval_every=2 --set train.eval_batches=1 --set pipeline.nodes=4 --set pipeline.stages=2
      --set pipeline.path_length=2 --set pipeline.gcma_trials=10)

# Runs whose folders every section below must leave alone.
run 0 "$G" train "${TINY[@]}" --out "$tmp/run"
run 0 "$G" pipeline "${PIPE[@]}" --out "$tmp/pipe"
[ -f "$tmp/pipe/checkpoint.bin" ] || fail "the tiny pipeline kept no model"
run 0 "$G" sim "${TINY[@]}" --set sim.workers=2 --set diloco.inner_steps=4 --out "$tmp/sim"
snapshot "$tmp/run" run; snapshot "$tmp/pipe" pipe; snapshot "$tmp/sim" sim

# --- pipeline: checked before anything is written, memory included.
run 2 "$G" pipeline --out "$tmp/x"
says "model.layers (2) must be divisible by pipeline.stages (6)"; says "--set model.layers=6"
run 2 "$G" pipeline "${PIPE[@]}" --set pipeline.path_length=3 --out "$tmp/x"
says "pipeline.path_length (3) must be at most pipeline.stages (2)"
run 2 "$G" pipeline "${PIPE[@]}" --set model.kind=torchscript --set model.path="$tmp/none.pt" --out "$tmp/x"
says "model.kind = gpt"
run 2 "$G" pipeline "${PIPE[@]}" --set train.batch_size=200000 --out "$tmp/x"
says "memory"; says "train.batch_size"
run 2 "$G" pipeline "${PIPE[@]}" --set model.width=16384 --set model.heads=1 --set pipeline.nodes=64 --out "$tmp/x"
says "64 workers (pipeline.nodes)"
run 2 "$G" pipeline "${PIPE[@]}" --set train.optimizer=muon --out "$tmp/x"
says "train.optimizer = muon is for data-parallel runs"
run 2 "$G" pipeline "${PIPE[@]}" --set pipeline.network=measured --out "$tmp/x"
says "pipeline.network = measured"
run 2 "$G" pipeline "${PIPE[@]}" --omit 0 --out "$tmp/x"
says "--omit"
run 2 "$G" pipeline "${PIPE[@]}" --omit 2 --out "$tmp/x"
says "--omit: stage 2"
run 2 "$G" pipeline "${PIPE[@]}" --node 0 --out "$tmp/x"
says "--addresses"
run 2 "$G" pipeline "${PIPE[@]}" --node 0 --addresses 127.0.0.1:7001,127.0.0.1:7002 --out "$tmp/x"
says "--addresses names 2 nodes but pipeline.nodes is 4"
run 2 "$G" pipeline "${PIPE[@]}" --node 4 --addresses 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004 --out "$tmp/x"
says "--node 4"
run 2 "$G" pipeline "${PIPE[@]}" --node 0 --addresses 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004 --omit 1 --out "$tmp/x"
says "excludes"
run 2 "$G" pipeline "${PIPE[@]}" --listen 127.0.0.1:7001 --out "$tmp/x"
says "--listen"
run 2 "$G" pipeline "${PIPE[@]}" --node 0 --addresses 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004 --shape nonsense --out "$tmp/x"
says "nonsense"
absent "$tmp/x" "pipeline"
run 2 "$G" pipeline "${PIPE[@]}" --out "$tmp/run"
says "holds a \`gossamer train\` run"
run 2 "$G" pipeline "${PIPE[@]}" --out "$tmp/pipe"
says "already holds a run"
unchanged "$tmp/run" run "pipeline"; unchanged "$tmp/pipe" pipe "pipeline"

# --- schedule: options of another network kind, and --out over a run's files.
run 2 "$G" schedule --network geo --latency-ms 5 --gcma-trials 10
says "--latency-ms applies to \`--network uniform\` only"
run 2 "$G" schedule --bandwidth-mbit 100 --gcma-trials 10
says "--bandwidth-mbit applies to \`--network uniform\` only"
run 2 "$G" schedule --network uniform --fix-nl-ldn --gcma-trials 10
says "--fix-nl-ldn applies to \`--network geo\` only"
run 2 "$G" schedule --force --gcma-trials 10
says "--force requires --out"
run 2 "$G" schedule --stages 6 --path-length 7 --gcma-trials 10
says "--path-length (7) must be at most --stages (6)"
run 2 "$G" schedule --mbs-per-origin 6 --mbs-per-agent 4 --gcma-trials 10
says "--mbs-per-origin (6) must be a multiple of --mbs-per-agent (4)"
run 2 "$G" schedule --nodes 3 --stages 6 --gcma-trials 10
says "--nodes must be at least --stages"
run 2 "$G" schedule --network mesh
says "--network"
run 2 "$G" schedule --gcma-trials 10 --out "$tmp/nodir/s.bin"
says "does not exist"
run 2 "$G" schedule --gcma-trials 10 --out "$tmp/pipe/checkpoint.bin" --force
says "is a file of the run in"
run 2 "$G" schedule --gcma-trials 10 --out ""
says "--out is empty"
unchanged "$tmp/pipe" pipe "schedule"

# --- sample: where the model comes from, the prompt, and numbers.
run 2 "$G" sample --from "$tmp/nothere" --prompt a
says "does not exist"; says "of a gossamer train, peer or pipeline run"
run 2 "$G" sample --from "$tmp/run/summary.json" --prompt a
says "is a file, not a run folder"
run 2 "$G" sample --from "$tmp/sim" --prompt a
says "no checkpoint.bin"
run 2 "$G" sample --from "$tmp/run" --prompt a --prompt-tokens "1 2"
says "excludes"
run 2 "$G" sample --from "$tmp/run"
says "the prompt is empty"
run 2 "$G" sample --from "$tmp/run" --prompt a --tokens 0
says "--tokens"
run 2 "$G" sample --from "$tmp/run" --prompt a --temperature -1
says "--temperature"
run 2 "$G" sample --from "$tmp/run" --prompt a --temperature nan
says "not a finite number"
run 2 "$G" sample --from "$tmp/run" --prompt a --top-k -3
says "--top-k"
run 2 "$G" sample --from "$tmp/run" --prompt-tokens "1 256"
says "\"256\" is not a token id of this model (0 .. 255)"
run 2 "$G" sample --from "$tmp/run" --prompt-tokens "1 x"
says "\"x\" is not a token id"
run 0 "$G" sample --from "$tmp/pipe" --prompt a --tokens 4
unchanged "$tmp/run" run "sample"; unchanged "$tmp/pipe" pipe "sample"

# --- export: never over a run's files, over another file only with --force.
run 2 "$G" export --from "$tmp/run" --out ""
says "--out is empty"
run 2 "$G" export --from "$tmp/run" --out "$tmp/run"
says "is a folder"
for f in checkpoint.bin summary.json metrics.jsonl config.toml run.json inputs.json; do
  run 2 "$G" export --from "$tmp/run" --out "$tmp/run/$f" --force
  says "is a file of the run in"
done
run 2 "$G" export --from "$tmp/pipe" --format torchscript --out "$tmp/pipe/checkpoint.bin" --force
says "is a file of the run in"
echo "kept" > "$tmp/kept.safetensors"
run 2 "$G" export --from "$tmp/run" --out "$tmp/kept.safetensors"
says "--force"
[ "$(cat "$tmp/kept.safetensors")" = "kept" ] || fail "export replaced a file without --force"
run 2 "$G" export --from "$tmp/run" --format onnx --out "$tmp/x.onnx"
says "--format"
run 2 "$G" export --from "$tmp/sim" --out "$tmp/x.safetensors"
says "no checkpoint.bin"
absent "$tmp/x.safetensors" "export"
run 0 "$G" export --from "$tmp/run" --out "$tmp/kept.safetensors" --force
unchanged "$tmp/run" run "export"; unchanged "$tmp/pipe" pipe "export"; unchanged "$tmp/sim" sim "export"

# --- bench: an option of another benchmark, and a model that would not be the one timed.
run 2 "$G" bench quant --steps 3
says "--steps applies to \`bench train\`, \`bench model\` and \`bench memory\` only"
run 2 "$G" bench model --elements 5
says "--elements applies to \`bench quant\` only"
run 2 "$G" bench grid --set model.layers=2
says "--set applies to"
run 2 "$G" bench transport --relay --insecure
says "would do nothing for \`bench transport --relay\`"
run 2 "$G" bench allreduce --gossip-peers 4
says "--gossip-peers applies to \`bench transport\` only"
run 2 "$G" bench model --set model.kind=torchscript --set model.path="$tmp/none.pt"
says "model.kind = torchscript would not be used"
run 2 "$G" bench train --set model.kind=torchscript --set model.path="$tmp/none.pt"
says "would time two different models"
run 2 "$G" bench train --set model.width=65536 --set model.heads=1
says "memory"
grep -qF "sim.workers" "$tmp/out" && fail "bench train's memory advice names sim.workers"
run 2 "$G" bench frobnicate
says "frobnicate"
run 2 "$G" bench quant --elements 0
says "--elements"

# --- plan: options of another report, and a TorchScript model counted as itself.
run 2 "$G" plan --memory --params 5e9
says "--params applies to \`plan\` only; it would do nothing for \`plan --memory\`"
run 2 "$G" plan --set model.layers=4
says "--set applies to \`plan --memory\` only"
run 2 "$G" plan --table4 --workers 4
says "would do nothing for \`plan --table4\`"
run 2 "$G" plan --table4 --memory
says "excludes"
run 2 "$G" plan --codec nosuch
says "--codec: unknown codec 'nosuch'"
run 2 "$G" plan --memory --set model.kind=torchscript --set model.path="$tmp/none.pt"
says "model.path"

# --- keygen and config.
run 2 "$G" keygen --out "$tmp/run/checkpoint.bin" --force
says "is a file of the run in"
run 2 "$G" keygen --out "$tmp/pipe/config.toml" --force
says "is a file of the run in"
run 2 "$G" config --keys --set model.layers=2
says "excludes"
run 2 "$G" config --set model.layerz=2
says "model.layers"
run 2 "$G" config --config "$tmp/nothere.toml"
says "nothere.toml"
unchanged "$tmp/run" run "keygen"; unchanged "$tmp/pipe" pipe "keygen"

# --- Found by a held-out sweep: files that are not files, extremes inside the ranges, output lost.
mkfifo "$tmp/fifo"
run 2 "$G" schedule --gcma-trials 10 --out /dev/null --force
says "is not a regular file"
[ -c /dev/null ] || fail "/dev/null is no longer a device"
run 2 "$G" keygen --out "$tmp/fifo" --force
says "is not a regular file"
[ -p "$tmp/fifo" ] || fail "the FIFO was replaced"
run 2 "$G" keygen --out " "
says "names no file"
run 2 "$G" schedule --gcma-trials 10 --hop-overhead-s 1e6
says "--hop-overhead-s"
run 0 "$G" schedule --gcma-trials 10 --hop-overhead-s 3600 --forward-s 3600
run 2 "$G" schedule --network uniform --bandwidth-mbit 1e-300
says "--bandwidth-mbit"
run 0 "$G" sample --from "$tmp/run" --prompt a --temperature 1e-45 --tokens 4
run 2 "$G" sample --from "$tmp/run" --prompt a --seed -1
says "expected an integer >= 0"
run 2 "$G" sample --from "" --prompt a
says "--from: is empty"
run 2 "$G" config --config ""
says "--config: is empty"
run 2 "$G" config --set train.batch_size=0
says "an integer >= 1"
run 2 "$G" pipeline "${PIPE[@]}" --omit 1e3 --out "$tmp/x"
says "--omit"
run 2 "$G" plan --overlap 200 --inner-steps 100
says "--overlap (200) must be below --inner-steps (100)"
run 2 "$G" plan --fragment-layers 100 --layers 24
says "--fragment-layers (100) exceeds --layers (24)"
run 2 "$G" bench grid --sim-ranks 2 --grid-values 100 --network loopback
says "costs no time"
run 2 "$G" bench quant --elements 2147483648
says "--elements"; says "available"
run 2 "$G" pipeline "${PIPE[@]}" --set pipeline.crash_node=1 --set pipeline.crash_at_iteration=1 --out "$tmp/x"
says "pipeline.crash_node is a drill of the simulator"
run 2 "$G" pipeline "${PIPE[@]}" --node 0 --addresses 127.0.0.1:7001,127.0.0.1:7001,127.0.0.1:7003,127.0.0.1:7004 --out "$tmp/x"
says "every node needs an address of its own"
run 2 "$G" pipeline "${PIPE[@]}" --node 0 --addresses 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004 --key "$tmp/nokey" --out "$tmp/x"
says "--key"
absent "$tmp/x" "pipeline --node"
if [ -e /dev/full ]; then
  cases=$((cases + 1))
  "$G" config > /dev/full 2>"$tmp/out"; code=$?
  [ "$code" -eq 1 ] || fail "config > /dev/full exited $code, expected 1"
  says "cannot write the output"
fi
unchanged "$tmp/run" run "the held-out cases"

# Ctrl-C while a pipeline trains: exit 130 within 2 s, the model so far kept for sample and export.
"$G" pipeline "${PIPE[@]}" --set train.steps=100000 --set train.eval_every=100000 --out "$tmp/pint" > "$tmp/pint.log" 2>&1 &
pid=$!
for i in $(seq 1 300); do grep -qF "iteration 3/" "$tmp/pint.log" 2>/dev/null && break; sleep 0.1; done
start=$(date +%s%N); kill -INT $pid; wait $pid; code=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
cases=$((cases + 1))
[ "$code" -eq 130 ] && [ "$ms" -lt 2000 ] || { cat "$tmp/pint.log"; fail "Ctrl-C during a pipeline: exit $code after $ms ms"; }
[ -f "$tmp/pint/checkpoint.bin" ] || fail "an interrupted pipeline kept no model"
run 0 "$G" sample --from "$tmp/pint" --prompt a --tokens 3

echo "bad inputs per command: all $cases cases passed"
