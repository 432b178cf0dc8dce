#!/usr/bin/env python3
"""Writes tests/data/hf_gpt2_keys.txt: what transformers' save_pretrained
writes for a GPT2LMHeadModel of test_gpt_hf's reference shape (V=65,
n_positions=16, n_embd=32, n_layer=2, n_head=4): the safetensors
metadata's "format" and every tensor's name and shape, one per line, in
name order. test_gpt_hf checks dp_gpt_export_hf's file against it, so the
layout dp writes is the one transformers itself writes (no Python at test
time).

Needs torch, transformers and safetensors (pip install); run from
anywhere:  python3 tests/gen_hf_gpt2_keys.py
"""
import os
import tempfile

from safetensors import safe_open
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    cfg = GPT2Config(vocab_size=65, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    with tempfile.TemporaryDirectory() as d:
        GPT2LMHeadModel(cfg).save_pretrained(d)
        with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
            lines = ["format %s" % f.metadata().get("format")]
            for k in sorted(f.keys()):
                lines.append("%s %s" % (k, ",".join(str(x) for x in f.get_slice(k).get_shape())))
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf_gpt2_keys.txt")
    with open(out, "w") as o:
        o.write("\n".join(lines) + "\n")
    print("wrote %s (%d tensors)" % (out, len(lines) - 1))


if __name__ == "__main__":
    main()
