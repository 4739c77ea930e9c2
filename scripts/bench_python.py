#!/usr/bin/python3
"""Benchmarks of the Python package (docs/benchmarks.md, "The Python package").

  bench_python.py overhead --data FILE [--steps 400] [--inner-steps 50]
      One process, two copies of examples/python/train.py's model from the same seed, stepped in
      turns so that both see the same load: the plain PyTorch step, then the same step handed to a
      Gossamer peer (diloco, one peer). Prints the time per step of each (the peer's apart for the
      steps between rounds and the steps that ran a round) and their ratio.

  bench_python.py curve --data FILE [--peers 3] [--steps 600] [--inner-steps 50] [--methods diloco,streaming_diloco]
      The example across --peers processes for each method, and alone (plain PyTorch) for the same
      tokens (--peers times the steps; and the steps of one peer with the peers' batches together,
      what synchronous data parallelism computes): the validation loss each reaches and its training
      loss by tokens seen, the peers' shared state checked identical.

Run with PYTHONPATH=build/python (the package) from the repository's root.
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "python", "train.py")


def load_example():
    spec = importlib.util.spec_from_file_location("example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def overhead(args):
    import torch
    import torch.nn.functional as F

    import gossamer

    ex = load_example()
    torch.set_num_threads(1)  # both loops on one core each turn, as a peer per core would run
    data = torch.tensor(list(open(args.data, "rb").read()), dtype=torch.long)
    models, opts = [], []
    for _ in range(2):
        torch.manual_seed(1)
        models.append(ex.CharModel(context=64))
        opts.append(torch.optim.AdamW(models[-1].parameters(), lr=1e-3))
    out = tempfile.mkdtemp(prefix="gossamer-bench-py-")
    peer = gossamer.Peer(out=os.path.join(out, "peer"), log_level="warn")
    outer = gossamer.DiLoCo(models[1], opts[1], peer, steps=args.steps, inner_steps=args.inner_steps, codec="int8")

    def step(i, which):
        model, opt = models[which], opts[which]
        x, y = ex.batch(data, i, 0, 1, 16, 64, 1)
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    plain, between, rounds = [], [], []
    for i in range(1, args.steps + 1):
        t0 = time.perf_counter()
        step(i, 0)
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        loss = step(i, 1)
        outer.step(loss=loss.item(), tokens=16 * 64)
        (rounds if i % args.inner_steps == 0 else between).append(time.perf_counter() - t0)
    outer.close()
    skip = args.steps // 10  # warm-up
    p, b = statistics.median(plain[skip:]), statistics.median(between[skip:])
    print(json.dumps({"steps": args.steps, "plain_ms": round(1e3 * p, 3), "gossamer_between_rounds_ms": round(1e3 * b, 3),
                      "ratio": round(b / p, 4), "plain_mean_ms": round(1e3 * statistics.mean(plain[skip:]), 3),
                      "gossamer_between_mean_ms": round(1e3 * statistics.mean(between[skip:]), 3),
                      "round_step_ms": round(1e3 * statistics.median(rounds), 3), "rounds": len(rounds)}))


def read_log(path):
    return [json.loads(line) for line in open(path)]


def curve(args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    work = tempfile.mkdtemp(prefix="gossamer-curve-")
    common = ["--data", args.data, "--inner-steps", str(args.inner_steps), "--eval-every", str(args.steps), "--batch", "16"]
    results = {}
    for method in args.methods.split(","):
        procs = []
        for i in range(args.peers):
            out = os.path.join(work, f"{method}{i}")
            extra = ["--peers", str(args.peers)] if i == 0 else ["--join", first_address]
            cmd = [sys.executable, EXAMPLE, "--out", out, "--method", method, "--steps", str(args.steps), "--log", out + ".jsonl"] + common + extra
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=open(out + ".log", "w"), text=True))
            if i == 0:
                first_address = wait_address(os.path.join(out, "address"))
        t0 = time.time()
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"{method}: a peer failed; logs in {work}")
        finals = [json.loads(o.strip().splitlines()[-1]) for o in outs]
        digests = {f["shared_digest"] for f in finals}
        results[method] = {"val_loss": finals[0]["final_val_loss"], "identical_shared_state": len(digests) == 1, "seconds": round(time.time() - t0, 1),
                           "logs": [os.path.join(work, f"{method}{i}.jsonl") for i in range(args.peers)]}
        print(f"{method}: {args.peers} peers, val loss {finals[0]['final_val_loss']:.4f}, identical shared state: {len(digests) == 1}", flush=True)
    def alone(name, steps, batch, what):
        log = os.path.join(work, name + ".jsonl")
        t0 = time.time()
        run = subprocess.run([sys.executable, EXAMPLE, "--alone", "--data", args.data, "--steps", str(steps), "--batch", str(batch),
                              "--eval-every", str(steps), "--log", log], env=env, capture_output=True, text=True, check=True)
        final = json.loads(run.stdout.strip().splitlines()[-1])
        results[name] = {"val_loss": final["final_val_loss"], "seconds": round(time.time() - t0, 1), "logs": [log]}
        print(f"{name}: {what}, val loss {final['final_val_loss']:.4f}", flush=True)

    alone("alone", args.steps * args.peers, 16, f"{args.steps * args.peers} steps")
    # Alone with the peers' batches together: the steps of one peer, what synchronous data parallelism computes.
    alone("alone_wide", args.steps, 16 * args.peers, f"{args.steps} steps of {16 * args.peers} sequences")

    # Training loss by tokens seen (all peers' tokens together), in tenths of the run.
    tokens_per_step = 16 * 64
    total = args.steps * args.peers * tokens_per_step
    print("\ntraining loss by tokens seen (mean over each tenth of the run)")
    names = list(results)
    print("| tokens | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    series = {}
    for name in names:
        recs = [r for log in results[name]["logs"] for r in read_log(log)]
        scale = 1 if name == "alone" else args.peers  # (alone_wide's steps hold the peers' batches together)
        series[name] = [(r["step"] * tokens_per_step * scale, r["loss"]) for r in recs]
    for tenth in range(10):
        lo, hi = total * tenth / 10, total * (tenth + 1) / 10
        row = []
        for name in names:
            vals = [loss for tok, loss in series[name] if lo < tok <= hi]
            row.append(f"{statistics.mean(vals):.3f}" if vals else "-")
        print(f"| {hi / 1e6:.2f}M | " + " | ".join(row) + " |")
    print("\n" + json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "logs"} for k, v in results.items()}))


def wait_address(path, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).readline().strip()
        time.sleep(0.1)
    raise SystemExit(f"{path} did not appear")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--data", required=True)
    o.add_argument("--steps", type=int, default=400)
    o.add_argument("--inner-steps", type=int, default=50)
    c = sub.add_parser("curve")
    c.add_argument("--data", required=True)
    c.add_argument("--peers", type=int, default=3)
    c.add_argument("--steps", type=int, default=600)
    c.add_argument("--inner-steps", type=int, default=50)
    c.add_argument("--methods", default="diloco,streaming_diloco")
    args = p.parse_args()
    overhead(args) if args.what == "overhead" else curve(args)


if __name__ == "__main__":
    main()
