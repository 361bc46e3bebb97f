#!/usr/bin/env python3
"""How texc's compile time grows with a model's depth.

Builds ONNX models of N inverted-residual blocks (EfficientNet's: a 1x1
expansion, a depthwise 3x3, squeeze-and-excite, a 1x1 projection and the
residual sum, SiLU activations) at a 14x14 map for each N asked, and times
`texc emit MODEL --target T --stage loops --time-passes` on each: import,
rewriting, folding, the default schedules and lowering to loops, everything
but LLVM (whose work is per distinct kernel, and the blocks share theirs).
Prints the total and the time per block for each N, the ratio of each
doubling (2.0 is linear), and the passes that grow fastest.

    python3 benches/compile_scaling.py --texc target/release/texc --blocks 50,100,200,400

Needs `onnx` and `numpy` (the peers' venv of ../shared/notes/ANCHORS.md has
both). The models go to a temporary directory unless `--keep DIR`.
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "onnx"))

import onnx  # noqa: E402
from models import Builder, rename_output  # noqa: E402


def deep(n, size=14, cin=32):
    """N inverted-residual blocks with squeeze-and-excite, random weights."""
    b = Builder(0)

    def silu(y):
        return b.op("Mul", [y, b.op("Sigmoid", [y])])

    x = b.conv("x", 3, cin, 3, stride=1, pad=1)
    for _ in range(n):
        hidden = cin * 6
        y = silu(b.conv(x, cin, hidden, 1, bias=True))
        y = silu(b.conv(y, hidden, hidden, 3, pad=1, group=hidden, bias=True))
        pooled = b.op("GlobalAveragePool", [y])
        z = silu(b.conv(pooled, hidden, 8, 1, bias=True))
        z = b.op("Sigmoid", [b.conv(z, 8, hidden, 1, bias=True)])
        y = b.conv(b.op("Mul", [z, y]), hidden, cin, 1, bias=True)
        x = b.op("Add", [x, y])
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    return b.model([1, 3, size, size], rename_output(b, x), [1, cin])


def passes(stderr):
    """Per pass, milliseconds, from `--time-passes`' table."""
    out, table = {}, False
    for line in stderr.splitlines():
        cols = line.split()
        if cols[:1] == ["pass"]:
            table = True
            continue
        if table and len(cols) >= 3 and cols[0] != "total":
            try:
                out[cols[0]] = float(cols[2])
            except ValueError:
                pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texc", default="target/release/texc")
    ap.add_argument("--blocks", default="50,100,200,400", help="comma-separated block counts")
    ap.add_argument("--target", default="host")
    ap.add_argument("--repeat", type=int, default=2, help="runs per model; the fastest is kept")
    ap.add_argument("--keep", help="directory to write the models to")
    args = ap.parse_args()
    counts = sorted(int(n) for n in args.blocks.split(","))
    folder = args.keep or tempfile.mkdtemp(prefix="texc-scaling-")
    os.makedirs(folder, exist_ok=True)
    rows = []
    for n in counts:
        path = os.path.join(folder, f"deep{n}.onnx")
        onnx.save(deep(n), path)
        best = None
        for _ in range(args.repeat):
            cmd = [args.texc, "emit", path, "--target", args.target, "--stage", "loops", "--time-passes"]
            t0 = time.perf_counter()
            r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            wall = time.perf_counter() - t0
            if r.returncode != 0:
                sys.exit(f"texc failed on {path}:\n{r.stderr[-2000:]}")
            if best is None or wall < best[0]:
                best = (wall, passes(r.stderr))
        rows.append((n, *best))
    print(f"texc emit --stage loops, target {args.target}, fastest of {args.repeat}")
    print(f"{'blocks':>7} {'seconds':>8} {'ms/block':>9} {'x per doubling':>15}")
    for i, (n, wall, _) in enumerate(rows):
        growth = ""
        if i > 0:
            (m, w0, _) = rows[i - 1]
            growth = f"{(wall / w0) ** (1 / math.log2(n / m)):.2f}"
        print(f"{n:>7} {wall:>8.2f} {1000 * wall / n:>9.2f} {growth:>15}")
    if len(rows) >= 2:
        (n0, _, p0), (n1, _, p1) = rows[-2], rows[-1]
        grow = sorted(((p1[k], k, p0.get(k, 0.0)) for k in p1 if p1[k] > 10), reverse=True)[:8]
        print(f"\nlargest passes at {n1} blocks (ms at {n0} -> {n1}):")
        for ms, k, before in grow:
            print(f"  {k:<24} {before:>8.1f} -> {ms:>8.1f}")


if __name__ == "__main__":
    main()
