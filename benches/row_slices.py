"""Slices of a 1 x 1 convolution computed filters-last over a channels-first
image, as `.loops` files, timed alternately (docs/backends.md, the row of
`row_block_slice`; docs/onnx.md, "An AVX2-only Zen 3").

Usage: python3 benches/row_slices.py D K HW SLICES [--panels 8] [--rounds 5]
       [--target host] [--threads 1] [--texc target/release/texc]
writes one `.loops` file per slice depth in SLICES (comma-separated; D for
one slice) of the product `T[0, h·HW + w, k] = Σ_c P[k / 16, c, k % 16] ·
X[0, c, h, w]` (D input channels, K filters, an HW × HW map), blocked as
the default CPU schedule blocks it on AVX2: register blocks of 6 positions
× 16 filters, column blocks of `--panels` panels of 16 filters (the
parallel loop), the slices outside the row blocks and a nest zeroing the
output first where there are several. Then times each with `texc bench`,
`--rounds` times alternated, and prints each one's medians and minima (ms).
"""
import argparse
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def block(d, hw, ks, pb, lo, hi, rows, first):
    """The register blocks of rows `lo..hi`, `rows` positions each."""
    i = "      "
    acc0 = "0.0f32" if first else f"T[0, h.w.b * 6 + h.w.r, (k.oo.n * {pb} + k.oi) * 16 + k.v]"
    return [
        f"{i}for h.w.b in {lo}..{hi}:",
        f"{i}  for k.oi in 0..{pb}:",
        f"{i}    local acc: f32[6, 16]:",
        f"{i}      for h.w.r in 0..{rows} unrolled:",
        f"{i}        for k.v in 0..16 vectorized:",
        f"{i}          acc[h.w.r, k.v] = {acc0}",
        f"{i}      for c.i in 0..{ks}:",
        f"{i}        for h.w.r in 0..{rows} unrolled:",
        f"{i}          for k.v in 0..16 vectorized:",
        f"{i}            acc[h.w.r, k.v] = acc[h.w.r, k.v] + P[k.oo.n * {pb} + k.oi, c.o * {ks} + c.i, k.v]"
        f" * X[0, c.o * {ks} + c.i, (h.w.b * 6 + h.w.r) / {hw}, (h.w.b * 6 + h.w.r) % {hw}]",
        f"{i}      for h.w.r in 0..{rows} unrolled:",
        f"{i}        for k.v in 0..16 vectorized:",
        f"{i}          T[0, h.w.b * 6 + h.w.r, (k.oo.n * {pb} + k.oi) * 16 + k.v] = acc[h.w.r, k.v]",
    ]


def nest(d, k, hw, ks, pb):
    """The product as `.loops` text, slices `ks` deep (`ks` divides `d`)."""
    rows = hw * hw
    full, tail = divmod(rows, 6)
    panels = k // 16
    out = [
        "func p [N=1]",
        f"  input P: f32[{panels}, {d}, 16]",
        f"  input X: f32[1, {d}, {hw}, {hw}]",
        f"  output T: f32[1, {rows}, {k}]",
        f"  for k.oo.n in 0..{panels // pb} parallel:",
    ]
    slices = d // ks
    if slices > 1:
        out += [
            f"    for h.w in 0..{rows}:",
            f"      for k.oi in 0..{pb}:",
            "        for k.v in 0..16 vectorized:",
            f"          T[0, h.w, (k.oo.n * {pb} + k.oi) * 16 + k.v] = 0.0f32",
        ]
    out.append(f"    for c.o in 0..{slices}:")
    out += block(d, hw, ks, pb, 0, full, 6, slices == 1)
    if tail:
        out += block(d, hw, ks, pb, full, full + 1, tail, slices == 1)
    return "\n".join(out) + "\n"


def time_ms(texc, path, target, threads):
    out = subprocess.run(
        [texc, "bench", path, "--target", target, "--threads", str(threads), "--repeat", "60"],
        capture_output=True, text=True, check=True,
    ).stdout
    line = next(l for l in out.splitlines() if l.strip().startswith("time"))
    words = line.replace(",", "").split()
    return float(words[1]), float(words[words.index("min") + 1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("d", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("hw", type=int)
    ap.add_argument("slices")
    ap.add_argument("--panels", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--target", default="host")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--texc", default=os.path.join(ROOT, "target", "release", "texc"))
    a = ap.parse_args()
    depths = [int(s) for s in a.slices.split(",")]
    pb = min(a.panels, a.k // 16)
    if a.k % 16 or (a.k // 16) % pb or any(a.d % s for s in depths):
        ap.error("K must be a multiple of 16 × panels, and each slice must divide D")
    tmp = tempfile.mkdtemp()
    files = {}
    for s in depths:
        files[s] = os.path.join(tmp, f"slices_{s}.loops")
        with open(files[s], "w") as f:
            f.write(nest(a.d, a.k, a.hw, s, pb))
    times = {s: [] for s in depths}
    for _ in range(a.rounds):
        for s in depths:
            times[s].append(time_ms(a.texc, files[s], a.target, a.threads))
    for s in depths:
        med = sorted(t[0] for t in times[s])
        mins = sorted(t[1] for t in times[s])
        print(f"{a.d} -> {a.k} at {a.hw}², slices of {s}: medians {med[0]:.3f}–{med[-1]:.3f} ms, minima {mins[0]:.3f}–{mins[-1]:.3f}")


if __name__ == "__main__":
    main()
