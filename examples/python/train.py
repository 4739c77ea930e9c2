#!/usr/bin/python3
"""A plain PyTorch training loop of a small character-level transformer, made decentralized by Gossamer.

The lines marked `# gossamer` are all it takes; with --alone they are skipped and the same loop
trains the same model on its own. Run three peers of one run on this machine:

    PYTHONPATH=build/python /usr/bin/python3 examples/python/train.py --data input.txt --out runs/p0 --peers 3 &
    # once runs/p0/address exists:
    PYTHONPATH=build/python /usr/bin/python3 examples/python/train.py --data input.txt --out runs/p1 --join $(head -1 runs/p0/address) &
    PYTHONPATH=build/python /usr/bin/python3 examples/python/train.py --data input.txt --out runs/p2 --join $(head -1 runs/p0/address)

Each peer trains its shard of the text (its bytes are the tokens) and prints its losses; the runs/pN
folders hold what `gossamer peer` writes (metrics.jsonl, checkpoint.bin, summary.json).
"""

import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class CharModel(nn.Module):
    """A causal transformer over bytes: embeddings, pre-norm encoder layers under a causal mask, a head."""

    def __init__(self, context=64, width=64, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")), diagonal=1))

    def forward(self, x):
        t = x.size(1)
        h = self.embed(x) + self.position[:t]
        for layer in self.layers:
            h = layer(h, src_mask=self.mask[:t, :t])
        return self.head(self.norm(h))


def batch(data, step, shard, shards, size, context, seed):
    """`size` windows of the shard's part of `data`, drawn from (seed, shard, step): the same step gives
    the same batch, so a resumed peer goes on where it was."""
    part = len(data) // shards
    lo = shard * part
    g = torch.Generator().manual_seed(seed * 1_000_003 + shard * 7919 + step)
    starts = torch.randint(lo, lo + part - context - 1, (size,), generator=g)
    windows = torch.stack([data[s:s + context + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def evaluate(model, val, context):
    model.eval()
    with torch.no_grad():
        n = (len(val) - 1) // context
        x = val[:n * context].view(n, context)[:16]
        y = val[1:n * context + 1].view(n, context)[:16]
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).item()
    model.train()
    return loss


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a text file (its bytes are the tokens)")
    p.add_argument("--steps", type=int, default=300, help="inner steps of the run")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1, help="the model's initialization: the same on every peer")
    p.add_argument("--log", help="write one JSON line per step (step, loss, and val_loss where evaluated) here")
    p.add_argument("--alone", action="store_true", help="plain PyTorch: no Gossamer, one process")
    p.add_argument("--method", default="diloco", help="the outer method (diloco, streaming_diloco, noloco, co2, sparseloco, ddp, ...)")
    p.add_argument("--inner-steps", type=int, default=20, help="H: inner steps per round")
    p.add_argument("--codec", default="fp4_e2m1", help="codec of what the peers exchange")
    p.add_argument("--out", help="this peer's run folder")
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--join", action="append", default=[], help="HOST:PORT of a running peer (the first peer joins none)")
    p.add_argument("--peers", type=int, default=1, help="the first peer's: peers ready before training starts")
    p.add_argument("--key", help="the run's key file (gossamer keygen)")
    p.add_argument("--resume", action="store_true", help="restart from the run folder's checkpoint")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: at the end)")
    p.add_argument("--eval-every", type=int, default=100)
    args = p.parse_args()

    text = open(args.data, "rb").read()
    data = torch.tensor(list(text), dtype=torch.long)
    split = int(len(data) * 0.95)
    train_data, val_data = data[:split], data[split:]

    torch.manual_seed(args.seed)
    model = CharModel(context=args.context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    log = open(args.log, "w") if args.log else None

    outer = None
    if not args.alone:
        import gossamer  # gossamer
        peer = gossamer.Peer(out=args.out, listen=args.listen, join=args.join, key=args.key, wait_for=args.peers,  # gossamer
                             resume=args.resume)  # gossamer
        settings = {"inner_steps": args.inner_steps} if args.method not in ("ddp", "local") else {}
        if args.method in ("diloco", "streaming_diloco", "co2", "muloco"):
            settings["codec"] = args.codec
        outer = gossamer.Outer.of(args.method)(  # gossamer
            model, optimizer, peer, steps=args.steps, evaluate=lambda: evaluate(model, val_data, args.context),  # gossamer
            train={"eval_every": args.eval_every, "checkpoint_every": args.checkpoint_every}, **settings)  # gossamer

    step = outer.next_step if outer else 1  # gossamer
    shard, shards = (outer.shard, outer.shards) if outer else (0, 1)  # gossamer
    started = time.time()
    while (outer.training if outer else step <= args.steps):  # gossamer
        lr = args.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / args.steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = batch(train_data, step, shard, shards, args.batch, args.context, args.seed)
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if outer is None or outer.method != "ddp":  # (ddp steps the optimizer itself, after averaging)
            optimizer.step()
        record = {"step": step, "loss": loss.item()}
        if outer is None and (step % args.eval_every == 0 or step == args.steps):
            record["val_loss"] = evaluate(model, val_data, args.context)
        if log:
            log.write(json.dumps(record) + "\n")
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f} ({time.time() - started:.1f} s)", flush=True)
        if outer:
            outer.step(loss=loss.item(), tokens=x.numel())  # gossamer
            step = outer.next_step  # gossamer
        else:
            step += 1

    if outer:
        result = outer.result  # gossamer
        print(json.dumps({"steps": result["steps"], "rounds": result["rounds"], "final_val_loss": result["final_val_loss"],
                          "shared_digest": result["shared_digest"]}), flush=True)
        outer.close()
    else:
        print(json.dumps({"steps": args.steps, "final_val_loss": evaluate(model, val_data, args.context)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
