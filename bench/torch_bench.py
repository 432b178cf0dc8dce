#!/usr/bin/env python3
"""bench/torch_bench.py - PyTorch's tokens/s for dp_bench's GPT, for comparison.

Times training steps (forward, cross-entropy, backward, global-norm
clipping, AdamW) of the same GPT as dp_bench (bench/torch_gpt.py's model:
nanoGPT's architecture) on random tokens with the same shapes, in one
process. Prints the median step time and tokens/s of --steps timed steps
after --warmup untimed ones. --grid runs every combination of torch
threads 1, 2 and OPENBLAS_NUM_THREADS 1, 2 (each in a fresh process, since
OpenBLAS reads its variable at load time) and names the best.

--device cuda times it on the GPU (CUDA synchronised around each step;
float32 without TF32, like dp_bench without --tf32; --tf32 allows it, like
dp_bench --tf32).

--precision bf16 runs forward and loss under torch.autocast(dtype=bfloat16):
PyTorch's mixed precision, float32 weights and optimizer with bfloat16
matrix products, the counterpart of dp_bench --precision bf16.

--sdpa forms the attention with F.scaled_dot_product_attention (fused
kernels: FlashAttention or cuDNN's on a GPU) instead of the explicit
(T,T) matrix; --compile runs the model through torch.compile (the warmup
steps pay for the compilation). With --peak-tflops T it also prints the
MFU by llm.c's count (6N + 6LCT FLOPs per token), as dp_bench does.

Usage (Debian's python3-torch):
  /usr/bin/python3 bench/torch_bench.py --grid
  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/torch_bench.py --threads 1
  python3 bench/torch_bench.py --device cuda
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import GPT  # noqa: E402  (the same model as the trainer comparison)


def run(a):
    # Exit status 3: this PyTorch lacks what was asked for (gpu-check skips).
    if a.sdpa and not hasattr(F, "scaled_dot_product_attention"):
        print(f"torch_bench.py: --sdpa needs PyTorch >= 2.0 (this is {torch.__version__})",
              file=sys.stderr)
        sys.exit(3)
    if a.compile and not hasattr(torch, "compile"):
        print(f"torch_bench.py: --compile needs PyTorch >= 2.0 (this is {torch.__version__})",
              file=sys.stderr)
        sys.exit(3)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("torch_bench.py: --device cuda but torch sees no CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    model = GPT(a.vocab, a.context, a.layers, a.heads, a.dim, sdpa=a.sdpa).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    step_model = torch.compile(model) if a.compile else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(a.seed)
    times = []
    for step in range(a.warmup + a.steps):
        x = torch.randint(a.vocab, (a.batch_size, a.context), generator=g).to(dev)
        y = torch.randint(a.vocab, (a.batch_size, a.context), generator=g).to(dev)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16,
                            enabled=a.precision == "bf16"):
            loss = F.cross_entropy(step_model(x).view(-1, a.vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    tps = a.batch_size * a.context / med
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    how = a.precision + (", sdpa" if a.sdpa else "") + (", compiled" if a.compile else "")
    # llm.c's count: 6 N (forward 2 N, backward 4 N) + 6 L C T (the attention)
    fpt = 6 * n_params + 6 * a.layers * a.dim * a.context
    if a.peak_tflops:
        print(f"model FLOPs per token {fpt / 1e9:.4g} GFLOP; {tps * fpt / 1e12:.4g} model "
              f"TFLOP/s, MFU {100 * tps * fpt / (a.peak_tflops * 1e12):.1f}% of "
              f"{a.peak_tflops:g} TFLOP/s")
    if dev.type == "cuda":
        print(f"peak memory {torch.cuda.max_memory_allocated(dev) / 2**20:.0f} MiB")
    print(f"{where}: {how}, torch threads {a.threads} OPENBLAS_NUM_THREADS "
          f"{os.environ.get('OPENBLAS_NUM_THREADS', '-')}: step {1e3 * med:.1f} ms median "
          f"(min {1e3 * min(times):.1f}, max {1e3 * max(times):.1f}), {tps:.0f} tokens/s",
          flush=True)
    return tps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab-size", "--vocab", dest="vocab", type=int, default=8192)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: autocast to bfloat16 (default fp32)")
    ap.add_argument("--tf32", action="store_true",
                    help="let CUDA matrix products use TF32 (default off)")
    ap.add_argument("--sdpa", action="store_true",
                    help="attention by F.scaled_dot_product_attention (fused kernels)")
    ap.add_argument("--compile", action="store_true", help="the model through torch.compile")
    ap.add_argument("--peak-tflops", type=float, default=0.0,
                    help="the hardware's peak TFLOP/s: prints the MFU")
    ap.add_argument("--grid", action="store_true",
                    help="torch threads {1,2} x OPENBLAS_NUM_THREADS {1,2}, best reported")
    a = ap.parse_args()
    if not a.grid:
        run(a)
        return
    best = None
    args = [x for x in sys.argv[1:] if x != "--grid"]
    for th in (1, 2):
        for ob in (1, 2):
            env = dict(os.environ, OPENBLAS_NUM_THREADS=str(ob))
            out = subprocess.run([sys.executable, __file__, *args, "--threads", str(th)], env=env,
                                 check=True, capture_output=True, text=True).stdout
            print(out.strip(), flush=True)
            tps = float(out.rsplit(",", 1)[1].split()[0])
            if best is None or tps > best[0]:
                best = (tps, th, ob)
    print(f"best: {best[0]:.0f} tokens/s with torch threads {best[1]}, "
          f"OPENBLAS_NUM_THREADS {best[2]}")


if __name__ == "__main__":
    main()
