#!/usr/bin/env python3
"""The zoo: models users bring, exported from PyTorch with both exporters,
imported and run by texc beside ONNX Runtime.

Models (random weights, batch 1): every torchvision classification model
(`torchvision.models.list_models(module=torchvision.models)`), and
hand-written small ones: `bert` (encoder with token, position and segment
embeddings and a padding mask), `gpt2` (decoder with a causal mask, token
and position embeddings), `vit_small`, `sdpa` (F.scaled_dot_product_attention,
causal and with a bool mask), `lstm` (2 layers, bidirectional),
`gru`, `unet` (ConvTranspose and Resize). Each is exported with
`torch.onnx.export(..., dynamo=False, opset_version=17)` ("ts") and with the
dynamo-based exporter at opset 18 ("dynamo"), then, per texc target:
imported (`texc import`; the first line of an error), run once on the same
input as ONNX Runtime (max relative error over all outputs: max |texc − ort|
/ max |ort|), timed with `texc bench --json` (compile time, and the texc
process's peak resident memory), and ONNX Runtime timed at the same thread
counts. texc runs without its compile cache (`--no-cache`), so compile times
and memory are those of a cold compile; the peak is also shown over the
model's weights (its initializers' bytes) and the memory plan's arena (`bench
--json`'s `memory`), the issue's memory aim, and texc's own peak on a tiny
kernel is printed beside it. The last column is ONNX Runtime's time over texc's (higher is better).
With `--rounds N`, texc and ORT are timed alternately N times: each time
shown is its lowest median, each ratio the median of the N rounds' own
ratios (texc and ORT timed seconds apart, so both in the same state of a
machine whose second core comes and goes).

Usage: ~/peers/bin/python benches/zoo.py [--quick | --models a,b | --all]
       [--exporters ts,dynamo] [--targets host,x86-avx2] [--threads 1,2]
       [--repeat 20] [--rounds 1] [--no-time | --import-only] [--texc PATH] [--keep DIR] [--torch]
`--targets` defaults to `host` (this machine's ISA, schedules sized by its
caches and cores); the named ones keep a nominal machine's caches.
`--quick` (the default without --models/--all): the hand-written models and
resnet18, mobilenet_v3_small, vit_b_16, swin_t, convnext_tiny.
`--torch` times PyTorch (eager, inference mode) too, its kernels kept to
each target's ISA (`ATEN_CPU_CAPABILITY`, `ONEDNN_MAX_CPU_ISA`,
`MKL_ENABLE_INSTRUCTIONS`): ONNX Runtime cannot be kept from AVX-512, so on
a machine that has it PyTorch is `x86-avx2`'s same-ISA peer.
This script needs torch (the peers venv); CI checks the same operator forms
with small graph-builder models (tests/onnx/models.py).
"""
import argparse
import json
import math
import statistics
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import ROOT, median_of  # noqa: E402  (the helpers benches/models.py times with)

HAND = ["bert", "gpt2", "vit_small", "sdpa", "lstm", "gru", "unet"]
QUICK = HAND + ["resnet18", "mobilenet_v3_small", "vit_b_16", "swin_t", "convnext_tiny"]

# Runs in the peers Python: builds model `name` as `m` (random weights drawn
# from seed 0, the same in every process), its inputs `xs`, their `names`.
BUILD = r"""
import math, sys, numpy as np, torch, torch.nn as nn, torch.nn.functional as F
name, exporter, d = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)

class Attn(nn.Module):
    def __init__(s, dim, heads, causal=False):
        super().__init__(); s.h, s.causal = heads, causal
        s.qkv = nn.Linear(dim, 3 * dim); s.o = nn.Linear(dim, dim)
        if causal:
            s.register_buffer("mask", torch.tril(torch.ones(64, 64, dtype=torch.bool)).view(1, 1, 64, 64))
    def forward(s, x, bias=None):
        b, t, c = x.shape
        q, k, v = s.qkv(x).split(c, dim=2)
        q, k, v = [z.view(b, t, s.h, c // s.h).transpose(1, 2) for z in (q, k, v)]
        a = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // s.h))
        if s.causal:
            a = a.masked_fill(s.mask[:, :, :t, :t] == 0, float("-inf"))
        if bias is not None:
            a = a + bias
        y = F.softmax(a, dim=-1) @ v
        return s.o(y.transpose(1, 2).contiguous().view(b, t, c))

class Block(nn.Module):
    def __init__(s, dim, heads, causal=False, pre=True):
        super().__init__(); s.pre = pre
        s.ln1, s.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        s.attn = Attn(dim, heads, causal)
        s.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh" if causal else "none"), nn.Linear(4 * dim, dim))
    def forward(s, x, bias=None):
        if s.pre:
            x = x + s.attn(s.ln1(x), bias)
            return x + s.mlp(s.ln2(x))
        x = s.ln1(x + s.attn(x, bias))
        return s.ln2(x + s.mlp(x))

class GPT2(nn.Module):
    def __init__(s, vocab=500, n=64, dim=64, heads=4, layers=2):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(vocab, dim), nn.Embedding(n, dim)
        s.blocks = nn.ModuleList([Block(dim, heads, causal=True) for _ in range(layers)])
        s.ln = nn.LayerNorm(dim); s.head = nn.Linear(dim, vocab, bias=False)
    def forward(s, ids):
        t = ids.shape[1]
        pos = torch.arange(0, t, dtype=torch.long).unsqueeze(0)
        x = s.wte(ids) + s.wpe(pos)
        for blk in s.blocks:
            x = blk(x)
        x = s.ln(x)
        return s.head(x) / torch.tensor(2.0) ** 0.5

class BERT(nn.Module):
    def __init__(s, vocab=500, n=64, dim=64, heads=4, layers=2):
        super().__init__()
        s.tok, s.pos, s.seg = nn.Embedding(vocab, dim), nn.Embedding(n, dim), nn.Embedding(2, dim)
        s.ln = nn.LayerNorm(dim)
        s.blocks = nn.ModuleList([Block(dim, heads, pre=False) for _ in range(layers)])
        s.pool = nn.Linear(dim, dim)
    def forward(s, ids, mask):
        t = ids.shape[1]
        pos = torch.arange(t).expand(1, t)
        x = s.ln(s.tok(ids) + s.pos(pos) + s.seg(torch.zeros_like(ids)))
        bias = (1.0 - mask[:, None, None, :].to(torch.float32)) * -10000.0
        for blk in s.blocks:
            x = blk(x, bias)
        return x, torch.tanh(s.pool(x[:, 0]))

class ViT(nn.Module):
    def __init__(s, size=32, patch=8, dim=64, heads=4, layers=2, classes=10):
        super().__init__()
        s.embed = nn.Conv2d(3, dim, patch, patch)
        s.cls = nn.Parameter(torch.randn(1, 1, dim)); s.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim))
        s.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        s.ln = nn.LayerNorm(dim); s.head = nn.Linear(dim, classes)
    def forward(s, x):
        x = s.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([s.cls.expand(x.shape[0], -1, -1), x], dim=1) + s.pos
        for blk in s.blocks:
            x = blk(x)
        return s.head(s.ln(x)[:, 0])

class SDPA(nn.Module):
    # F.scaled_dot_product_attention as models call it: causal, and with a bool padding mask.
    def __init__(s, dim=64, heads=4):
        super().__init__(); s.h = heads
        s.qkv = nn.Linear(dim, 3 * dim); s.o = nn.Linear(dim, dim)
    def forward(s, x):
        b, t, c = x.shape
        q, k, v = [z.view(b, t, s.h, c // s.h).transpose(1, 2) for z in s.qkv(x).split(c, dim=2)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        keep = torch.arange(t) < t - 5
        y = F.scaled_dot_product_attention(y, k, v, attn_mask=keep[None, None, None, :])
        return s.o(y.transpose(1, 2).reshape(b, t, c))

class RNN(nn.Module):
    def __init__(s, kind):
        super().__init__()
        s.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(16, 32, num_layers=2, bidirectional=True, batch_first=True)
        s.fc = nn.Linear(64, 10)
    def forward(s, x):
        y, _ = s.rnn(x)
        return s.fc(y[:, -1])

class UNet(nn.Module):
    def __init__(s):
        super().__init__()
        conv = lambda i, o: nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())
        s.d1, s.d2, s.mid = conv(3, 16), conv(16, 32), conv(32, 64)
        s.up2 = nn.ConvTranspose2d(64, 32, 2, stride=2); s.u2 = conv(64, 32)
        s.u1 = conv(48, 16); s.out = nn.Conv2d(16, 2, 1)
    def forward(s, x):
        a = s.d1(x); b = s.d2(F.max_pool2d(a, 2)); c = s.mid(F.max_pool2d(b, 2))
        b = s.u2(torch.cat([s.up2(c), b], 1))
        a = s.u1(torch.cat([F.interpolate(b, scale_factor=2.0, mode="bilinear", align_corners=False), a], 1))
        return s.out(a)

if name == "gpt2":
    m, xs, names = GPT2(), (torch.randint(0, 500, (1, 64)),), ["ids"]
elif name == "bert":
    mask = torch.ones(1, 64, dtype=torch.long); mask[0, 50:] = 0
    m, xs, names = BERT(), (torch.randint(0, 500, (1, 64)), mask), ["ids", "mask"]
elif name == "sdpa":
    m, xs, names = SDPA(), (torch.randn(1, 32, 64),), ["x"]
elif name == "vit_small":
    m, xs, names = ViT(), (torch.randn(1, 3, 32, 32),), ["x"]
elif name in ("lstm", "gru"):
    m, xs, names = RNN(name), (torch.randn(1, 12, 16),), ["x"]
elif name == "unet":
    m, xs, names = UNet(), (torch.randn(1, 3, 64, 64),), ["x"]
else:
    import torchvision
    m = torchvision.models.get_model(name, weights=None)
    size = 299 if name == "inception_v3" else 224
    m, xs, names = m, (torch.randn(1, 3, size, size),), ["x"]
m = m.eval()
# Random weights throughout: some models zero their heads at initialization (vit_b_16), which would
# make every output 0 and the comparison empty.
with torch.no_grad():
    for p in m.parameters():
        if p.numel() > 1 and not p.any():
            p.normal_(0.0, 0.02)
"""

# Runs in the peers Python after BUILD: writes d/model.onnx and d/inputs.npz
# (ONNX input names as keys).
EXPORT = BUILD + r"""
# Not under no_grad: nn.MultiheadAttention would take its fused inference path, which opset 17 lacks.
if exporter == "ts":
    torch.onnx.export(m, xs, f"{d}/model.onnx", input_names=names, dynamo=False, opset_version=17)
else:
    p = torch.onnx.export(m, xs, input_names=names, dynamo=True, opset_version=18)
    p.save(f"{d}/model.onnx")
import onnx
g = onnx.load(f"{d}/model.onnx", load_external_data=False).graph
onnx_names = [i.name for i in g.input]
np.savez(f"{d}/inputs.npz", **{k: v.numpy() for k, v in zip(onnx_names, xs)})
# The weights' bytes (initializers and Constant nodes' tensors), which the memory aim is measured against.
size = lambda t: int(np.prod(t.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
constants = [a.t for n in g.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
open(f"{d}/weights_bytes.txt", "w").write(str(sum(size(t) for t in list(g.initializer) + constants)))
"""

# Runs in the peers Python: ONNX Runtime's outputs (d/ort.npz) and, with repeat > 0, its median time.
ORT = r"""
import json, sys, time, numpy as np, onnxruntime as ort
d, threads, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
sess = ort.InferenceSession(f"{d}/model.onnx", so, providers=["CPUExecutionProvider"])
feed = dict(np.load(f"{d}/inputs.npz"))
ys = sess.run(None, feed)
np.savez(f"{d}/ort.npz", **{o.name: y for o, y in zip(sess.get_outputs(), ys)})
ts = []
for _ in range(3 if repeat else 0):
    sess.run(None, feed)
for _ in range(repeat):
    t0 = time.perf_counter(); sess.run(None, feed); ts.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({"median": float(np.median(ts)) if ts else None}))
"""

# Runs in the peers Python after BUILD: PyTorch itself (eager, inference
# mode) on d/inputs.npz, its median time in ms. The ISA its kernels may use
# is set by the caller's environment (`TORCH_ISA`).
TORCH = BUILD + r"""
import json, time
threads, repeat = int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
feed = np.load(f"{d}/inputs.npz")
xs = [torch.from_numpy(feed[k]) for k in feed.files]
ts = []
with torch.inference_mode():
    for _ in range(3):
        m(*xs)
    for _ in range(repeat):
        t0 = time.perf_counter(); m(*xs); ts.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({"median": float(np.median(ts))}))
"""

# The environment that keeps PyTorch's kernels (ATen's dispatch, oneDNN,
# MKL) to a texc target's ISA: the same-ISA peer of `x86-avx2` on a machine
# with AVX-512, where ONNX Runtime cannot be kept from AVX-512.
TORCH_ISA = {
    "x86-avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "x86-avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
                   "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
}

COMPARE = r"""
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
worst = 0.0
for k in b.files:
    x, y = a[k].astype(np.float64), b[k].astype(np.float64)
    if x.shape != y.shape:
        print(f"shape {k}: {x.shape} vs {y.shape}"); sys.exit()
    worst = max(worst, float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)))
print(worst)
"""


def attempt(cmd, timeout=None, env=None):
    """(ok, stdout, the first line of the error that mentions one)."""
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, **env) if env else None)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return False, "", f"timed out after {time.time() - t0:.0f} s"
    if p.returncode != 0:
        lines = [line for line in (err or out).splitlines() if line.strip()]
        first = next((line for line in lines if "error" in line.lower()), lines[0] if lines else f"exit {p.returncode}")
        return False, out, first.strip()[:200]
    return True, out, ""


def peak_rss(cmd):
    """(peak RSS in MB, exit code) of one command, from its own rusage (wait4); its output is dropped."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_maxrss / 1024, p.returncode


def best_cpu_target():
    # `host`: this machine's ISA, and default schedules sized by its caches
    # and cores (the named targets keep a nominal machine's, for code that is
    # the same everywhere).
    return "host"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default=os.path.expanduser("~/peers/bin/python"))
    ap.add_argument("--models", help="comma-separated names")
    ap.add_argument("--quick", action="store_true", help="the small default set (the default without --models)")
    ap.add_argument("--all", action="store_true", help="every torchvision classification model and the hand-written ones")
    ap.add_argument("--exporters", default="ts,dynamo")
    ap.add_argument("--targets", help="texc targets (default: host, this machine's ISA and caches)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1,
                    help="time texc and ORT alternately this many times and keep each one's lowest median "
                         "(a machine whose cores other tenants share at times)")
    ap.add_argument("--no-time", action="store_true", help="import and check only")
    ap.add_argument("--import-only", action="store_true", help="export and import only (which models import)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds for one texc command")
    ap.add_argument("--texc", default=None)
    ap.add_argument("--keep", help="write the models here and keep them (default: a temporary directory)")
    ap.add_argument("--torch", action="store_true",
                    help="time PyTorch too, its kernels kept to each target's ISA (the same-ISA peer)")
    a = ap.parse_args()
    texc = a.texc or next((p for p in (os.path.join(ROOT, "target", b, "texc") for b in ("release", "debug"))
                           if os.path.exists(p)), None)
    if texc is None:
        subprocess.run(["cargo", "build", "--release", "-p", "texc"], cwd=ROOT, check=True)
        texc = os.path.join(ROOT, "target", "release", "texc")
    if a.all:
        code = "import torchvision; print(','.join(torchvision.models.list_models(module=torchvision.models)))"
        models = HAND + subprocess.run([a.peers, "-c", code], capture_output=True, text=True,
                                       check=True).stdout.strip().split(",")
    elif a.models:
        models = a.models.split(",")
    else:
        models = QUICK
    targets = a.targets.split(",") if a.targets else [best_cpu_target()]
    threads = [int(t) for t in a.threads.split(",")]
    rows = []
    root = a.keep or tempfile.mkdtemp(prefix="texc-zoo-")
    base_mb = None
    if not (a.import_only or a.no_time):
        base_mb, status = peak_rss([texc, "run", os.path.join(ROOT, "examples", "gelu.tex"), "--target", targets[0],
                                    "--no-cache"])
        base_mb = base_mb if status == 0 else None
    print(f"texc: {texc}; targets {targets}; models in {root}", flush=True)
    for model in models:
        for exporter in a.exporters.split(","):
            d = os.path.join(root, f"{model}-{exporter}")
            os.makedirs(d, exist_ok=True)
            row = {"model": model, "exporter": exporter}
            rows.append(row)
            ok, _, err = attempt([a.peers, "-c", EXPORT, model, exporter, d], timeout=a.timeout)
            if not ok:
                row["error"] = "export: " + err
                report(row)
                continue
            ok, _, err = attempt([texc, "import", f"{d}/model.onnx", "-o", f"{d}/model.tex"], timeout=a.timeout)
            if not ok:
                row["error"] = err
                report(row)
                continue
            if a.import_only:
                row["imported"] = True
                report(row)
                continue
            with open(f"{d}/weights_bytes.txt") as f:
                row["weights_mb"] = int(f.read()) / 2**20
            ok, out, err = attempt([a.peers, "-c", ORT, d, "1", "0"])
            if not ok:
                row["error"] = "ONNX Runtime: " + err
                report(row)
                continue
            for target in targets:
                r = row.setdefault("targets", {}).setdefault(target, {})
                cmd = [texc, "run", f"{d}/model.onnx", "--input", f"{d}/inputs.npz", "--output",
                       f"{d}/texc-{target}.npz", "--target", target, "--no-cache"]
                t0 = time.time()
                res = peak_rss(cmd)
                r["run_s"] = time.time() - t0
                if res[1] != 0:
                    _, _, err = attempt(cmd, timeout=a.timeout)
                    r["error"] = err
                    continue
                r["rss_mb"] = res[0]
                ok, out, err = attempt([a.peers, "-c", COMPARE, f"{d}/texc-{target}.npz", f"{d}/ort.npz"])
                r["rel_err"] = out.strip() if ok else "compare: " + err
                if a.no_time:
                    continue
                for t in threads:
                    texc_ms = ort_ms = None
                    # ORT ÷ texc of each round: the two timed seconds apart, so
                    # in the same state of a machine whose second core comes and
                    # goes (a VM's vCPU taken by its host for minutes at a time:
                    # the lowest of each alone may pair texc's slow minute with
                    # ORT's fast one).
                    paired = []
                    for _ in range(max(a.rounds, 1)):
                        ok, out, err = attempt([texc, "bench", f"{d}/model.onnx", "--input", f"{d}/inputs.npz",
                                                "--target", target, "--threads", str(t), "--repeat", str(a.repeat),
                                                "--json", "--no-cache"], timeout=a.timeout)
                        if not ok:
                            r["error"] = err
                            break
                        j = json.loads(out)
                        r.setdefault("compile_s", j["compile_s"])
                        if "memory" in j:  # (a texc from before 2026-12-06 does not say)
                            r.setdefault("arena_mb", j["memory"]["arena_bytes"] / 2**20)
                        ms = median_of([(j["time_ms"]["median"], j["time_ms"]["p99"], j["compile_s"])])[0]
                        texc_ms = ms if texc_ms is None else min(texc_ms, ms)
                        ok, out, err = attempt([a.peers, "-c", ORT, d, str(t), str(a.repeat)])
                        if ok:
                            ort_round = json.loads(out)["median"]
                            ort_ms = ort_round if ort_ms is None else min(ort_ms, ort_round)
                            paired.append(ort_round / ms)
                    if texc_ms is None:
                        break
                    r[t] = texc_ms, ort_ms, statistics.median(paired) if paired else None
                    if a.torch:
                        ok, out, err = attempt([a.peers, "-c", TORCH, model, exporter, d, str(t), str(a.repeat)],
                                               env=TORCH_ISA.get(target))
                        r[f"torch{t}"] = json.loads(out)["median"] if ok else None
            report(row)
    print()
    # A peer's column: its time, and its ratio to texc's (ORT's the median of
    # the rounds' paired ratios).
    peers = [("ORT", lambda r, t: r[t][1] if t in r else None,
              lambda r, t: r[t][2] if t in r and r[t][2] else r[t][1] / r[t][0])]
    if a.torch:
        peers.append(("PyTorch", lambda r, t: r.get(f"torch{t}"), lambda r, t: r[f"torch{t}"] / r[t][0]))
    columns = [(t, name, ms, ratio) for t in threads for name, ms, ratio in peers]
    print("| model | exporter | target | import / error | max rel. error vs ORT | compile s | "
          "peak RSS MB (÷ weights + arena) | "
          + " | ".join(f"texc / {name} ms, {name}÷texc ({t} thr)" for t, name, _, _ in columns) + " |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(columns))
    for row in rows:
        if "error" in row:
            print(f"| {row['model']} | {row['exporter']} | | {row['error']} | | | |" + " |" * len(columns))
            continue
        if row.get("imported"):
            print(f"| {row['model']} | {row['exporter']} | | imports | | | |" + " |" * len(columns))
            continue
        for target, r in row.get("targets", {}).items():
            cells = []
            for t, _, ms, ratio in columns:
                peer = ms(r, t)
                if t in r and peer:
                    cells.append(f"{r[t][0]:.2f} / {peer:.2f}, {ratio(r, t):.2f}×")
                else:
                    cells.append("")
            rel = r.get("rel_err", "")
            rel = f"{float(rel):.1e}" if rel and rel[0].isdigit() else rel
            comp = f"{r['compile_s']:.1f}" if "compile_s" in r else ""
            rss = f"{r['rss_mb']:.0f}" if "rss_mb" in r else ""
            if memory_ratio(row, r) is not None:
                rss += f" ({memory_ratio(row, r):.2f}×)"
            print(f"| {row['model']} | {row['exporter']} | {target} | {r.get('error', 'ok')} | {rel} | {comp} | "
                  f"{rss} | " + " | ".join(cells) + " |")
    # One mean per target and exporter: a mean over both targets would mix
    # two programs' speeds.
    groups = sorted({(target, row["exporter"]) for row in rows for target in row.get("targets", {})})
    for (target, exporter), (t, name, ms, ratio) in ((g, c) for g in groups for c in columns):
        ratios = [(ratio(r, t), row["model"]) for row in rows if row["exporter"] == exporter
                  for tg, r in row.get("targets", {}).items() if tg == target and t in r and ms(r, t)]
        if ratios:
            gm = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
            low = min(ratios)
            print(f"\n{name}÷texc, {target}, {exporter}, {t} thread(s): geometric mean {gm:.3f}× over "
                  f"{len(ratios)} models, lowest {low[0]:.2f}× ({low[1]})", end="")
    # The memory aim: the peak against the weights and the memory plan's
    # arena; texc's own (its code, LLVM's included) is a constant beside it.
    mem = [(memory_ratio(row, r), memory_ratio(row, r, base_mb or 0.0), row["model"])
           for row in rows for r in row.get("targets", {}).values() if memory_ratio(row, r) is not None]
    if mem:
        worst, worst_less_base = max(mem), max(mem, key=lambda m: m[1])
        print(f"\n\nPeak RSS ÷ (weights + arena): largest {worst[0]:.2f}× ({worst[2]})", end="")
        if base_mb is not None:
            print(f"; less texc's own {base_mb:.0f} MB (its peak on examples/gelu.tex), largest "
                  f"{worst_less_base[1]:.2f}× ({worst_less_base[2]})", end="")
    print("\n\nPeak RSS: of `texc run` (import, compile and one run). Times: medians of", a.repeat, "runs"
          + (f", the lowest of {a.rounds} alternated rounds; ratios: the median of the rounds' own "
             "(texc and ORT timed seconds apart)." if a.rounds > 1 else "."))


def memory_ratio(row, r, less=0.0):
    """A run's peak RSS (less `less` MB) over its model's weights and its
    memory plan's arena, where both were measured and are not nothing."""
    if "rss_mb" not in r or "arena_mb" not in r or row["weights_mb"] + r["arena_mb"] <= 0:
        return None
    return (r["rss_mb"] - less) / (row["weights_mb"] + r["arena_mb"])


def report(row):
    print(json.dumps(row, default=str), flush=True)


if __name__ == "__main__":
    main()
