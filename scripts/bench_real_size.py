#!/usr/bin/env python3
"""Real peers at a real model size on one machine, every figure beside what Gossamer predicts.

PEERS real `gossamer peer` processes on loopback train a preset (gpt2-124m by default, GPT-2's
50257-token vocabulary) for ROUNDS outer rounds of METHOD (diloco with fp4_e2m1 pseudo-gradients, or
streaming_diloco), and optionally one more peer joins after the first round. It prints, side by side:

- each peer's peak resident set (/usr/bin/time) against `gossamer plan --memory`'s peak per worker;
- the step time in the run against `gossamer bench model`'s step time alone on the same threads,
  scaled by how many peers share the cores (peers x threads / cores);
- the round's time (the loop's time per round) against compute alone and against the prediction
  H x step + the sync measured, with the bytes each peer sent against `gossamer plan`'s bits per sync;
- the newcomer's catch-up (state fetch and transfer time, snapshot bytes), and the checkpoint's write
  time and size (from the peers' logs) and its read time (the newcomer resumed once from it).

Usage: bench_real_size.py GOSSAMER [--preset gpt2-124m] [--method diloco] [--peers 4] [--context 128]
         [--batch 2] [--inner-steps 4] [--rounds 3] [--threads 1] [--join] [--out DIR]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gossamer")
    ap.add_argument("--preset", default="gpt2-124m")
    ap.add_argument("--method", default="diloco", choices=["diloco", "streaming_diloco"])
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--inner-steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--join", action="store_true", help="one more peer joins after the first round")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    g = a.gossamer
    out = a.out or tempfile.mkdtemp(prefix="bench-real-size-")
    os.makedirs(out, exist_ok=True)
    steps = a.inner_steps * a.rounds
    sets = {
        "model.preset": a.preset, "data.vocab_size": 50257, "model.context": a.context, "train.batch_size": a.batch,
        "outer.method": a.method, "diloco.codec": "fp4_e2m1", "streaming_diloco.codec": "fp4_e2m1",
        "diloco.inner_steps": a.inner_steps, "streaming_diloco.inner_steps": a.inner_steps, "train.steps": steps,
        "train.eval_every": steps, "train.eval_batches": 1, "train.warmup_steps": 1, "train.checkpoint_every": 0,
        "train.threads": a.threads, "data.synthetic.bytes": 2_000_000,
    }
    set_args = [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    cores = os.cpu_count()

    # Predictions and the step time alone.
    plan = run([g, "plan", "--memory"] + set_args).stdout
    row = next((l.split() for l in plan.splitlines() if l.startswith(a.method + " ")), None)
    predicted_peak = " ".join(row[-3:-1]) if row else "?"
    bench = run([g, "bench", "model", "--no-bf16", "--steps", "1", "--rounds", "3"] + set_args).stdout
    m = re.search(r"median gpt fp32: ([0-9.]+) tok/s", bench)
    alone = a.batch * a.context / float(m.group(1)) if m else float("nan")
    share = max(1.0, a.peers * a.threads / cores)
    shape = re.search(r"bench model: ([0-9.]+)M parameters \(([0-9]+) layers", bench)
    if not shape:
        sys.exit(f"gossamer bench model printed no model line:\n{bench[-500:]}")
    n_params, layers = float(shape.group(1)) * 1e6, int(shape.group(2))
    sync = run([g, "plan", "--params", str(n_params), "--layers", str(layers), "--step-time", f"{alone * share:.3f}",
                "--workers", str(a.peers), "--inner-steps", str(a.inner_steps), "--codec", "fp4_e2m1",
                "--streaming-codec", "fp4_e2m1"]).stdout
    bits = next((float(l.split()[3]) for l in sync.splitlines() if l.startswith(a.method + " ")), float("nan"))

    # The run.
    t0 = time.time()
    procs = []

    def start(i, extra):
        d = os.path.join(out, f"p{i}")
        log = open(os.path.join(out, f"p{i}.log"), "w")
        cmd = ["/usr/bin/time", "-f", "%M", "-o", os.path.join(out, f"p{i}.rss"), g, "peer", "--listen", "127.0.0.1:0",
               "--out", d, "--dead-after", "30"] + extra
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))

    start(0, ["--wait-for", str(a.peers)] + set_args)
    addr = os.path.join(out, "p0", "address")
    while not (os.path.exists(addr) and os.path.getsize(addr) > 0):
        if procs[0].poll() is not None:
            sys.exit(f"the first peer did not start: see {out}/p0.log")
        time.sleep(0.2)
    first = open(addr).read().split()[0]
    for i in range(1, a.peers):
        start(i, ["--join", first])
    joiner = None
    if a.join:  # after the first round has closed on peer 0
        metrics = os.path.join(out, "p0", "metrics.jsonl")
        while procs[0].poll() is None:
            if os.path.exists(metrics) and any(json.loads(l).get("rounds", 0) >= 1 for l in open(metrics) if l.strip()):
                break
            time.sleep(0.5)
        start(a.peers, ["--join", first, "--join-timeout", "600"])
        joiner = a.peers
    codes = [p.wait() for p in procs]
    wall = time.time() - t0

    def summary(i):
        try:
            return json.load(open(os.path.join(out, f"p{i}", "summary.json")))
        except OSError:
            return None

    n = len(procs)
    sums = [summary(i) for i in range(n)]
    rss = [int(open(os.path.join(out, f"p{i}.rss")).read().split()[-1]) * 1024 for i in range(n)]
    logs = [open(os.path.join(out, f"p{i}.log")).read() for i in range(n)]
    ckpt = [re.findall(r"checkpoint at step \d+: ([0-9.]+ [kMG]?B) written in ([0-9.]+) s", l) for l in logs]
    print(f"{a.preset} ({n_params / 1e6:.1f}M parameters), {a.method}, {a.peers} peers{' + 1 joining' if a.join else ''}, "
          f"context {a.context}, batch {a.batch}, H = {a.inner_steps}, {steps} steps, {a.threads} thread(s) each on {cores} cores; "
          f"exit codes {codes}; wall {wall:.0f} s; folder {out}")
    base = [s for i, s in enumerate(sums) if s and i != joiner]
    if not base:
        sys.exit("no summaries: see the logs")
    digests = {s.get("shared_digest") for s in sums if s}
    print(f"shared-state digests: {'identical' if len(digests) == 1 else 'DIFFER: ' + str(digests)}")
    print(f"peak resident set per peer: {', '.join(f'{r / 1e9:.2f} GB' for r in rss)}; plan --memory predicts {predicted_peak} "
          f"per worker (the growth over the process's start; a peer's runtime adds its own)")
    step_run = statistics.mean(s["compute_s"] / max(1, s["computed_steps"]) for s in base)
    print(f"step: {step_run:.2f} s in the run; bench model alone {alone:.2f} s on {a.threads} thread(s), x {share:.1f} for "
          f"{a.peers} peers sharing {cores} cores = {alone * share:.2f} s; run / expected {step_run / (alone * share):.3f}")
    rounds = max(s["rounds"] for s in base)
    loop = statistics.mean(s["loop_s"] for s in base) / max(1, rounds)
    blocked = statistics.mean(s["blocked_s"] for s in base) / max(1, rounds)
    per_round_steps = a.inner_steps if a.method == "diloco" else steps / max(1, rounds)
    sent = statistics.mean(s["bytes_sent"] - s.get("state_bytes_sent", 0) for s in base) / max(1, rounds)  # a donor's snapshot apart
    print(f"round: {loop:.2f} s ({rounds} rounds): {per_round_steps:g} steps x {step_run:.2f} s = {per_round_steps * step_run:.2f} s "
          f"of compute + {blocked:.2f} s waiting on the round; sent {sent / 1e6:.1f} MB per peer per round, "
          f"plan's bits per sync {bits / 8e6:.1f} MB")
    for i, c in enumerate(ckpt):
        if c:
            print(f"checkpoint p{i}: {c[-1][0]} written in {c[-1][1]} s")
            break
    if joiner is not None:
        s = sums[joiner]
        if s:
            print(f"newcomer: joined {s.get('join_rounds_behind', '?')} rounds behind; state fetch {s.get('state_fetch_s', 0):.1f} s "
                  f"(transfer {s.get('state_transfer_s', 0):.1f} s) for a {s.get('state_snapshot_bytes', 0) / 1e9:.2f} GB snapshot; "
                  f"{s['steps']} steps in {s['rounds']} rounds; finished {s['finished']}")
        else:
            print(f"newcomer: no summary (see {out}/p{joiner}.log)")
        # Read time: the newcomer's run folder resumed once, to its end (it has nothing left to do).
        # Its members are gone, so the resumed peer is stopped once it has said how long the read took.
        p = subprocess.Popen([g, "peer", "--listen", "127.0.0.1:0", "--out", os.path.join(out, f"p{joiner}"), "--resume"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        said = ""
        for line in p.stdout:
            said += line
            if "read in" in line or len(said) > 100_000:
                break
        p.kill()
        p.wait()
        m = re.search(r"checkpoint of step \d+ read in ([0-9.]+) s", said)
        print(f"checkpoint read (a resume from the newcomer's folder): {m.group(1) + ' s' if m else 'not logged: ' + said[-300:]}")


if __name__ == "__main__":
    main()
