#!/usr/bin/env python3
"""8-bit integer products: texc against ONNX Runtime's MatMulInteger, and
each against its own f32 product, on the shapes of transformer and CNN
layers and on odd ones.

Usage: python3 benches/int8.py [--texc PATH] [--targets host,x86-avx2]
       [--threads 1] [--repeat 20] [--shapes 197x768x768,...]
Per shape M×K×N: `u8[M, K] × i8[K, N] → i32[M, N]`; texc runs
`sum[k](i32(A[i, k]) * i32(W[k, j]))` (W an argument, so its packing into
groups of four is timed on every call; ORT's W is a constant initializer,
packed once), ORT a one-node MatMulInteger model. Prints the best time of
`--repeat` runs as GOP/s (2·M·K·N), and texc ÷ ORT as a speed ratio
(> 1: texc is faster). ORT is timed when `import onnxruntime` works.
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = "197x768x768,197x768x3072,197x3072x768,128x1024x1024,1024x1024x1024,1x768x3072,3136x64x256,100x250x333"

KERNELS = {
    "int8": "kernel q(A: u8[M, K], W: i8[K, N]) -> C: i32[M, N] {\n"
    "    C[i, j] = sum[k](i32(A[i, k]) * i32(W[k, j]));\n}\n",
    "f32": "kernel s(A: f32[M, K], W: f32[K, N]) -> C: f32[M, N] {\n"
    "    C[i, j] = sum[k](A[i, k] * W[k, j]);\n}\n",
}


def texc_seconds(texc, kind, shape, target, threads, repeat, tmp):
    m, k, n = shape
    path = os.path.join(tmp, f"{kind}.tex")
    with open(path, "w") as f:
        f.write(KERNELS[kind])
    cmd = [texc, "bench", path, "--target", target, "--shape", f"M={m},K={k},N={n}", "--threads", str(threads),
           "--repeat", str(repeat), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["time_ms"]["min"] / 1e3


def ort_seconds(kind, shape, threads, repeat):
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    m, k, n = shape
    rng = np.random.default_rng(0)
    if kind == "int8":
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
        w = rng.integers(-128, 128, (k, n), dtype=np.int8)
        node = helper.make_node("MatMulInteger", ["A", "W"], ["C"])
        ins, outs = TensorProto.UINT8, TensorProto.INT32
    else:
        a = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((k, n), dtype=np.float32)
        node = helper.make_node("MatMul", ["A", "W"], ["C"])
        ins, outs = TensorProto.FLOAT, TensorProto.FLOAT
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", ins, [m, k])],
                              [helper.make_tensor_value_info("C", outs, [m, n])],
                              initializer=[numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for _ in range(3):
        s.run(None, {"A": a})
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        s.run(None, {"A": a})
        best = min(best, time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--texc", default=os.path.join(ROOT, "target", "release", "texc"))
    ap.add_argument("--targets", default="host")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--shapes", default=SHAPES)
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    head = f"{'shape':>16} {'thr':>3} {'target':>16} {'texc i8':>9} {'texc f32':>9} {'ORT i8':>9} {'ORT f32':>9}"
    print(head + f" {'i8/f32':>7} {'texc/ORT':>8}   (GOP/s; ratios are speed)")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for threads in map(int, a.threads.split(",")):
            for shape in shapes:
                ops = 2 * shape[0] * shape[1] * shape[2]
                rate = lambda s: ops / s / 1e9 if s else float("nan")
                ort_i8 = ort_seconds("int8", shape, threads, a.repeat)
                ort_f32 = ort_seconds("f32", shape, threads, a.repeat)
                for target in a.targets.split(","):
                    i8 = texc_seconds(a.texc, "int8", shape, target, threads, a.repeat, tmp)
                    f32 = texc_seconds(a.texc, "f32", shape, target, threads, a.repeat, tmp)
                    vs = ort_i8 / i8 if ort_i8 else float("nan")
                    ratios.append(vs)
                    print(f"{'x'.join(map(str, shape)):>16} {threads:>3} {target:>16} {rate(i8):9.1f} {rate(f32):9.1f} "
                          f"{rate(ort_i8):9.1f} {rate(ort_f32):9.1f} {f32 / i8:7.2f} {vs:8.2f}")
    good = [r for r in ratios if r == r]
    if good:
        print(f"geomean texc/ORT (int8): {float(np.exp(np.mean(np.log(good)))):.2f}")


if __name__ == "__main__":
    main()
