#!/usr/bin/env python3
"""texc's backends against each other in one run: compile time of every
kernel of every example on each target, and run time of SGEMM 1024³,
softmax and layer_norm rows 4096×1024 and the ResNet conv layer (56×56,
64→64, 3×3) with each target's default schedule.

Usage: python3 benches/backends.py [--targets x86-avx2,cranelift] [--repeat 10] [--threads 1]
Also: run time of every example kernel (--targets x86-avx2,x86-avx512
gives the two columns of the AVX-512 check). Compile time is the backend's (`compile` line of `texc bench`: building,
optimizing and emitting machine code); the front end and scheduling are
the same for every target. Ratios are relative to the first target.
"""
import argparse
import json
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXC = os.path.join(ROOT, "target", "release", "texc")
TEXC_BIN = [TEXC]

RUNS = [
    ("sgemm 1024³", "benches/matmul.tex", []),
    ("softmax 4096×1024", "examples/softmax.tex", ["--shape", "N=4096,D=1024"]),
    ("layer_norm 4096×1024", "benches/layer_norm.tex", []),
    ("conv 56×56 64→64 3×3", "benches/conv_layer.tex", []),
]


def bench(file, kernel, target, extra, repeat, threads):
    args = [TEXC_BIN[0], "bench", os.path.join(ROOT, file), "--target", target, "--repeat", str(repeat), "--warmup", "1"]
    if kernel:
        args += ["--kernel", kernel]
    env = dict(os.environ, TEXC_NUM_THREADS=str(threads))
    out = subprocess.run(args + extra + ["--json"], env=env, check=True, capture_output=True, text=True).stdout
    j = json.loads(out)
    return j["time_ms"]["median"], j["compile_s"] * 1e3


def kernels(file):
    text = open(os.path.join(ROOT, file)).read()
    return re.findall(r"^kernel\s+([A-Za-z_][A-Za-z0-9_]*)", text, re.M)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="x86-avx2,cranelift")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kernel-repeat", type=int, default=5, help="timed runs of each example kernel")
    ap.add_argument("--no-build", action="store_true", help="use target/release/texc as it is")
    ap.add_argument("--texc", help="a prebuilt texc binary (implies --no-build)")
    a = ap.parse_args()
    targets = a.targets.split(",")
    if a.texc:
        TEXC_BIN[0] = a.texc
    if not (a.no_build or a.texc):
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "texc"], cwd=ROOT, check=True)
    print(f"per kernel at the examples' default sizes: compile time (ms, backend) and run time (ms, median of {a.kernel_repeat})")
    print(f"{'kernel':40} " + " ".join(f"{'compile ' + t:>20}" for t in targets) + f" {'ratio':>7} "
          + " ".join(f"{'run ' + t:>16}" for t in targets) + f" {'ratio':>7}")
    files = sorted(f"examples/{f}" for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".tex"))
    ratios = []
    for f in files:
        for k in kernels(f):
            rs = [bench(f, k, t, [], a.kernel_repeat, a.threads) for t in targets]
            cs = [c for _, c in rs]
            ratio = cs[0] / max(cs[-1], 1e-6)
            ratios.append(ratio)
            print(f"{f + ':' + k:40} " + " ".join(f"{c:20.2f}" for c in cs) + f" {ratio:7.1f} "
                  + " ".join(f"{ms:16.5f}" for ms, _ in rs) + f" {rs[-1][0] / rs[0][0]:7.2f}")
    print(f"geometric mean ratio {targets[0]}/{targets[-1]}: {pow(2.718281828, sum(map(lambda r: __import__('math').log(r), ratios)) / len(ratios)):.1f}")
    print()
    print(f"run time (ms, median of {a.repeat}, {a.threads} thread(s)), default schedules")
    print(f"{'kernel':40} " + " ".join(f"{t:>12}" for t in targets) + f" {'ratio':>8}")
    for name, f, extra in RUNS:
        ts = [bench(f, None, t, extra, a.repeat, a.threads)[0] for t in targets]
        print(f"{name:40} " + " ".join(f"{x:12.3f}" for x in ts) + f" {ts[-1] / ts[0]:8.2f}")


if __name__ == "__main__":
    main()
