#!/usr/bin/env python3
"""Issue 10's table in one run: for each kernel, target and thread count,
texc's default schedule, texc tuned (`texc tune`, a fresh database per
row, at most --trials trials and --budget seconds), and the strongest peer
measured in the same run: NumPy/OpenBLAS for products, PyTorch (oneDNN)
for the rest when it is importable (`--python` names the interpreter that
has it). Peers are capped to AVX2 for `x86-avx2`
(OPENBLAS_CORETYPE=Haswell, ONEDNN_MAX_CPU_ISA=AVX2, ...), uncapped for
`x86-avx512`. Prints a Markdown table: median ms, ratios peer/texc
(above 1: texc faster), tuning seconds and the trial that reached 90 % of
the best.

Usage: python3 benches/peers.py [--targets x86-avx2,x86-avx512]
       [--threads 1,2] [--trials 64] [--budget 60] [--texc PATH]
       [--python PATH] [--only NAME,...] [--rounds R]
The peer, the default and the tuned kernel are timed in R alternated rounds
(medians of their medians). A tuned time marked "(= default)" is the
default schedule again (tuning found nothing faster): the two columns then
time the same code, and differ by this machine's noise.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name, file, --shape, peer
KERNELS = [
    ("sgemm 1024³", "benches/matmul.tex", "M=1024,K=1024,N=1024", "numpy"),
    ("sgemm 2048³", "benches/matmul.tex", "M=2048,K=2048,N=2048", "numpy"),
    ("gemv 4096²", "benches/gemv.tex", "M=4096,K=4096", "numpy"),
    ("conv 3×3 56²×64", "benches/conv_layer.tex", "C=64,H=56,W=56,K=64", "torch"),
    ("conv 3×3 28²×128", "benches/conv_layer.tex", "C=128,H=28,W=28,K=128", "torch"),
    ("conv 3×3 14²×256", "benches/conv_layer.tex", "C=256,H=14,W=14,K=256", "torch"),
    # Sides no Winograd tile divides (SqueezeNet's 55², Inception's unpadded 73² → 71²).
    ("conv 3×3 55²×16→64", "benches/conv_layer.tex", "C=16,H=55,W=55,K=64", "torch"),
    ("conv 3×3 73²×80→192 unpadded", "benches/conv_valid.tex", "C=80,H=73,W=73,K=192", "torch"),
    ("conv 1×1 56²×64→256", "benches/conv1x1.tex", "C=64,H=56,W=56,K=256", "torch"),
    ("depthwise 3×3 56²×128", "examples/depthwise.tex", "N=1,C=128,H=56,W=56", "torch"),
    ("softmax 4096×1024", "examples/softmax.tex", "N=4096,D=1024", "torch"),
    ("layer_norm 4096×1024", "benches/layer_norm.tex", "N=4096,D=1024", "torch"),
]

PEER = r"""
import json, os, sys, time
name, threads, repeat = sys.argv[1], int(sys.argv[2]), 20
def timed(f):
    for _ in range(3): f()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts) // 2] * 1e3
if sys.argv[3] == "numpy":
    import numpy as np
    rng = np.random.default_rng(0)
    if name.startswith("sgemm"):
        n = int(name.split()[1].rstrip("³"))
        a = rng.random((n, n), dtype=np.float32); b = rng.random((n, n), dtype=np.float32)
        print(json.dumps({"peer": "NumPy", "ms": timed(lambda: a @ b)}))
    else:
        a = rng.random((4096, 4096), dtype=np.float32); x = rng.random(4096, dtype=np.float32)
        print(json.dumps({"peer": "NumPy", "ms": timed(lambda: a @ x)}))
else:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    with torch.no_grad():
        if name.startswith("conv 3×3"):
            c, k, hw, pad = {"56²×64": (64, 64, 56, 1), "28²×128": (128, 128, 28, 1), "14²×256": (256, 256, 14, 1),
                             "55²×16→64": (16, 64, 55, 1), "73²×80→192": (80, 192, 73, 0)}[name.split()[2]]
            x = torch.rand(1, c, hw, hw); w = torch.rand(k, c, 3, 3)
            f = lambda: F.conv2d(x, w, padding=pad)
        elif name.startswith("conv 1×1"):
            x = torch.rand(1, 64, 56, 56); w = torch.rand(256, 64, 1, 1)
            f = lambda: F.conv2d(x, w)
        elif name.startswith("depthwise"):
            x = torch.rand(1, 128, 56, 56); w = torch.rand(128, 1, 3, 3)
            f = lambda: F.conv2d(x, w, padding=1, groups=128)
        elif name.startswith("softmax"):
            x = torch.rand(4096, 1024)
            f = lambda: torch.softmax(x, dim=1)
        else:
            x = torch.rand(4096, 1024); g = torch.rand(1024); b = torch.rand(1024)
            f = lambda: F.layer_norm(x, (1024,), g, b)
        print(json.dumps({"peer": "PyTorch", "ms": timed(f)}))
"""


def peer(python, name, kind, target, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    if target == "x86-avx2":
        env.update(OPENBLAS_CORETYPE="Haswell", ONEDNN_MAX_CPU_ISA="AVX2", MKL_ENABLE_INSTRUCTIONS="AVX2",
                   ATEN_CPU_CAPABILITY="avx2")
    r = subprocess.run([python, "-c", PEER, name, str(threads), kind], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["failed"])[-1]
    v = json.loads(r.stdout)
    return v["ms"], v["peer"]


def texc_bench(texc, file, shape, target, threads, db=None, kept=None):
    """The median ms; with a tuning database, `kept` (a list) also learns
    whether the record in force is the default schedule itself."""
    args = [texc, "bench", file, "--shape", shape, "--target", target, "--repeat", "20", "--json"]
    args += ["--db", db] if db else ["--no-db"]
    env = dict(os.environ, TEXC_NUM_THREADS=str(threads))
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    if kept is not None:
        kept.append("using tuned knobs (no knobs" in r.stderr)
    return json.loads(r.stdout)["time_ms"]["median"]


def texc_tune(texc, file, shape, target, threads, trials, budget, db):
    args = [texc, "tune", file, "--shape", shape, "--target", target, "--trials", str(trials),
            "--time-budget", str(budget), "--repeat", "5", "--db", db]
    env = dict(os.environ, TEXC_NUM_THREADS=str(threads))
    t0 = time.perf_counter()
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out = r.stdout + r.stderr
    secs = re.search(r"measured now in ([0-9.]+) s", out)
    reach = re.search(r"90 % of the best .* reached at ([0-9.]+) s", out)
    trials_done = re.search(r": (\d+) trials \(", out)
    return (f"{float(secs.group(1)):.1f} + {wall - float(secs.group(1)):.1f}" if secs else None,
            float(reach.group(1)) if reach else None, int(trials_done.group(1)) if trials_done else None)


def alternated(rounds, timers):
    """Run each timer once per round, in forward then reverse order, and
    return the median of each one's results: the peer's (ms, name), then the
    texc times."""
    results = [[] for _ in timers]
    for r in range(rounds):
        order = range(len(timers)) if r % 2 == 0 else reversed(range(len(timers)))
        for i in order:
            results[i].append(timers[i]())
    peer_ms = [ms for ms, _ in results[0] if ms is not None]
    name = results[0][0][1]
    return (statistics.median(peer_ms) if peer_ms else None, name,
            *(statistics.median(r) for r in results[1:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="x86-avx2,x86-avx512")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--texc", default=os.path.join(ROOT, "target", "release", "texc"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    only = [s for s in a.only.split(",") if s]
    print("| kernel | target | threads | peer | peer ms | texc default ms | texc tuned ms | peer ÷ default | "
          "peer ÷ tuned | tuning s: search + setup and head-to-head (trials) | 90 % at s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for target in a.targets.split(","):
        for threads in [int(t) for t in a.threads.split(",")]:
            for name, file, shape, kind in KERNELS:
                if only and not any(o in name for o in only):
                    continue
                with tempfile.TemporaryDirectory() as d:
                    db = os.path.join(d, "tuning.jsonl")
                    secs, reach, n = texc_tune(a.texc, file, shape, target, threads, a.trials, a.budget, db)
                    # The three timed in alternated rounds: a shared machine's
                    # speed drifts over seconds, which a comparison of runs
                    # taken minutes apart would report as a difference.
                    kept_default = []
                    pms, pname, default, tuned = alternated(a.rounds, [
                        lambda: peer(a.python, name, kind, target, threads),
                        lambda: texc_bench(a.texc, file, shape, target, threads),
                        lambda: texc_bench(a.texc, file, shape, target, threads, db, kept_default),
                    ])
                ratio = lambda t: f"{pms / t:.2f}" if pms else "—"
                peer_ms = f"{pms:.3f}" if pms else f"— ({pname})"
                # Tuning kept the default: both columns time the same code.
                same = " (= default)" if kept_default and all(kept_default) else ""
                print(f"| {name} | {target} | {threads} | {pname if pms else '—'} | {peer_ms} | {default:.3f} | "
                      f"{tuned:.3f}{same} | {ratio(default)} | {ratio(tuned)} | {secs} ({n}) | {reach} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
