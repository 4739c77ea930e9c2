#!/usr/bin/env bash
# The GPU check: one command that, on a machine with an NVIDIA GPU and PyTorch, builds Gossamer
# against that PyTorch's LibTorch, runs the test suite's CUDA cases and measures the GPU path, and
# leaves every figure in one file. Where CUDA is absent it says so and runs the same phases on the
# CPU at toy sizes with the regular build (a rehearsal).
#
# Phases (each time-boxed; the whole aims at under 8 minutes on a 16-core GPU machine):
#   env      the GPU, driver, PyTorch, compiler
#   build    unpack .gpu-deps/*.deb (scripts/gpu_deps.sh fetches them on a Debian machine) and build
#            the gossamer command and the train and optim tests against python3's torch, with the NCCL
#            engine where PyTorch's nccl.h is found; if LibTorch 2's fused kernels or the NCCL engine
#            do not compile, once more without them (GOSSAMER_TORCH2_KERNELS=OFF, GOSSAMER_NCCL=OFF)
#   tests    every test case with "CUDA" in its name, and the outer-state-on-the-device case
#   inner    the inner loop of GPT-2 124M and 350M in bf16: `gossamer bench model --bf16-only`
#            against plain PyTorch eager (scripts/gpu_eager.py) on the same GPU, tokens/s and MFU
#   codecs   `gossamer bench quant --device cuda`: codecs on device tensors against the copies
#   peers    2 and 4 peers sharing the GPU (real `gossamer peer` processes on loopback), diloco with
#            fp4 pseudo-gradients and streaming_diloco, outer state on the host and on the device:
#            every peer's digest of the shared state, bytes sent, round time
#   nccl     ddp on NCCL (ddp.engine = nccl) against ddp on our links, 2 real peers on 2 GPUs (NCCL
#            needs one GPU per rank); with fewer GPUs it says so
#
# Usage: scripts/gpu_check.sh [OUT_DIR]    (default gpu-check/; figures in OUT_DIR/gpu_check.txt,
#                                           logs beside it)
# Environment: GPU_CHECK_BUDGET seconds for the whole check (default 470); phases that would start
# after it are skipped and say so. GPU_CHECK_DEPS: where the .deb files are unpacked (default
# /tmp/gossamer-gpu-deps).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT_DIR=${1:-gpu-check}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
REPORT=$OUT_DIR/gpu_check.txt
BUDGET=${GPU_CHECK_BUDGET:-470}
DEPS=${GPU_CHECK_DEPS:-/tmp/gossamer-gpu-deps}
# python3 with torch: the GPU machine's own; here, Debian's when the one on PATH has none.
PY=python3
if ! python3 -c 'import torch' >/dev/null 2>&1 && /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then PY=/usr/bin/python3; fi
START=$(date +%s)
: >"$REPORT"

say() { echo "$*" | tee -a "$REPORT"; }
elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((BUDGET - $(elapsed))); }
# phase NAME NEEDED_SECONDS: false (and a line in the report) when fewer seconds are left.
phase() {
  local l
  l=$(left)
  if [ "$l" -lt "$2" ]; then
    say "== $1: skipped, ${l}s of the budget left and it needs about $2s"
    return 1
  fi
  say "== $1 (at $(elapsed)s)"
  return 0
}

# ---------------------------------------------------------------------------------------------- env
CUDA=0
say "gossamer gpu check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
phase env 0
if command -v nvidia-smi >/dev/null 2>&1; then
  say "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | paste -sd';')"
fi
torch_line=$($PY -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())' 2>&1 | tail -1)
say "python3 torch: $torch_line"
if $PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then CUDA=1; fi
say "compiler: $(c++ --version 2>&1 | head -1); cmake: $(cmake --version 2>&1 | head -1); ninja: $(ninja --version 2>&1); cores: $(nproc)"
if [ $CUDA = 0 ]; then
  say "CUDA is absent here: a rehearsal on the CPU with the regular build (toy sizes; no GPU figures)"
fi

# -------------------------------------------------------------------------------------------- build
BIN=build/src/app/gossamer
TESTS=build/tests
if [ $CUDA = 1 ]; then
  BUILD=build-gpu
  BIN=$BUILD/src/app/gossamer
  TESTS=$BUILD/tests
  if phase build 120; then
    if ! ls .gpu-deps/*.deb >/dev/null 2>&1; then
      say "build: no .gpu-deps/*.deb here: run scripts/gpu_deps.sh on a Debian 12 machine and bring .gpu-deps along"
    fi
    rm -rf "$DEPS" && mkdir -p "$DEPS"
    for f in .gpu-deps/*.deb; do
      [ -e "$f" ] || continue
      if command -v dpkg-deb >/dev/null 2>&1; then
        dpkg-deb -x "$f" "$DEPS"
      else  # ar and tar: a .deb is an ar archive holding data.tar.*
        (cd "$DEPS" && ar p "$ROOT/$f" "$(ar t "$ROOT/$f" | grep '^data.tar')" | tar -x -f - --auto-compress 2>/dev/null ||
          ar p "$ROOT/$f" "$(ar t "$ROOT/$f" | grep '^data.tar')" | tar -x -J -f -)
      fi
    done
    LIBDIR=$DEPS/usr/lib/x86_64-linux-gnu
    # Keep the machine's own copy of a shared library it already has (its build is the one its
    # other libraries were made with); ours fill the gaps.
    kept=()
    for so in "$LIBDIR"/lib*.so.*; do
      [ -e "$so" ] || continue
      name=$(basename "$so")
      soname=$(echo "$name" | sed -E 's/(\.so\.[0-9]+).*/\1/')
      if ldconfig -p 2>/dev/null | grep -q " $soname "; then
        rm -f "$so"
      else
        kept+=("$name")
      fi
    done
    say "build: unpacked $(ls .gpu-deps/*.deb 2>/dev/null | wc -l) packages; libraries used from them (the machine lacks these): ${kept[*]:-none}"
    export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    TORCH_PREFIX=$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)')
    # LibTorch's CMake files look for the CUDA toolkit and the GPU's architecture.
    if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
    if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
      TORCH_CUDA_ARCH_LIST=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
      export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
    fi
    say "build: nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found'), TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST, LibTorch at $TORCH_PREFIX"
    # PyTorch may ship its own fmt headers (a newer fmt than the libfmt the carried spdlog links):
    # the carried fmt and spdlog headers go first, ahead of LibTorch's include folder.
    torch_inc=$($PY -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
    if [ -f "$torch_inc/fmt/base.h" ] || [ -f "$torch_inc/fmt/core.h" ]; then
      say "build: LibTorch ships fmt $(grep -h -m1 '#define FMT_VERSION' "$torch_inc"/fmt/base.h "$torch_inc"/fmt/core.h 2>/dev/null | awk '{print $3}'); the carried fmt 9 and spdlog headers are put ahead of it"
    fi
    mkdir -p "$DEPS/first"
    for h in fmt spdlog; do ln -sfn "$DEPS/usr/include/$h" "$DEPS/first/$h"; done
    # NCCL's header: PyTorch's wheels carry it in an nvidia package beside torch.
    nccl_h=$($PY -c 'import nvidia, os; print("\n".join(nvidia.__path__))' 2>/dev/null | while read -r d; do find "$d" -name nccl.h 2>/dev/null; done | head -1)
    NCCL_FLAGS=()
    [ -n "$nccl_h" ] && NCCL_FLAGS=(-DGOSSAMER_NCCL_INCLUDE="$(dirname "$nccl_h")")
    say "build: NCCL's header: ${nccl_h:-not found beside PyTorch (the NCCL engine is built only if CMake finds it elsewhere)}"
    configure() {
      cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DGOSSAMER_WERROR=OFF -DCMAKE_CXX_FLAGS="-I$DEPS/first" \
        -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$DEPS/usr" "${NCCL_FLAGS[@]}" "$@" >"$OUT_DIR/configure.log" 2>&1
    }
    build() {  # seconds
      local limit=$1
      [ "$limit" -ge 30 ] || limit=30
      timeout "$limit" ninja -C $BUILD -k 0 gossamer train_test optim_test >"$OUT_DIR/build.log" 2>&1
    }
    t0=$(date +%s)
    if ! configure -DGOSSAMER_TORCH2_KERNELS=ON; then
      say "build: configure failed; the end of its log:"
      tail -25 "$OUT_DIR/configure.log" | tee -a "$REPORT"
    else
      if ! build $(($(left) - 150)); then
        say "build: failed after $(($(date +%s) - t0))s; its first errors:"
        grep -m 12 -A3 'error:' "$OUT_DIR/build.log" | cut -c1-400 | tee -a "$REPORT"
        cp "$OUT_DIR/build.log" "$OUT_DIR/build-first.log"
        again=()
        grep -q -E '(gpt|fused_steps)\.cpp.*error:' "$OUT_DIR/build.log" && again+=(-DGOSSAMER_TORCH2_KERNELS=OFF)
        grep -q -E 'nccl_sync\.cpp.*error:' "$OUT_DIR/build.log" && again+=(-DGOSSAMER_NCCL=OFF)
        if [ ! -x $BIN ] && [ ${#again[@]} -gt 0 ]; then
          say "build: again with ${again[*]} (only the files that use them recompile)"
          configure -DGOSSAMER_TORCH2_KERNELS=ON "${again[@]}" && build $(($(left) - 120))
        fi
      fi
      if [ -x $BIN ]; then
        say "build: gossamer built in $(($(date +%s) - t0))s against $torch_line; $($BIN --version 2>&1 | tail -1)"
      else
        say "build: no gossamer binary; the build's errors:"
        grep -m 20 -A3 'error:' "$OUT_DIR/build.log" | cut -c1-400 | tee -a "$REPORT"
      fi
    fi
  fi
else
  if [ ! -x $BIN ]; then
    say "build: no $BIN here: run scripts/build.sh first (the rehearsal uses the regular build)"
  fi
fi
if [ ! -x $BIN ]; then
  say "no gossamer binary: the phases that need it are skipped"
fi

# -------------------------------------------------------------------------------------------- tests
if [ -x $BIN ] && phase tests 60; then
  for t in train_test optim_test; do
    [ -x $TESTS/$t ] || { say "tests: $t not built"; continue; }
    filter='*CUDA*'
    [ $t = optim_test ] && filter='*outer state on the training device*,*CUDA*'
    if timeout 120 $TESTS/$t -tc="$filter" -s >"$OUT_DIR/$t.log" 2>&1; then
      say "tests: $t -tc='$filter': $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT_DIR/$t.log" | tr -s ' ' | paste -sd';')"
    else
      say "tests: $t -tc='$filter' FAILED:"
      grep -E 'ERROR|CHECK|REQUIRE|error|test cases' "$OUT_DIR/$t.log" | head -20 | cut -c1-300 | tee -a "$REPORT"
    fi
    grep -h 'MESSAGE: ' "$OUT_DIR/$t.log" | sed 's/.*MESSAGE: /tests:   /' | head -6 | cut -c1-300 | tee -a "$REPORT"
  done
fi

# -------------------------------------------------------------------------------------------- inner
# MFU: 6 N + 12 L T d FLOPs per token (N without the position table), over the dense bf16 peak.
mfu() {  # tok/s layers width context params_without_positions peak_tflops
  $PY -c "import sys; r,L,d,T,N,p=map(float,sys.argv[1:]); print(f'{100*r*(6*N+12*L*T*d)/(p*1e12):.1f}')" "$@"
}
PEAK=989.4
# scripts/gpu_eager.py's one line for a preset (extra arguments: --fused), and the tok/s in such a line.
eager() {  # preset batch [--fused]
  timeout 120 $PY scripts/gpu_eager.py --preset "$1" --batch "$2" --context $CONTEXT --vocab $VOCAB --steps $STEPS --rounds $ROUNDS \
    --peak-tflops $PEAK "${@:3}" 2>>"$OUT_DIR/eager-$1.err" | tail -1
}
rate_of() { echo "$1" | sed -nE 's/.*x [0-9]+, ([0-9]+) tok\/s.*/\1/p'; }
if [ $CUDA = 1 ]; then
  sizes=("gpt2-124m 12 768 16" "gpt2-350m 24 1024 16")
  CONTEXT=1024 VOCAB=50257 STEPS=10 ROUNDS=3 DEVICE=cuda
else
  sizes=("gpt2-124m 12 768 1")
  CONTEXT=64 VOCAB=50257 STEPS=1 ROUNDS=1 DEVICE=cpu
fi
for s in "${sizes[@]}"; do
  read -r preset layers width batch <<<"$s"
  phase "inner $preset" 60 || continue
  line_eager="-" line_fused=""
  if [ $CUDA = 1 ]; then
    : >"$OUT_DIR/eager-$preset.err"
    line_eager=$(eager "$preset" "$batch")
    [ -n "$line_eager" ] || line_eager="failed: $(tail -3 "$OUT_DIR/eager-$preset.err" | paste -sd' ')"
    say "inner: $line_eager"
    # The same with AdamW fused, as Gossamer's is on a GPU: the two eager lines apart say what the
    # optimizer's form is worth, the rest of a gap is the forward and backward.
    line_fused=$(eager "$preset" "$batch" --fused)
    say "inner: ${line_fused:-eager with fused AdamW failed}"
  fi
  if [ -x $BIN ]; then
    timeout 150 $BIN bench model --bf16-only --steps $STEPS --rounds $ROUNDS --set model.preset="$preset" --set data.vocab_size=$VOCAB \
      --set model.context=$CONTEXT --set train.batch_size="$batch" --set train.device=$DEVICE --set data.synthetic.bytes=4000000 \
      >"$OUT_DIR/bench-$preset.log" 2>&1
    ours=$(grep -m1 '^median gpt bf16' "$OUT_DIR/bench-$preset.log" | sed -E 's/.*: ([0-9.]+) tok\/s.*/\1/')
    if [ -n "$ours" ]; then
      n=$(grep -m1 '^bench model' "$OUT_DIR/bench-$preset.log" | sed -E 's/bench model: ([0-9.]+)M.*/\1/')
      npos=$($PY -c "print(float('$n')*1e6 - $CONTEXT*$width)")
      say "inner: gossamer $preset bf16: $ours tok/s, batch $batch x $CONTEXT, MFU $(mfu "$ours" "$layers" "$width" $CONTEXT "$npos" $PEAK)% of $PEAK TFLOP/s"
      eager_rate=$(rate_of "$line_eager")
      if [ -n "$eager_rate" ]; then
        say "inner: gossamer / PyTorch eager, $preset bf16: $($PY -c "print(f'{$ours/$eager_rate:.3f}')") (target 0.97)"
      fi
      fused_rate=$(rate_of "$line_fused")
      if [ -n "$fused_rate" ]; then
        say "inner: gossamer / PyTorch eager with fused AdamW, $preset bf16: $($PY -c "print(f'{$ours/$fused_rate:.3f}')")"
      fi
    else
      say "inner: gossamer bench model $preset failed:"
      tail -5 "$OUT_DIR/bench-$preset.log" | cut -c1-300 | tee -a "$REPORT"
    fi
  fi
done

# ------------------------------------------------------------------------------------------- codecs
if [ -x $BIN ] && phase codecs 30; then
  if [ $CUDA = 1 ]; then q=(--device cuda --elements 33554432 --min-time 0.05); else q=(--elements 1048576 --min-time 0.01); fi
  if timeout 120 $BIN bench quant "${q[@]}" >"$OUT_DIR/quant.log" 2>&1; then
    sed -n '/^quant codecs/,$p' "$OUT_DIR/quant.log" | sed 's/^/codecs: /' | tee -a "$REPORT"
  else
    say "codecs: bench quant failed:"
    tail -5 "$OUT_DIR/quant.log" | tee -a "$REPORT"
  fi
fi

# -------------------------------------------------------------------------------------------- peers
# One run of N real peers on loopback sharing this machine's device; prints one line of figures.
peers_run() {  # method peers state_device [ddp_engine: with nccl, peer i trains on GPU i]
  local method=$1 n=$2 state=$3 engine=${4:-links} dir="$OUT_DIR/peers/$1-$2-$3-${4:-links}" i pids=()
  dev_of() { if [ "$engine" = nccl ]; then echo "cuda:$1"; else echo "$DEVICE"; fi; }
  rm -rf "$dir" && mkdir -p "$dir"
  local common=(--set outer.method="$method" --set outer.state_device="$state" --set diloco.codec=fp4_e2m1 --set streaming_diloco.codec=fp4_e2m1
    --set diloco.inner_steps=$PEER_H --set streaming_diloco.inner_steps=$PEER_H --set train.steps=$PEER_STEPS
    --set train.eval_every=$PEER_STEPS --set train.eval_batches=1 --set train.warmup_steps=2 --set train.checkpoint_every=0
    --set model.preset=gpt2-124m --set data.vocab_size=50257 --set model.context=$PEER_CONTEXT --set train.batch_size=$PEER_BATCH
    --set train.device="$(dev_of 0)" --set train.precision=$PEER_PRECISION --set data.synthetic.bytes=2000000 --set train.threads=$PEER_THREADS
    --set ddp.engine="$engine")
  local t0
  t0=$(date +%s.%N)
  timeout "$PEER_TIMEOUT" $BIN peer --listen 127.0.0.1:0 --out "$dir/p0" --wait-for "$n" "${common[@]}" >"$dir/p0.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 600); do
    { [ -s "$dir/p0/address" ] || ! kill -0 "${pids[0]}" 2>/dev/null; } && break
    sleep 0.1
  done
  if [ ! -s "$dir/p0/address" ]; then
    wait "${pids[0]}"
    echo "peers: $method ($engine), $n peers, outer state on the $state: the first peer did not start: $(tail -2 "$dir/p0.log" | paste -sd' ' | cut -c1-300)"
    return
  fi
  for i in $(seq 1 $((n - 1))); do
    timeout "$PEER_TIMEOUT" $BIN peer --listen 127.0.0.1:0 --join "$(head -n1 "$dir/p0/address")" --out "$dir/p$i" --device "$(dev_of "$i")" >"$dir/p$i.log" 2>&1 &
    pids+=($!)
  done
  local ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  local wall
  wall=$($PY -c "import time; print(f'{time.time() - $t0:.1f}')")
  rm -f "$dir"/p*/checkpoint.bin*  # a 124M model's checkpoints, one per peer: no need to keep them
  [ "$method" = ddp ] && method="ddp ($engine)"
  $PY - "$dir" "$n" "$method" "$state" "$ok" "$wall" <<'EOF'
import json, os, statistics, sys
d, n, method, state, ok, wall = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1", sys.argv[6]
s = []
for i in range(n):
    try:
        s.append(json.load(open(os.path.join(d, f"p{i}", "summary.json"))))
    except Exception as e:
        print(f"peers: {method}, {n} peers, state on {state}: peer {i} left no summary ({e}); see {d}/p{i}.log")
        sys.exit(0)
digests = {x.get("shared_digest", "none") for x in s}
rounds = max(x["rounds"] for x in s)
mean = lambda k: statistics.mean(x[k] for x in s)
print(f"peers: {method}, {n} peers, outer state on the {state}: {'all exited 0' if ok else 'SOME FAILED'}; "
      f"shared-state digests {'identical' if len(digests) == 1 else 'DIFFER'} ({next(iter(digests))[:12]}); "
      f"{s[0]['steps']} steps in {rounds} rounds; sent {mean('bytes_sent') / 1e6:.1f} MB per peer; "
      f"round {mean('loop_s') / max(rounds, 1):.2f} s (compute {mean('compute_s') / max(rounds, 1):.2f} s, "
      f"waiting on the round {mean('blocked_s') / max(rounds, 1):.2f} s); wall {wall} s with start-up")
EOF
}
if [ $CUDA = 1 ]; then
  PEER_H=12 PEER_STEPS=24 PEER_CONTEXT=512 PEER_BATCH=8 PEER_PRECISION=bf16 PEER_THREADS=2 PEER_TIMEOUT=120
  runs=("diloco 2 host" "diloco 4 host" "diloco 4 device" "streaming_diloco 4 host" "streaming_diloco 4 device" "diloco 2 device")
else
  PEER_H=8 PEER_STEPS=16 PEER_CONTEXT=32 PEER_BATCH=1 PEER_PRECISION=fp32 PEER_THREADS=1 PEER_TIMEOUT=240
  runs=("diloco 2 host" "streaming_diloco 2 host")
fi
for r in "${runs[@]}"; do
  [ -x $BIN ] || break
  read -r method n state <<<"$r"
  phase "peers $method $n $state" 40 || continue
  peers_run "$method" "$n" "$state" | tee -a "$REPORT"
done

# --------------------------------------------------------------------------------------------- nccl
phase nccl 0
gpus=$($PY -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
engines=$([ -x $BIN ] && $BIN --version 2>&1 | sed -n 's/.*ddp engines built: //p')
say "nccl: ddp engines in this build: ${engines:-unknown (no binary)}"
if [ "${gpus:-0}" -ge 2 ] && echo "$engines" | grep -q nccl; then
  # ddp of GPT-2 124M on 2 peers, one GPU each: NCCL against our all-reduce (fp32 both), step by step.
  for e in nccl links; do
    phase "nccl: ddp on $e, 2 peers" 40 || continue
    peers_run ddp 2 host "$e" | sed 's/^peers:/nccl:/' | tee -a "$REPORT"
  done
elif [ "${gpus:-0}" -ge 2 ]; then
  say "nccl: $gpus GPUs, but this build has no NCCL engine (see the build's lines above)"
else
  say "nccl: $gpus GPU(s): NCCL refuses two ranks on one GPU, so ddp on NCCL against our links and Gloo needs a machine with 2 or more"
  if [ $CUDA = 0 ] && [ -x $BIN ] && phase "nccl: its baseline, ddp on links, 2 peers (rehearsal)" 40; then
    peers_run ddp 2 host links | sed 's/^peers:/nccl:/' | tee -a "$REPORT"
  fi
fi
say "== done in $(elapsed)s; figures in $REPORT"
