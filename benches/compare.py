#!/usr/bin/env python3
"""texc against NumPy in one run: SGEMM 1024³, the ResNet-50 conv layer
(56×56, 64→64, 3×3, pad 1; NumPy does it as im2col + BLAS), softmax and
layer_norm over rows of 4096×1024. NumPy's OpenBLAS is capped to AVX2
(OPENBLAS_CORETYPE=Haswell) so that it compares with texc's x86-avx2.

Usage: python3 benches/compare.py [--threads 1,2] [--repeat 20]
       [--rounds 3] [--only sgemm] [--target x86-avx2] [--texc PATH]
       [--baseline PATH]
Prints one line per kernel and thread count: texc's median time and
GFLOP/s or GB/s, NumPy's, and the ratio texc/NumPy (higher is better).
Each is timed `--rounds` times, alternated, and the lowest median kept:
a VM's speed drifts between minutes, and only runs of the same minutes
compare. `--only` keeps the kernels whose name contains it.
`--texc` times a prebuilt binary instead of building this tree;
`--baseline` also times another texc binary (an older build) in the same
run and prints its time and the speed-up of texc over it.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXC = os.path.join(ROOT, "target", "release", "texc")

CASES = [
    # name, file, kernel, extra args, flops or None, bytes
    ("sgemm 1024³ (example schedule)", "examples/sgemm.tex", [], 2 * 1024**3, None),
    ("sgemm 1024³ (default schedule)", "benches/matmul.tex", [], 2 * 1024**3, None),
    ("conv 56×56 64→64 3×3 (example schedule)", "examples/conv_resnet.tex", [], 2 * 64 * 64 * 9 * 56 * 56, None),
    ("conv 56×56 64→64 3×3 (default, rewritten)", "benches/conv_layer.tex", [], 2 * 64 * 64 * 9 * 56 * 56, None),
    ("softmax rows 4096×1024 (default)", "examples/softmax.tex", ["--shape", "N=4096,D=1024"], None, 2 * 4096 * 1024 * 4),
    ("layer_norm rows 4096×1024 (default)", "benches/layer_norm.tex", [], None, 2 * 4096 * 1024 * 4),
]

NUMPY = r"""
import json, sys, time
import numpy as np
case, repeat = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
if case.startswith("sgemm"):
    a = rng.random((1024, 1024), dtype=np.float32); b = rng.random((1024, 1024), dtype=np.float32)
    f = lambda: a @ b
elif case.startswith("conv"):
    x = rng.random((64, 58, 58), dtype=np.float32); w = rng.random((64, 64 * 9), dtype=np.float32)
    from numpy.lib.stride_tricks import sliding_window_view
    def f():
        cols = sliding_window_view(x, (3, 3), axis=(1, 2))  # c, h, w, r, s
        cols = np.ascontiguousarray(cols.transpose(0, 3, 4, 1, 2)).reshape(64 * 9, 56 * 56)
        return w @ cols
elif case.startswith("softmax"):
    x = rng.random((4096, 1024), dtype=np.float32)
    def f():
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
else:
    x = rng.random((4096, 1024), dtype=np.float32); g = rng.random(1024, dtype=np.float32); b = rng.random(1024, dtype=np.float32)
    def f():
        mu = x.mean(axis=1, keepdims=True); xc = x - mu
        return xc / np.sqrt((xc * xc).mean(axis=1, keepdims=True) + 1e-5) * g + b
for _ in range(3): f()
ts = []
for _ in range(repeat):
    t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
ts.sort(); print(json.dumps(ts[len(ts) // 2]))
"""


def texc_time(texc, target, file, extra, threads, repeat):
    args = [texc, "bench", os.path.join(ROOT, file), "--repeat", str(repeat)]
    if "--target" not in extra:
        args += ["--target", target]
    env = dict(os.environ, TEXC_NUM_THREADS=str(threads))
    out = subprocess.run(args + extra, env=env, check=True, capture_output=True, text=True).stdout
    ms = float(re.search(r"time\s+([0-9.]+) ms", out).group(1))
    compile_s = float(re.search(r"compile\s+([0-9.]+) s", out).group(1))
    return ms / 1e3, compile_s


def numpy_time(case, threads, repeat):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), OPENBLAS_CORETYPE="Haswell", MKL_ENABLE_INSTRUCTIONS="AVX2")
    out = subprocess.run([sys.executable, "-c", NUMPY, case, str(repeat)], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="only the kernels whose name contains this")
    ap.add_argument("--target", default="x86-avx2")
    ap.add_argument("--texc", help="a prebuilt texc binary (default: build this tree)")
    ap.add_argument("--baseline", help="another texc binary to time in the same run")
    a = ap.parse_args()
    texc = a.texc or TEXC
    if not a.texc:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "texc"], cwd=ROOT, check=True)
    base_head = f" {'baseline':>11} {'speedup':>7}" if a.baseline else ""
    print(f"{'kernel':44} {'thr':>3} {'texc':>22} {'numpy':>22} {'ratio':>6} {'compile':>8}{base_head}")
    for name, file, extra, flops, nbytes in [c for c in CASES if a.only in c[0]]:
        for t in [int(x) for x in a.threads.split(",")]:
            tt = nt = bt = float("inf")
            cs = None
            for _ in range(max(a.rounds, 1)):
                ti, c = texc_time(texc, a.target, file, extra, t, a.repeat)
                cs = c if cs is None else cs  # the first round's compile (later ones hit the cache)
                tt, nt = min(tt, ti), min(nt, numpy_time(name, t, a.repeat))
                if a.baseline:
                    bt = min(bt, texc_time(a.baseline, a.target, file, extra, t, a.repeat)[0])
            base = f" {bt*1e3:8.3f} ms {bt/tt:7.2f}" if a.baseline else ""
            if flops:
                unit, tv, nv = "GFLOP/s", flops / tt / 1e9, flops / nt / 1e9
            else:
                unit, tv, nv = "GB/s", nbytes / tt / 1e9, nbytes / nt / 1e9
            print(f"{name:44} {t:>3} {tt*1e3:8.3f} ms {tv:6.1f} {unit:7} {nt*1e3:8.3f} ms {nv:6.1f} {unit:7} {nt/tt:6.2f} {cs:7.3f}s{base}", flush=True)


if __name__ == "__main__":
    main()
