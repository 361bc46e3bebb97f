#!/usr/bin/env python3
"""texc on an NVIDIA GPU against PyTorch (cuBLAS, cuDNN, its own softmax and
layer_norm) in one run, on the sizes of the GPU issue: fp16 and bf16 GEMM
4096³ and 8192³ with f32 sums (sm_90's default on Hopper's warpgroup
operations, and on `mma.sync` with `--knob wgmma=0`), a TF32 GEMM 4096³, conv 3×3 56²×64 and 14²×256 at batch 32 (fp16
inputs, f32 sums; also f32 through std.nn), an f32 GEMM 4096³, softmax and
layer_norm rows 16384×4096 (f32).

Usage: python3 benches/gpu.py [--texc PATH] [--target nvptx-sm90] [--repeat 20]
                              [--only TEXT] [--tune TRIALS [--budget S]]
Prints one line per kernel: texc's median time and TFLOP/s or GB/s, PyTorch's,
the ratio texc/PyTorch (higher is better) and texc's share of the GPU's
data-sheet peak. Needs a GPU and a PyTorch built with CUDA; texc's times come
from `texc bench --json` (launches followed by a synchronize, data resident
on the device), PyTorch's from CUDA events around the same repeats. With
--tune, each product and convolution that runs the default schedule is also
tuned (`texc tune`, the GPU schedule's knobs and the e-graph's choices, a
fresh database each) and timed again with its tuned knobs.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Data sheets (dense): H100 SXM fp16/bf16 989 TFLOP/s, TF32 495, f32 67, int8
# 1979 TOPS, 3.35 TB/s; the H200 has the same arithmetic and 4.8 TB/s.
PEAKS = {
    "H100": {"fp16": 989e12, "tf32": 495e12, "f32": 67e12, "int8": 1979e12, "bw": 3.35e12},
    "H200": {"fp16": 989e12, "tf32": 495e12, "f32": 67e12, "int8": 1979e12, "bw": 4.8e12},
}


def peaks():
    """The data sheet of the GPU PyTorch sees (the H100's if it is neither)."""
    try:
        import torch

        name = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 (no CUDA PyTorch: the H100's figures)
        name = ""
    return next((v for k, v in PEAKS.items() if k in name), PEAKS["H100"]), name or "unknown GPU"

G = 4096
G8 = 8192
MMA = ["--knob", "wgmma=0"]
CASES = [
    # name, texc file, texc args, kind of peak, flops or None, bytes, torch setup
    ("hgemm 4096³ f16→f32 (default: wgmma)", "examples/gemm_f16.tex", ["--shape", f"M={G},K={G},N={G}"],
     "fp16", 2 * G**3, None, "hgemm"),
    ("hgemm 4096³ f16→f32 (mma.sync: wgmma=0)", "examples/gemm_f16.tex", ["--shape", f"M={G},K={G},N={G}"] + MMA,
     "fp16", 2 * G**3, None, "hgemm"),
    ("hgemm 8192³ f16→f32 (default: wgmma)", "examples/gemm_f16.tex", ["--shape", f"M={G8},K={G8},N={G8}"],
     "fp16", 2 * G8**3, None, "hgemm8k"),
    ("hgemm 8192³ f16→f32 (mma.sync: wgmma=0)", "examples/gemm_f16.tex", ["--shape", f"M={G8},K={G8},N={G8}"] + MMA,
     "fp16", 2 * G8**3, None, "hgemm8k"),
    ("hgemm 4096³ f16→f32 (shared, ldmatrix)", "benches/hgemm_shared.tex", [], "fp16", 2 * G**3, None, "hgemm"),
    ("hgemm 4096³ f16→f32 (cp.async, 2 stages)", "benches/hgemm_pipelined.tex", [], "fp16", 2 * G**3, None, "hgemm"),
    ("hgemm 4096³ f16→f32 (wgmma bench, 3 stages)", "benches/hgemm_wgmma.tex", [], "fp16", 2 * G**3, None,
     "hgemm"),
    ("bf16 gemm 4096³ bf16→f32 (default: wgmma)", "benches/gemm_bf16.tex", [], "fp16", 2 * G**3, None, "bgemm"),
    ("bf16 gemm 4096³ bf16→f32 (mma.sync)", "benches/gemm_bf16.tex", MMA, "fp16", 2 * G**3, None, "bgemm"),
    ("bf16 gemm 8192³ bf16→f32 (default: wgmma)", "benches/gemm_bf16.tex", ["--shape", f"M={G8},K={G8},N={G8}"],
     "fp16", 2 * G8**3, None, "bgemm8k"),
    ("igemm 4096³ s8→s32 (default: mma.sync m16n8k32)", "benches/gemm_s8.tex", [], "int8", 2 * G**3, None,
     "igemm"),
    ("igemm 8192³ s8→s32 (default: mma.sync m16n8k32)", "benches/gemm_s8.tex",
     ["--shape", f"M={G8},K={G8},N={G8}"], "int8", 2 * G8**3, None, "igemm8k"),
    ("tf32 gemm 4096³ (benches schedule)", "benches/gemm_tf32.tex", [], "tf32", 2 * G**3, None, "tf32"),
    ("sgemm 4096³ f32 (default: registers)", "benches/matmul.tex", ["--shape", f"M={G},K={G},N={G}"], "f32",
     2 * G**3, None, "sgemm"),
    ("conv 3×3 56²×64 b32 f16 (default: implicit)", "benches/conv_f16.tex", [], "fp16",
     2 * 32 * 64 * 64 * 9 * 56 * 56, None, "conv56"),
    ("conv 3×3 56²×64 b32 f16 (implicit, mma.sync)", "benches/conv_f16.tex", MMA, "fp16",
     2 * 32 * 64 * 64 * 9 * 56 * 56, None, "conv56"),
    ("conv 3×3 56²×64 b32 f16 (explicit im2col)", "benches/conv_f16.tex", ["--knob", "gather=0"], "fp16",
     2 * 32 * 64 * 64 * 9 * 56 * 56, None, "conv56"),
    ("conv 3×3 14²×256 b32 f16 (default: implicit)", "benches/conv_f16.tex",
     ["--shape", "N=32,C=256,H=16,W=16,K=256"], "fp16", 2 * 32 * 256 * 256 * 9 * 14 * 14, None, "conv14"),
    ("conv 3×3 14²×256 b32 f16 (implicit, mma.sync)", "benches/conv_f16.tex",
     ["--shape", "N=32,C=256,H=16,W=16,K=256"] + MMA, "fp16", 2 * 32 * 256 * 256 * 9 * 14 * 14, None, "conv14"),
    ("conv 3×3 14²×256 b32 f16 (explicit im2col)", "benches/conv_f16.tex",
     ["--shape", "N=32,C=256,H=16,W=16,K=256", "--knob", "gather=0"], "fp16", 2 * 32 * 256 * 256 * 9 * 14 * 14,
     None, "conv14"),
    ("conv 3×3 56²×64 b32 s8→s32 (default: implicit, vs cuDNN f16)", "benches/conv_s8.tex", [], "int8",
     2 * 32 * 64 * 64 * 9 * 56 * 56, None, "conv56"),
    ("conv 3×3 56²×64 b32 f32 std.nn (default)", "benches/conv_layer.tex", ["--shape", "N=32"], "f32",
     2 * 32 * 64 * 64 * 9 * 56 * 56, None, "conv56f32"),
    ("softmax rows 16384×4096 (default)", "examples/softmax.tex", ["--shape", "N=16384,D=4096"], "bw",
     None, 2 * 16384 * 4096 * 4, "softmax"),
    ("layer_norm rows 16384×4096 (default)", "benches/layer_norm.tex", ["--shape", "N=16384,D=4096"], "bw",
     None, 2 * 16384 * 4096 * 4, "layer_norm"),
    ("gelu (erf) 16384×4096 (default)", "examples/gelu.tex", ["--shape", "N=16384,D=4096"], "bw",
     None, 2 * 16384 * 4096 * 4, "gelu"),
]


def torch_time(case, repeat):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    dev = "cuda"
    if case.startswith(("hgemm", "bgemm")):
        n = G8 if case.endswith("8k") else G
        dt = torch.float16 if case.startswith("h") else torch.bfloat16
        a = torch.randn(n, n, device=dev, dtype=dt)
        b = torch.randn(n, n, device=dev, dtype=dt)
        f = lambda: a @ b  # noqa: E731 (cuBLAS, f32 accumulation, f16 or bf16 result)
    elif case.startswith("igemm"):
        n = G8 if case.endswith("8k") else G
        a = torch.randint(-128, 128, (n, n), device=dev, dtype=torch.int8)
        w = torch.randint(-128, 128, (n, n), device=dev, dtype=torch.int8)
        f = lambda: torch._int_mm(a, w.t())  # noqa: E731 (cuBLASLt, int8 × int8 → int32, W[n, k] as texc's)
    elif case == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        a = torch.randn(G, G, device=dev)
        b = torch.randn(G, G, device=dev)
        f = lambda: a @ b  # noqa: E731
    elif case == "sgemm":
        torch.backends.cuda.matmul.allow_tf32 = False
        a = torch.randn(G, G, device=dev)
        b = torch.randn(G, G, device=dev)
        f = lambda: a @ b  # noqa: E731 (cuBLAS, f32 FMA, no TF32)
    elif case.startswith("conv"):
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = False
        c, hw = (64, 56) if case.startswith("conv56") else (256, 14)
        dt = torch.float32 if case.endswith("f32") else torch.float16
        x = torch.randn(32, c, hw, hw, device=dev, dtype=dt)
        w = torch.randn(c, c, 3, 3, device=dev, dtype=dt)
        f = lambda: F.conv2d(x, w, padding=1)  # noqa: E731
    elif case == "gelu":
        x = torch.randn(16384, 4096, device=dev)
        f = lambda: F.gelu(x)  # noqa: E731 (the exact erf form)
    elif case == "softmax":
        x = torch.randn(16384, 4096, device=dev)
        f = lambda: torch.softmax(x, -1)  # noqa: E731
    else:
        x = torch.randn(16384, 4096, device=dev)
        g = torch.randn(4096, device=dev)
        b = torch.randn(4096, device=dev)
        f = lambda: F.layer_norm(x, (4096,), g, b)  # noqa: E731
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        f()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    return times[len(times) // 2]


# A kernel that hangs on the GPU costs one case, not the run.
TIMEOUT_S = 120


def texc_time(texc, target, file, args, repeat, db=None):
    cmd = [texc, "bench", os.path.join(ROOT, file), "--target", target, "--json", "--repeat", str(repeat)] + args
    cmd += ["--db", db] if db else ["--no-db"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"no result in {TIMEOUT_S} s"
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["failed"])[-1]
    j = json.loads(r.stdout)
    return j["time_ms"]["median"] / 1e3, None


def texc_tune(texc, target, file, args, trials, budget, db):
    """Tunes the kernel into `db`: its wall seconds and trials, or why not."""
    # A case's --knob fixes what tuning chooses: tune its shape only.
    cmd = [texc, "tune", os.path.join(ROOT, file), "--target", target, "--trials", str(trials),
           "--time-budget", str(budget), "--db", db] + shape_args(args)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out = r.stdout + r.stderr
    if os.environ.get("LOG_DIR"):
        with open(os.path.join(os.environ["LOG_DIR"], "tune.log"), "a") as log:
            log.write(f"$ {' '.join(cmd)}\n{out}\n")
    if r.returncode != 0:
        return None, (out.strip().splitlines() or ["failed"])[-1]
    done = re.search(r": (\d+) trials \(", out)
    best = re.search(r"^\s*best\s+\S+ ms\s+\((.*)\)", out, re.M)
    return f"{wall:.0f} s, {done.group(1) if done else '?'} trials", best.group(1) if best else ""


def shape_args(args):
    """The `--shape` arguments of a case's texc arguments."""
    return [a for i, a in enumerate(args) if a == "--shape" or (i > 0 and args[i - 1] == "--shape")]


def rate(flops, nbytes, t):
    return f"{flops / t / 1e12:7.1f} TFLOP/s" if flops else f"{nbytes / t / 1e9:7.0f} GB/s   "


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--texc", default=os.path.join(ROOT, "target", "release", "texc"))
    ap.add_argument("--target", default="nvptx-sm90")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--hgemm", nargs="*", default=[], help="more schedules of the 4096³ f16 GEMM to time (.tex files)")
    ap.add_argument("--tune", type=int, default=0, metavar="TRIALS",
                    help="also tune each default-schedule case (`texc tune`, a fresh database each) and time the tuned kernel")
    ap.add_argument("--budget", type=int, default=60, help="seconds of tuning per case (with --tune)")
    a = ap.parse_args()
    cases = CASES + [(f"hgemm 4096³ {os.path.basename(f)}", os.path.abspath(f), [], "fp16", 2 * G**3, None, "hgemm")
                     for f in a.hgemm]
    peak_of, gpu = peaks()
    print(f"# {gpu}: shares of its data sheet's peaks", flush=True)
    for name, file, args, peak, flops, nbytes, tcase in cases:
        if a.only not in name:
            continue
        t, why = texc_time(a.texc, a.target, file, args, a.repeat)
        try:
            pt = torch_time(tcase, a.repeat)
        except Exception as e:  # noqa: BLE001 (a missing CUDA PyTorch is reported, not fatal)
            pt, why_t = None, str(e).splitlines()[0]
        else:
            why_t = None
        work = flops if flops else nbytes
        share = (work / t) / peak_of[peak] if t else None
        line = f"{name:40s} "
        line += f"texc {t * 1e3:8.3f} ms {rate(flops, nbytes, t)} ({100 * share:5.1f}% of peak)  " if t else f"texc: {why}  "
        line += f"torch {pt * 1e3:8.3f} ms {rate(flops, nbytes, pt)}  " if pt else f"torch: {why_t}  "
        if t and pt:
            line += f"texc/torch {pt / t:5.2f}×"
        print(line, flush=True)
        if a.tune and "(default" in name and flops:
            db = os.path.join(tempfile.mkdtemp(), "tuning.jsonl")
            how, best = texc_tune(a.texc, a.target, file, args, a.tune, a.budget, db)
            tt, why = texc_time(a.texc, a.target, file, shape_args(args), a.repeat, db) if how else (None, best)
            line = f"{'  tuned':40s} "
            line += f"texc {tt * 1e3:8.3f} ms ({how}; default ÷ tuned {t / tt:5.2f}×)" if tt and t else f"tune: {why}"
            if tt and pt:
                line += f"  texc/torch {pt / tt:5.2f}×"
            print(line, f"  {best}" if best else "", flush=True)
    print(f"# texc on the GPU against PyTorch (CUDA events), medians of {a.repeat} runs", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
