#!/usr/bin/python3
"""Writes tests/data/gpt_reference.bin: a PyTorch float64 reference for test_gpt.

A GPT-2 with nanoGPT's architecture (token + learned position embeddings,
pre-LayerNorm blocks of causal multi-head attention with a fused qkv
projection and a GELU(tanh) MLP, a final LayerNorm, the LM head tied to the
token embedding; biases on, LayerNorm eps 1e-5, no dropout), written here in
plain PyTorch and evaluated in float64 for a tiny configuration:
V=65, C=32, L=2, NH=4, T=block_size=16, B=3.

Parameters come from torch.manual_seed(SEED), all of them random (LayerNorm
gains near 1, biases non-zero, so every term of every layer is exercised),
rounded to float16 so that they are stored exactly in 2 bytes each. The mean
cross-entropy over all valid targets (a few are -1, ignore_index=-1) is
back-propagated to every parameter.

Run from anywhere:  /usr/bin/python3 tests/gen_gpt_reference.py

File format (all little-endian):
    char    magic[8]      "DPGPTREF"
    uint32  version       1
    uint32  V, block_size, n_layer, n_head, n_embd, B     (T = block_size)
    int32   tokens[B*T]
    int32   targets[B*T]  (-1 = ignored)
    float64 loss          mean over valid targets
    float32 logits[B*T*V]
    uint32  n_tensors     in the model's table order
    per tensor:
        uint32  name_len, then name_len bytes of the name (no NUL)
        uint64  numel
        float16 param[numel]   (IEEE binary16, the exact parameter values)
        float32 grad[numel]    d loss / d param, rounded from float64
"""
import math
import os
import struct

import torch
import torch.nn.functional as F

SEED = 20240607
V, BS, L, NH, C, B = 65, 16, 2, 4, 32, 3
T = BS


def tensor_table():
    """(name, shape) in dp's table order (nanoGPT's state-dict names)."""
    t = [("transformer.wte.weight", (V, C)), ("transformer.wpe.weight", (BS, C))]
    for i in range(L):
        h = f"transformer.h.{i}."
        t += [
            (h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)),
            (h + "attn.c_attn.weight", (3 * C, C)), (h + "attn.c_attn.bias", (3 * C,)),
            (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
            (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)),
            (h + "mlp.c_fc.weight", (4 * C, C)), (h + "mlp.c_fc.bias", (4 * C,)),
            (h + "mlp.c_proj.weight", (C, 4 * C)), (h + "mlp.c_proj.bias", (C,)),
        ]
    t += [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]
    return t


def make_params(gen):
    params = {}
    for name, shape in tensor_table():
        n = torch.randn(shape, generator=gen, dtype=torch.float64)
        if len(shape) == 2:
            x = 0.1 * n            # larger than nanoGPT's 0.02: non-uniform attention
        elif name.endswith(".weight"):
            x = 1.0 + 0.1 * n      # LayerNorm gains near 1
        else:
            x = 0.1 * n            # biases
        # Round to float16 so the file holds the exact values in 2 bytes.
        params[name] = x.to(torch.float16).to(torch.float64).requires_grad_(True)
    return params


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gpt_forward(p, idx):
    b, t = idx.shape
    hs = C // NH
    x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][:t]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for i in range(L):
        h = f"transformer.h.{i}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps=1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"].T + p[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(b, t, NH, hs).transpose(1, 2)
        k = k.view(b, t, NH, hs).transpose(1, 2)
        v = v.view(b, t, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, C)
        x = x + y @ p[h + "attn.c_proj.weight"].T + p[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps=1e-5)
        m = gelu_tanh(m @ p[h + "mlp.c_fc.weight"].T + p[h + "mlp.c_fc.bias"])
        x = x + m @ p[h + "mlp.c_proj.weight"].T + p[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps=1e-5)
    return x @ p["transformer.wte.weight"].T  # tied LM head


def main():
    gen = torch.Generator().manual_seed(SEED)
    params = make_params(gen)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)
    for r, c in [(0, 3), (1, 0), (2, 15), (2, 7)]:
        targets[r, c] = -1

    logits = gpt_forward(params, tokens)
    loss = F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-1)
    loss.backward()

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gpt_reference.bin")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    table = tensor_table()
    with open(out, "wb") as f:
        f.write(b"DPGPTREF")
        f.write(struct.pack("<7I", 1, V, BS, L, NH, C, B))
        f.write(tokens.to(torch.int32).numpy().astype("<i4").tobytes())
        f.write(targets.to(torch.int32).numpy().astype("<i4").tobytes())
        f.write(struct.pack("<d", loss.item()))
        f.write(logits.detach().to(torch.float32).numpy().astype("<f4").tobytes())
        f.write(struct.pack("<I", len(table)))
        for name, _ in table:
            p = params[name]
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)))
            f.write(nb)
            f.write(struct.pack("<Q", p.numel()))
            f.write(p.detach().to(torch.float16).numpy().astype("<f2").tobytes())
            f.write(p.grad.to(torch.float32).numpy().astype("<f4").tobytes())
    print(f"wrote {out}: loss {loss.item():.10f}, {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main()
