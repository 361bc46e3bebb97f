#!/usr/bin/env python3
"""Attention: texc's fused (flash-style) operator, texc's schedule of the
five statements (`--knob flash=0`) and PyTorch's
torch.nn.functional.scaled_dot_product_attention, B = 1, H = 12, D = E = 64.

Usage: python3 benches/attention.py [--texc PATH] [--targets x86-avx512,x86-avx2]
       [--lengths 197,1024] [--threads 1,2] [--repeat 8]
Prints, per case, the best time of `--repeat` runs as GFLOP/s (4·B·H·L·S·D
operations) and the ratios fused / PyTorch and fused / unfused. PyTorch is
timed when `import torch` works (it is not a CI dependency).
"""
import argparse
import os
import re
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def texc_gflops(texc, target, length, threads, repeat, knobs):
    shape = f"B=1,H=12,L={length},S={length},D=64,E=64"
    cmd = [texc, "bench", os.path.join(ROOT, "benches/attention.tex"), "--target", target, "--shape", shape,
           "--threads", str(threads), "--repeat", str(repeat)] + knobs
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    best_ms = float(re.search(r"min ([0-9.]+)", out).group(1))
    return flops(length) / (best_ms * 1e6)


def flops(length):
    return 4 * 12 * length * length * 64


def torch_gflops(length, threads, repeat):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(threads)
    q, k, v = (torch.randn(1, 12, length, 64) for _ in range(3))
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v)
        best = min(best, time.perf_counter() - t)
    return flops(length) / best / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--texc", default=os.path.join(ROOT, "target", "release", "texc"))
    ap.add_argument("--targets", default="x86-avx512,x86-avx2")
    ap.add_argument("--lengths", default="197,1024")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=8)
    a = ap.parse_args()
    for length in map(int, a.lengths.split(",")):
        for threads in map(int, a.threads.split(",")):
            ref = torch_gflops(length, threads, a.repeat)
            for target in a.targets.split(","):
                fused = texc_gflops(a.texc, target, length, threads, a.repeat, [])
                unfused = texc_gflops(a.texc, target, length, threads, a.repeat, ["--knob", "flash=0"])
                torch_part = f"PyTorch {ref:6.1f}  fused/PyTorch {fused / ref:5.2f}" if ref else "PyTorch -"
                print(f"L=S={length:5d} threads={threads} {target:11s} fused {fused:6.1f} GFLOP/s  "
                      f"unfused {unfused:6.1f}  fused/unfused {fused / unfused:5.2f}  {torch_part}")


if __name__ == "__main__":
    main()
