#!/usr/bin/env python3
"""bench/torch_gpt.py - the PyTorch side of lm_train's speed and quality comparison.

Trains the same GPT (nanoGPT's architecture: pre-LN blocks, fused qkv,
GELU tanh MLP, tied LM head, biases, no dropout) with the same recipe as
`lm_train` on one process: char tokenizer over the corpus, first 90% train,
random windows of context+1 tokens, AdamW (decay on 2-D tensors only),
linear warmup then cosine decay, global-norm clipping. At the end it
prints the loss over the whole validation split computed exactly as
`lm_train --eval-only` does (consecutive windows at multiples of the
context, the last incomplete one dropped) and the wall time.

With --load CKPT it trains nothing: it reads a checkpoint lm_train wrote
(safetensors, nanoGPT's tensor names; parsed here with the standard
library so no extra package is needed), loads it into this model with
strict name and shape checks, and prints the same whole-split validation
loss, to compare with `lm_train --resume CKPT --eval-only`.

Usage (Debian's python3-torch):
  /usr/bin/python3 bench/torch_gpt.py --data ../shared/data/tinyshakespeare.txt \
      --threads 1 --steps 2000
  /usr/bin/python3 bench/torch_gpt.py --data ../shared/data/tinyshakespeare.txt --load ck.st
"""
import argparse
import json
import math
import os
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H, sdpa=False):
        super().__init__()
        self.H = H
        self.sdpa = sdpa  # F.scaled_dot_product_attention (fused kernels) instead of the matrix
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.H)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, L, H, C, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H, sdpa) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if n.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


def read_safetensors(path):
    """(tensors by name, __metadata__) of a safetensors file: u64 LE header
    length, JSON header, then the raw little-endian data."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            raise SystemExit(f"{name}: dtype {t['dtype']}, expected F32")
        b, e = t["data_offsets"]
        buf = bytearray(raw[8 + n + b:8 + n + e])
        out[name] = torch.frombuffer(buf, dtype=torch.float32).reshape(t["shape"])
    return out, meta


def load_dp_checkpoint(model, path, L):
    """Loads lm_train's checkpoint (nanoGPT's names) into model, strictly."""
    tensors, meta = read_safetensors(path)
    ours = {"wte.weight": "transformer.wte.weight", "wpe.weight": "transformer.wpe.weight",
            "ln_f.weight": "transformer.ln_f.weight", "ln_f.bias": "transformer.ln_f.bias"}
    for i in range(L):
        for mine, theirs in (("ln_1", "ln_1"), ("c_attn", "attn.c_attn"), ("c_proj", "attn.c_proj"),
                             ("ln_2", "ln_2"), ("c_fc", "mlp.c_fc"), ("mlp_proj", "mlp.c_proj")):
            for kind in ("weight", "bias"):
                ours[f"h.{i}.{mine}.{kind}"] = f"transformer.h.{i}.{theirs}.{kind}"
    state = {mine: tensors[theirs] for mine, theirs in ours.items()}
    model.load_state_dict(state, strict=True)  # raises on any missing name or shape mismatch
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=12)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta2", type=float, default=0.99)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--load", help="evaluate lm_train's checkpoint instead of training")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    text = open(a.data, "rb").read()
    vocab = sorted(set(text))
    lut = {b: i for i, b in enumerate(vocab)}
    data = torch.tensor([lut[b] for b in text], dtype=torch.long)
    n_train = len(data) * 9 // 10
    train, val = data[:n_train], data[n_train:]
    T, B = a.context, a.batch_size

    if a.load:
        _, meta = read_safetensors(a.load)
        a.layers, a.heads, a.dim = int(meta["n_layer"]), int(meta["n_head"]), int(meta["n_embd"])
        T = a.context = int(meta["block_size"])
        a.steps = 0
        if int(meta["vocab_size"]) != len(vocab):
            raise SystemExit(f"{a.load}: vocabulary {meta['vocab_size']} != {len(vocab)} of {a.data}")
    model = GPT(len(vocab), T, a.layers, a.heads, a.dim)
    if a.load:
        load_dp_checkpoint(model, a.load, a.layers)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, a.beta2), eps=1e-8)

    def lr_at(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        if step >= a.steps:
            return a.min_lr
        r = (step - a.warmup) / max(1, a.steps - a.warmup)
        return a.min_lr + 0.5 * (1 + math.cos(math.pi * r)) * (a.lr - a.min_lr)

    t0 = time.time()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        ix = torch.randint(len(train) - T - 1, (B,))
        x = torch.stack([train[i:i + T] for i in ix])
        y = torch.stack([train[i + 1:i + T + 1] for i in ix])
        loss = F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        if step % 250 == 0 or step == a.steps - 1:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    train_s = time.time() - t0

    # Whole validation split: windows at 0, T, 2T, ...; each T+1 tokens.
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        n_win = (len(val) - 1) // T
        for first in range(0, n_win, B):
            rows = range(first, min(n_win, first + B))
            x = torch.stack([val[i * T:i * T + T] for i in rows])
            y = torch.stack([val[i * T + 1:i * T + T + 1] for i in rows])
            total += F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1), reduction="sum").item()
            count += y.numel()
    wall = time.time() - t0
    print(f"torch threads {a.threads} OPENBLAS_NUM_THREADS {os.environ.get('OPENBLAS_NUM_THREADS', '-')}: "
          f"train {train_s:.1f} s ({a.steps * B * T / train_s:.0f} tokens/s), wall {wall:.1f} s")
    print(f"final val_loss {total / count:.{6 if a.load else 4}f}")


if __name__ == "__main__":
    main()
