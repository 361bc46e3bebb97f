#!/usr/bin/env python3
"""Whole models: torchvision's ResNet-18 and MobileNetV2 at batch 1, 224×224,
f32, exported with torch.onnx.export, imported by texc and run beside ONNX
Runtime and PyTorch (eager, and torch.compile) in the same run.

For each model it first checks texc's output against PyTorch's and ONNX
Runtime's on the same input (normwise relative error, must be ≤ 1e-4), then
times every engine at each thread count: median and p99 latency in ms.

Usage: python3 benches/models.py [--peers ~/peers/bin/python] [--threads 1,2]
       [--repeat 30] [--targets x86-avx2,x86-avx512] [--texc PATH]
       [--models resnet18,mobilenet_v2] [--no-compile] [--rounds 1]
`--peers` is a Python with torch, torchvision, onnx and onnxruntime
(../shared/notes/ANCHORS.md: `python3 -m venv ~/peers && ~/peers/bin/pip
install numpy torch torchvision onnx onnxruntime onnxscript`). PyTorch is
not capped to AVX2: its oneDNN picks the machine's best ISA, as ONNX Runtime's
MLAS does, so compare them with texc's x86-avx512 column on AVX-512 machines.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PEER = r"""
import json, sys, time
import numpy as np
engine, model, threads, repeat, d = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
x = np.load(f"{d}/x.npy")
if engine == "ort":
    import onnxruntime as ort
    so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
    sess = ort.InferenceSession(f"{d}/{model}.onnx", so, providers=["CPUExecutionProvider"])
    f = lambda: sess.run(None, {"x": x})[0]
else:
    import torch, torchvision
    torch.set_num_threads(threads)
    m = getattr(torchvision.models, model)(weights=None).eval()
    m.load_state_dict(torch.load(f"{d}/state.pt"))
    if engine == "torch.compile":
        m = torch.compile(m)
    t = torch.from_numpy(x)
    def f():
        with torch.inference_mode():
            return m(t).numpy()
for _ in range(5):
    y = f()
ts = []
for _ in range(repeat):
    t0 = time.perf_counter(); f(); ts.append((time.perf_counter() - t0) * 1e3)
np.save(f"{d}/y_{engine}.npy", y)
print(json.dumps({"median": float(np.median(ts)), "p99": float(np.percentile(ts, 99))}))
"""

EXPORT = r"""
import sys, numpy as np, torch, torchvision
model, d = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
m = getattr(torchvision.models, model)(weights=None).eval()
torch.save(m.state_dict(), f"{d}/state.pt")
x = torch.randn(1, 3, 224, 224)
np.save(f"{d}/x.npy", x.numpy())
torch.onnx.export(m, (x,), f"{d}/{model}.onnx", input_names=["x"], output_names=["y"], dynamo=False, opset_version=17)
"""


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return r.stdout


def error(peers, a, b):
    code = "import sys, numpy as np; a, b = np.load(sys.argv[1]), np.load(sys.argv[2]); " \
           "print(np.linalg.norm(a - b) / np.linalg.norm(b))"
    return float(run([peers, "-c", code, a, b]))


def median_of(samples):
    """(median, p99, compile s) of rounds: the median of each column (the first compile time)."""
    mid = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return mid([m for m, _, _ in samples]), mid([p for _, p, _ in samples]), samples[0][2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default=os.path.expanduser("~/peers/bin/python"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--targets", default="x86-avx2,x86-avx512")
    ap.add_argument("--texc", default=os.path.join(ROOT, "target", "release", "texc"))
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time texc and ONNX Runtime this many times, alternated, and report the median of "
                         "their medians (ONNX Runtime's own times move between runs on a shared machine)")
    a = ap.parse_args()
    if not os.path.exists(a.texc):
        run(["cargo", "build", "--release", "-p", "texc"], cwd=ROOT)
    threads = [int(t) for t in a.threads.split(",")]
    targets = a.targets.split(",")
    engines = ["ort", "torch"] + ([] if a.no_compile else ["torch.compile"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            d = os.path.join(tmp, model)
            os.makedirs(d)
            run([a.peers, "-c", EXPORT, model, d])
            onnx, tex = f"{d}/{model}.onnx", f"{d}/{model}.tex"
            run([a.texc, "import", onnx, "-o", tex])
            x = f"x={d}/x.npy"
            for target in targets:
                y = f"{d}/y_texc_{target}.npy"
                run([a.texc, "run", tex, "--input", f"{d}/{model}.npz", "--input", x, "--output", f"y={y}",
                     "--target", target])
            # texc and ONNX Runtime in rounds, then PyTorch: torch.compile's
            # compile workers outlive their run for a while and would share the cores.
            samples = {t: {} for t in threads}
            for _ in range(a.rounds):
                for t in threads:
                    for target in targets:
                        out = run([a.texc, "bench", onnx, "--input", x, "--target", target, "--threads", str(t),
                                   "--repeat", str(a.repeat), "--json"])
                        j = json.loads(out)
                        sample = (j["time_ms"]["median"], j["time_ms"]["p99"], j["compile_s"])
                        samples[t].setdefault(f"texc {target}", []).append(sample)
                    j = json.loads(run([a.peers, "-c", PEER, "ort", model, str(t), str(a.repeat), d]))
                    samples[t].setdefault("ort", []).append((j["median"], j["p99"], None))
            for t in threads:
                for e in engines[1:]:
                    j = json.loads(run([a.peers, "-c", PEER, e, model, str(t), str(a.repeat), d]))
                    samples[t][e] = [(j["median"], j["p99"], None)]
            times = {t: {n: median_of(v) for n, v in samples[t].items()} for t in threads}
            rows.extend((model, t, times[t]) for t in threads)
            ref = f"{d}/y_torch.npy"
            for target in targets:
                y = f"{d}/y_texc_{target}.npy"
                e_torch, e_ort = error(a.peers, y, ref), error(a.peers, y, f"{d}/y_ort.npy")
                print(f"{model} texc {target}: normwise relative error {e_torch:.2e} vs PyTorch, {e_ort:.2e} vs ONNX Runtime")
                if max(e_torch, e_ort) > 1e-4:
                    sys.exit(f"{model}: texc {target} differs from the peers")
    print()
    names = list(rows[0][2])
    print("| model | threads | " + " | ".join(names) + " | texc best / ONNX Runtime |")
    print("|---|---|" + "---|" * (len(names) + 1))
    for model, t, times in rows:
        cells = [f"{times[n][0]:.2f} (p99 {times[n][1]:.2f})" for n in names]
        best = min(v[0] for n, v in times.items() if n.startswith("texc"))
        print(f"| {model} | {t} | " + " | ".join(cells) + f" | {times['ort'][0] / best:.2f}× |")
    rounds = f"; texc and ONNX Runtime: medians of {a.rounds} alternated rounds" if a.rounds > 1 else ""
    print("\nms, median (p99) of", a.repeat, f"runs{rounds}; the last column is ONNX Runtime's time over texc's best "
          "(higher is better).")
    for model, t, times in rows[:1]:
        comp = [f"{n}: {v[2]:.1f} s" for n, v in times.items() if v[2] is not None]
        print("texc compile time (" + model + "): " + ", ".join(comp))


if __name__ == "__main__":
    main()
