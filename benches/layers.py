#!/usr/bin/env python3
"""Single layers of the zoo's models against ONNX Runtime, alternated.

Each layer is exported alone from PyTorch (opset 17, random weights,
batch 1) into a directory of its own (`--keep`, else a temporary one),
then timed with `texc bench` and with ONNX Runtime at the same thread
count, `--rounds` times alternated; the lowest median of each is kept
(this VM's timings drift between minutes: only runs of the same minutes
compare). A layer is `name:cin:cout:size[:k[:groups[:residual]]]`: a
`k`×`k` convolution (padding `k // 2`) from `cin` to `cout` channels on a
`size`×`size` map with bias and ReLU, and where `residual` is 1, an input
of the output's shape added before the ReLU.

    ~/peers/bin/python benches/layers.py --texc target/release/texc --threads 1
    ~/peers/bin/python benches/layers.py --layers r50:2048:512:7 --threads 1,2

The default set is the zoo's 1×1 convolutions on 7×7 maps (ResNet-50,
RegNet-X/Y-400MF, EfficientNet-B0, MobileNetV3-Large, DenseNet-121) and
one on 14×14.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

DEFAULT = [
    "resnet50_a:2048:512:7", "resnet50_b:512:2048:7:1:1:1", "regnety_440:440:440:7:1:1:1",
    "regnetx_400:400:400:7:1:1:1", "effnet_expand:192:1152:7", "effnet_project:1152:192:7",
    "effnet_320:1152:320:7", "effnet_head:320:1280:7", "mbv3_expand:160:960:7",
    "mbv3_project:960:160:7", "densenet_1x1:1024:128:7", "regnety_208_14:208:208:14:1:1:1",
]


def parse(spec):
    f = spec.split(":")
    if len(f) < 4:
        sys.exit(f"layers: {spec!r}: expected name:cin:cout:size[:k[:groups[:residual]]]")
    name, cin, cout, size = f[0], int(f[1]), int(f[2]), int(f[3])
    k = int(f[4]) if len(f) > 4 else 1
    groups = int(f[5]) if len(f) > 5 else 1
    residual = len(f) > 6 and f[6] == "1"
    return name, cin, cout, size, k, groups, residual


def export(spec, where):
    import numpy as np
    import torch

    name, cin, cout, size, k, groups, residual = parse(spec)

    class Layer(torch.nn.Module):
        def __init__(s):
            super().__init__()
            s.conv = torch.nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups)

        def forward(s, x, r=None):
            y = s.conv(x)
            return torch.relu(y + r if residual else y)

    torch.manual_seed(0)
    x = torch.randn(1, cin, size, size)
    args, names = ((x, torch.randn(1, cout, size, size)), ["x", "r"]) if residual else ((x,), ["x"])
    d = os.path.join(where, name)
    os.makedirs(d, exist_ok=True)
    torch.onnx.export(Layer().eval(), args, os.path.join(d, "model.onnx"), input_names=names,
                      opset_version=17, dynamo=False)
    np.savez(os.path.join(d, "inputs.npz"), **{n: a.numpy() for n, a in zip(names, args)})
    flops = 2 * cout * size * size * (cin // groups) * k * k
    return d, flops


def ort_ms(d, threads, repeat):
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    s = ort.InferenceSession(os.path.join(d, "model.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = dict(np.load(os.path.join(d, "inputs.npz")))
    for _ in range(10):
        s.run(None, feeds)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        s.run(None, feeds)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3


def texc_ms(texc, d, threads, repeat, target):
    cmd = [texc, "bench", os.path.join(d, "model.onnx"), "--input", os.path.join(d, "inputs.npz"),
           "--target", target, "--threads", str(threads), "--repeat", str(repeat), "--no-cache", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"layers: {' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout)["time_ms"]["median"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texc", default="target/release/texc")
    ap.add_argument("--layers", help="comma-separated name:cin:cout:size[:k[:groups[:residual]]]")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--target", default="host")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keep", help="write the layers here and keep them")
    a = ap.parse_args()
    specs = a.layers.split(",") if a.layers else DEFAULT
    where = a.keep or tempfile.mkdtemp(prefix="texc-layers-")
    made = [(parse(s)[0], *export(s, where)) for s in specs]
    print(f"| layer | threads | texc ms | ORT ms | ORT÷texc | texc GFLOP/s |")
    print(f"|---|---|---|---|---|---|")
    for t in [int(x) for x in a.threads.split(",")]:
        for name, d, flops in made:
            ours, theirs = [], []
            for _ in range(a.rounds):
                theirs.append(ort_ms(d, t, a.repeat))
                ours.append(texc_ms(a.texc, d, t, a.repeat, a.target))
            mine, peer = min(ours), min(theirs)
            print(f"| {name} | {t} | {mine:.4f} | {peer:.4f} | {peer / mine:.2f}× | {flops / mine / 1e6:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
