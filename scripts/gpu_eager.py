#!/usr/bin/env python3
"""Plain PyTorch eager reference for `gossamer bench model` on a GPU (scripts/gpu_check.sh).

The same GPT as Gossamer's built-in one (GPT-2's shapes: learned positions, pre-norm blocks, tanh
GELU, tied head, biases; GPT-2 initialization), trained the way a PyTorch user writes it: bf16
autocast, F.scaled_dot_product_attention, torch.optim.AdamW with PyTorch's default implementation
on CUDA, clip_grad_norm_ at 1.0, loss.item() every step. Prints tokens/s (the median of timed
blocks) and the model FLOPs utilisation: 6 N + 12 L T d FLOPs per token (N: parameters without the
position table; PaLM's attention term) over the GPU's dense bf16 peak and over a measured
8192^3 bf16 matrix product.

Usage: gpu_eager.py --preset gpt2-124m --batch 16 [--steps 10 --rounds 3 --vocab 50257 --fused]
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {"gpt2-124m": (12, 768, 12), "gpt2-350m": (24, 1024, 16), "tiny": (2, 64, 2)}


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, d)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, d, heads, vocab, context):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


def matmul_rate(device):
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="gpt2-124m", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--steps", type=int, default=10, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=3, help="timed blocks (the median is reported)")
    ap.add_argument("--fused", action="store_true", help="torch.optim.AdamW(fused=True) instead of PyTorch's default implementation")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="the GPU's dense bf16 peak (H100/H200 SXM: 989.4)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_eager.py: no CUDA device visible to PyTorch")
    dev = torch.device("cuda")
    layers, d, heads = PRESETS[a.preset]
    torch.manual_seed(1234)
    model = Gpt(layers, d, heads, a.vocab, a.context).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if a.fused else {}))
    corpus = torch.randint(0, min(a.vocab, 256), (4_000_000,), dtype=torch.long)
    gen = torch.Generator().manual_seed(1)

    def step():
        starts = torch.randint(0, corpus.numel() - a.context - 1, (a.batch,), generator=gen)
        idx = starts[:, None] + torch.arange(a.context + 1)[None, :]
        chunk = corpus[idx]
        x, y = chunk[:, :-1].to(dev), chunk[:, 1:].to(dev)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    step()  # warm-up
    rates = []
    for _ in range(a.rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
        rates.append(a.steps * a.batch * a.context / (time.perf_counter() - t))
    n_params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    flops_per_token = 6 * n_params + 12 * layers * a.context * d
    rate = statistics.median(rates)
    measured = matmul_rate(dev)
    print(f"eager{' (fused AdamW)' if a.fused else ''} {a.preset}: {n_params / 1e6:.1f}M parameters (without positions), batch {a.batch} x {a.context}, "
          f"{rate:.0f} tok/s (blocks: {', '.join(f'{r:.0f}' for r in rates)}), {1e3 * a.batch * a.context / rate:.1f} ms/step; "
          f"MFU {100 * rate * flops_per_token / (a.peak_tflops * 1e12):.1f}% of {a.peak_tflops:.0f} TFLOP/s, "
          f"{100 * rate * flops_per_token / measured:.1f}% of the measured bf16 product rate {measured / 1e12:.0f} TFLOP/s; "
          f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
