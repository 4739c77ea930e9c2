#!/usr/bin/env bash
# Files made by other tools, used as a user would: token files written the way nanoGPT's prepare.py
# and llm.c's data scripts write them (with NumPy), trained on by `gossamer train`, `sim` and
# `peer`. Needs python3 with NumPy (scripts/setup.sh installs it); skips (exit 77) without it.
# Usage: user_files_test.sh path/to/gossamer
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

# The first python3 that has NumPy: the one on PATH, else Debian's (which scripts/setup.sh equips).
PY=""
for p in python3 /usr/bin/python3; do
  if "$p" -c 'import numpy' 2>/dev/null; then PY="$p"; break; fi
done
if [ -z "$PY" ]; then
  echo "SKIP: no python3 with NumPy is installed (scripts/setup.sh installs python3-numpy)"
  exit 77
fi

# A corpus of ids above 255 (a GPT-2-sized vocabulary) with structure a model can learn: a repeated
# random phrase book, so the loss must fall well below ln(50257) = 10.8.
"$PY" - "$tmp" <<'PY'
import sys, numpy as np
out = sys.argv[1]
rng = np.random.default_rng(7)
phrases = [rng.integers(0, 50257, size=rng.integers(3, 9)) for _ in range(40)]
def text(n):
    ids = []
    while len(ids) < n:
        ids.extend(phrases[rng.integers(0, len(phrases))])
    return np.array(ids[:n], dtype=np.uint16)
import os
os.makedirs(f"{out}/nanogpt"); os.makedirs(f"{out}/llmc")
# nanoGPT's prepare.py: arr.tofile(path), raw little-endian uint16.
text(60000).tofile(f"{out}/nanogpt/train.bin")
text(6000).tofile(f"{out}/nanogpt/val.bin")
# llm.c's dev/data/data_common.py write_datafile: 256 int32 header, then uint16 tokens.
def write_datafile(path, toks):
    header = np.zeros(256, dtype=np.int32)
    header[0] = 20240520; header[1] = 1; header[2] = len(toks)
    with open(path, "wb") as f:
        f.write(header.tobytes()); f.write(toks.tobytes())
write_datafile(f"{out}/llmc/shakes_train.bin", text(60000))
write_datafile(f"{out}/llmc/shakes_val.bin", text(6000))
# A truncated llm.c file and one whose count lies.
write_datafile(f"{out}/bad.bin", text(1000))
with open(f"{out}/bad.bin", "r+b") as f: f.truncate(1024 + 1000)
PY

SMALL=(--set model.layers=1 --set model.width=32 --set model.heads=2 --set model.context=16
       --set train.batch_size=8 --set train.steps=60 --set train.warmup_steps=5 --set train.lr=1e-2
       --set train.eval_every=30 --set train.eval_batches=2 --set data.format=tokens --set data.vocab_size=50257)

# Token files need their vocabulary; a vocabulary too small for the ids is named with the fix.
run 2 "$G" train --set data.format=tokens --set data.path="$tmp/nanogpt" --out "$tmp/r0"
says "data.vocab_size"
run 2 "$G" train "${SMALL[@]}" --set data.vocab_size=1000 --set data.path="$tmp/nanogpt" --out "$tmp/r1"
says "at least"
run 2 "$G" train "${SMALL[@]}" --set data.path="$tmp/bad.bin" --out "$tmp/r2"
says "truncated"

# nanoGPT's folder trains, its loss falls far below a uniform guess over the vocabulary.
run 0 "$G" train "${SMALL[@]}" --set data.path="$tmp/nanogpt" --out "$tmp/nano"
says "nats/token"
loss=$(grep -o 'val loss [0-9.]*' "$tmp/out" | awk '{print $3}')
awk -v l="$loss" 'BEGIN { exit !(l < 8.0) }' || fail "val loss $loss on the nanoGPT corpus is not below 8 (uniform: 10.8)"

# The files a run reads are pinned when it starts (inputs.json): a resume after a token file changed
# (the same size, other content) or after one was added to the folder is refused, naming the file,
# and leaves the run folder as it was; put back, the run resumes.
mkdir -p "$tmp/pinned" && cp "$tmp/nanogpt/train.bin" "$tmp/nanogpt/val.bin" "$tmp/pinned/"
run 0 "$G" train "${SMALL[@]}" --set data.path="$tmp/pinned" --stop-at 10 --out "$tmp/pin"
grep -qF '"blake2b"' "$tmp/pin/inputs.json" || fail "the run did not pin its token files"
cp "$tmp/pinned/train.bin" "$tmp/train.bin.orig"
printf '\x01\x02' | dd of="$tmp/pinned/train.bin" bs=1 seek=5000 conv=notrunc status=none
cp -a "$tmp/pin" "$tmp/pin.before"
run 2 "$G" train --out "$tmp/pin" --resume
says "train.bin changed: the same 120000 bytes but other content"; says "put the files back"
diff -r "$tmp/pin.before" "$tmp/pin" >/dev/null || fail "a refused resume changed the run folder"
cp "$tmp/train.bin.orig" "$tmp/pinned/train.bin"
cp "$tmp/pinned/val.bin" "$tmp/pinned/more_train.bin"
run 2 "$G" train --out "$tmp/pin" --resume
says "more_train.bin is new"
rm "$tmp/pinned/more_train.bin"
run 0 "$G" train --out "$tmp/pin" --resume
says "step 60/60"

# llm.c's files train in the simulator with DiLoCo, and a real peer reads them too.
run 0 "$G" sim "${SMALL[@]}" --set data.path="$tmp/llmc" --set sim.workers=2 --set diloco.inner_steps=20 --out "$tmp/sim"
grep -q '"final_val_loss"' "$tmp/sim/summary.json" || fail "sim wrote no final validation loss"
run 0 "$G" peer "${SMALL[@]}" --set data.path="$tmp/llmc" --set train.steps=20 --set diloco.inner_steps=10 \
  --set outer.method=diloco --listen 127.0.0.1:0 --wait-for 1 --out "$tmp/peer"
test -f "$tmp/peer/summary.json" || fail "the peer wrote no summary"

# A model written in PyTorch (examples/torchscript/nanogpt_export.py, nanoGPT's layout with a tied
# head and dropout), saved with torch.jit.script, trained by train, sim (Streaming DiLoCo, cut into
# fragments by its layer names) and a real peer, on text and on the token files.
if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "SKIP (TorchScript part): $PY has no torch (scripts/setup.sh installs python3-torch)"
  echo "user files: token-file checks passed"
  exit 0
fi
EX="$(dirname "$0")/../../examples/torchscript/nanogpt_export.py"
"$PY" "$EX" --out "$tmp/ng.pt" --vocab 256 --context 16 --layers 3 --width 32 --heads 2 --dropout 0.1 >/dev/null || fail "export script failed"
"$PY" "$EX" --out "$tmp/ng_tokens.pt" --vocab 50257 --context 16 --layers 2 --width 32 --heads 2 >/dev/null || fail "export script failed"
TS=(--set model.kind=torchscript --set model.context=16 --set train.batch_size=8 --set train.steps=60
    --set train.warmup_steps=5 --set train.lr=1e-2 --set train.eval_every=30 --set train.eval_batches=2
    --set data.synthetic.bytes=60000)
run 0 "$G" train "${TS[@]}" --set model.path="$tmp/ng.pt" --out "$tmp/ts-train"
loss=$(grep -o 'val loss [0-9.]*' "$tmp/out" | awk '{print $3}')
awk -v l="$loss" 'BEGIN { exit !(l < 4.0) }' || fail "the TorchScript model's val loss $loss is not below 4 (uniform: 5.55)"
run 0 "$G" sim "${TS[@]}" --set model.path="$tmp/ng.pt" --set outer.method=streaming_diloco --set sim.workers=2 \
  --set streaming_diloco.inner_steps=20 --set streaming_diloco.fragment_layers=1 --out "$tmp/ts-sim"
grep -q '"final_val_loss"' "$tmp/ts-sim/summary.json" || fail "sim of the TorchScript model wrote no final loss"
run 0 "$G" sim "${TS[@]}" --set model.path="$tmp/ng.pt" --set outer.method=streaming_diloco --set sim.workers=2 \
  --set streaming_diloco.inner_steps=20 --set streaming_diloco.fragment_layers=1 --out "$tmp/ts-sim2"
cmp -s "$tmp/ts-sim/streaming_diloco/metrics.jsonl" "$tmp/ts-sim2/streaming_diloco/metrics.jsonl" || fail "two simulations of the TorchScript model differ"
run 0 "$G" peer "${TS[@]}" --set model.path="$tmp/ng_tokens.pt" --set data.format=tokens --set data.vocab_size=50257 \
  --set data.path="$tmp/nanogpt" --set train.steps=20 --set diloco.inner_steps=10 --listen 127.0.0.1:0 --wait-for 1 --out "$tmp/ts-peer"
test -f "$tmp/ts-peer/summary.json" || fail "the TorchScript peer wrote no summary"
# A TorchScript model replaced between a stop and its resume (another shape, then the same shape
# with other weights): refused before it is loaded, naming model.path; a peer's resume alike.
cp "$tmp/ng.pt" "$tmp/ng_pin.pt"
run 0 "$G" train "${TS[@]}" --set model.path="$tmp/ng_pin.pt" --stop-at 5 --out "$tmp/ts-pin"
"$PY" "$EX" --out "$tmp/ng_pin.pt" --vocab 256 --context 16 --layers 2 --width 32 --heads 2 >/dev/null || fail "export script failed"
run 2 "$G" train --out "$tmp/ts-pin" --resume
says "model.path $tmp/ng_pin.pt changed"
"$PY" "$EX" --out "$tmp/ng_pin.pt" --vocab 256 --context 16 --layers 3 --width 32 --heads 2 --dropout 0.1 --seed 99 >/dev/null || fail "export script failed"
run 2 "$G" train --out "$tmp/ts-pin" --resume
says "model.path $tmp/ng_pin.pt changed"
grep -qF "internal" "$tmp/out" && fail "a changed TorchScript file reached the model's load"
cp "$tmp/ng.pt" "$tmp/ng_pin.pt"
"$G" peer "${TS[@]}" --set model.path="$tmp/ng_pin.pt" --set train.steps=20 --set diloco.inner_steps=10 --set train.checkpoint_every=10 \
  --listen 127.0.0.1:0 --wait-for 1 --crash-at-step 12 --out "$tmp/ts-peer-pin" >"$tmp/out" 2>&1
[ $? -eq 137 ] || { cat "$tmp/out"; fail "the peer's crash drill did not fire"; }
"$PY" "$EX" --out "$tmp/ng_pin.pt" --vocab 256 --context 16 --layers 3 --width 32 --heads 2 --dropout 0.1 --seed 99 >/dev/null || fail "export script failed"
run 2 "$G" peer --listen 127.0.0.1:0 --resume --out "$tmp/ts-peer-pin"
says "model.path $tmp/ng_pin.pt changed"
# A module whose vocabulary is not the run's is refused with the shapes.
run 2 "$G" train "${TS[@]}" --set model.path="$tmp/ng_tokens.pt" --out "$tmp/ts-bad"
says "expected [1, 16, 256]"
# A module whose position table is shorter than model.context: refused at load, in one line.
run 2 "$G" train "${TS[@]}" --set model.path="$tmp/ng.pt" --set model.context=32 --out "$tmp/ts-short"
says "position table shorter than model.context"
[ -e "$tmp/ts-short" ] && fail "a refused TorchScript run must not create its run folder"

# Using the result: sample (deterministic per seed), export to safetensors and TorchScript, and
# PyTorch reads both: the same weights bit for bit, a forward pass written from the safetensors
# weights alone matches the TorchScript module, and PyTorch's greedy continuation is gossamer's.
run 0 "$G" train --set model.layers=2 --set model.width=32 --set model.heads=2 --set model.context=16 \
  --set train.batch_size=8 --set train.steps=60 --set train.warmup_steps=5 --set data.synthetic.bytes=60000 \
  --set train.eval_every=30 --set train.eval_batches=2 --out "$tmp/gpt"
"$G" sample --from "$tmp/gpt" --prompt "the " --tokens 40 --seed 5 >"$tmp/s1" 2>/dev/null || fail "sample failed"
"$G" sample --from "$tmp/gpt" --prompt "the " --tokens 40 --seed 5 >"$tmp/s2" 2>/dev/null || fail "sample failed"
"$G" sample --from "$tmp/gpt" --prompt "the " --tokens 40 --seed 6 >"$tmp/s3" 2>/dev/null || fail "sample failed"
cmp -s "$tmp/s1" "$tmp/s2" || fail "the same seed sampled different text"
cmp -s "$tmp/s1" "$tmp/s3" && fail "another seed sampled the same text"
"$G" sample --from "$tmp/gpt" --prompt "the " --tokens 24 --temperature 0 >"$tmp/greedy" 2>/dev/null || fail "greedy sample failed"
run 2 "$G" sample --from "$tmp/nano" --prompt "text"
says "--prompt-tokens"
run 0 "$G" sample --from "$tmp/nano" --prompt-tokens "1 2 3" --tokens 5
run 2 "$G" sample --from "$tmp/sim" --prompt "x"
says "no checkpoint.bin"
run 0 "$G" export --from "$tmp/gpt" --out "$tmp/gpt.safetensors"
run 0 "$G" export --from "$tmp/gpt" --format torchscript --out "$tmp/gpt.pt"
run 2 "$G" export --from "$tmp/gpt" --out "$tmp/gpt.pt"
says "--force"
run 0 "$G" export --from "$tmp/ts-train" --format torchscript --out "$tmp/ts-trained.pt"
"$PY" - "$tmp/gpt.safetensors" "$tmp/gpt.pt" "$tmp/greedy" "$tmp/ts-trained.pt" <<'PY' || fail "PyTorch did not read the exported model back"
import json, struct, sys
import numpy as np, torch
import torch.nn.functional as F
st, ts, greedy_file, trained_user_model = sys.argv[1:5]
raw = open(st, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
meta = header.pop("__metadata__")
state = {k: torch.from_numpy(np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype=np.float32).copy()).reshape(v["shape"])
         for k, v in header.items()}
m = torch.jit.load(ts)
params = dict(m.named_parameters())
L, C, H = int(meta["gossamer.layers"]), int(meta["gossamer.width"]), int(meta["gossamer.heads"])
names = {"wte": "embed.wte.weight", "wpe": "embed.wpe.weight", "ln_f_weight": "final.ln_f.weight", "ln_f_bias": "final.ln_f.bias"}
ours = {"ln1_weight": "ln1.weight", "ln1_bias": "ln1.bias", "qkv_weight": "attn.qkv.weight", "qkv_bias": "attn.qkv.bias",
        "proj_weight": "attn.proj.weight", "proj_bias": "attn.proj.bias", "ln2_weight": "ln2.weight", "ln2_bias": "ln2.bias",
        "fc_weight": "mlp.fc.weight", "fc_bias": "mlp.fc.bias", "mlp_proj_weight": "mlp.proj.weight", "mlp_proj_bias": "mlp.proj.bias"}
for i in range(L):
    for a, b in ours.items():
        names[f"block_{i}.{a}"] = f"block.{i}.{b}"
assert len(names) == len(state) == len(params), (len(names), len(state), len(params))
for a, b in names.items():
    assert torch.equal(params[a].detach(), state[b]), a

def forward(tokens):  # the GPT, written from the safetensors weights alone
    T = tokens.size(1)
    x = F.embedding(tokens, state["embed.wte.weight"]) + state["embed.wpe.weight"][:T]
    for i in range(L):
        w = lambda k: state[f"block.{i}.{k}"]
        h = F.layer_norm(x, [C], w("ln1.weight"), w("ln1.bias"))
        q, k, v = F.linear(h, w("attn.qkv.weight"), w("attn.qkv.bias")).split(C, 2)
        q, k, v = [t.view(1, T, H, C // H).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / (C // H) ** 0.5
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + F.linear((att @ v).transpose(1, 2).reshape(1, T, C), w("attn.proj.weight"), w("attn.proj.bias"))
        h = F.layer_norm(x, [C], w("ln2.weight"), w("ln2.bias"))
        x = x + F.linear(F.gelu(F.linear(h, w("mlp.fc.weight"), w("mlp.fc.bias")), approximate="tanh"), w("mlp.proj.weight"), w("mlp.proj.bias"))
    x = F.layer_norm(x, [C], state["final.ln_f.weight"], state["final.ln_f.bias"])
    return x @ state["embed.wte.weight"].t()

tokens = torch.tensor([list(b"the quick brown ")])
with torch.no_grad():
    assert torch.allclose(m(tokens), forward(tokens), atol=1e-5), "TorchScript and safetensors forwards differ"
    text = list(b"the ")
    for _ in range(24):
        text.append(int(m(torch.tensor([text[-16:]]))[0, -1].argmax()))
expected = open(greedy_file, "rb").read().rstrip(b"\n")
assert bytes(text) == expected, (bytes(text), expected)
# The user's own model, trained by gossamer and written back: PyTorch runs it.
u = torch.jit.load(trained_user_model)
assert u(torch.zeros(2, 16, dtype=torch.long)).shape == (2, 16, 256)
print("PyTorch read the exported weights and model")
PY
echo "user files: all checks passed"
