#!/usr/bin/env python3
"""Write texc/link/text-order.txt.gz: the functions of the `texc` executable
that its common work runs, for the linker to lay out first and together.

Why: most of texc's code is LLVM's, and a run touches a function here and
there across it (static constructors before `main`, then the code
generator). Each page fault maps the 64 KiB around it, so a run touching
15 MB of scattered code held 37 MB of the executable resident. Laid out
together (`texc/build.rs` passes the list to the linker as
`--symbol-ordering-file`), the same functions take about their own size.

How, in two passes over the same workloads (`texc --version`, the examples,
and the ONNX models named on the command line, each with the
`inputs.npz` beside it when there is one):
1. valgrind's callgrind (one thread, no compile cache) lists every function
   a run entered; those the executable defines (`nm`) make the list.
   Valgrind's CPU has no AVX-512, so LLVM is also asked for AVX-512 code
   (`emit --stage asm --target x86-avx512`) there.
2. On the machine's own CPU, with its threads, `perf` records the page
   faults of the runs; a fault in the executable's code outside the list
   names a function the profile missed (and one in `.rodata` a constant,
   where the constant has a symbol: few do). Each round adds those,
   relinks, and runs again (`--rounds`, default 3); rounds stop early when
   none are left. Skipped where `perf` cannot record page faults.
   `--refine-only` starts from the list in the tree instead of pass 1.

Names that later builds no longer have are ignored by the linker, so a
stale list costs nothing but its benefit; regenerate it when LLVM, the Rust
toolchain or texc's dependencies change:

    python3 scripts/text-order.py [--rounds N] [MODEL.onnx ...]

(`benches/zoo.py --keep DIR` exports models; the list in the tree was made
from MNASNet 0.5, BERT and ResNet-50, then refined by `--refine-only
--rounds 4` with Swin-T, EfficientNet-B0 and Inception-v3 added.)
"""
import argparse
import bisect
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "texc", "link", "text-order.txt.gz")
TEXC = os.path.join(ROOT, "target", "release", "texc")
EXAMPLES = ["conv_resnet", "depthwise", "sgemm", "softmax", "pooling", "gelu", "quantize", "conv_bn_relu", "im2col"]


def model_args(command, model, *extra):
    args = [command, model, "--target", "host", *extra]
    inputs = os.path.join(os.path.dirname(model), "inputs.npz")
    return args + (["--input", inputs] if os.path.exists(inputs) else [])


def profiled_workloads(models):
    """Runs for callgrind: startup first."""
    yield ["--version"]
    for e in EXAMPLES:
        yield ["run", f"examples/{e}.tex", "--target", "host", "--no-cache"]
        yield ["emit", "--stage", "asm", f"examples/{e}.tex", "--target", "x86-avx512", "--no-cache"]
    for m in models:
        yield model_args("run", m, "--no-cache")


def faulting_workloads(models):
    """Runs for perf, on the machine's own CPU and threads."""
    yield ["--version"]
    for e in EXAMPLES:
        yield ["run", f"examples/{e}.tex", "--target", "host", "--check", "--no-cache"]
    yield ["bench", "examples/sgemm.tex", "--target", "host", "--repeat", "2", "--no-cache"]
    for m in models:
        yield model_args("run", m, "--no-cache")
        yield model_args("bench", m, "--repeat", "2")


def build():
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "texc"], cwd=ROOT, check=True)


def defined_symbols():
    """The functions and read-only data the executable defines: their
    names, and the data as sorted (start, end, name)."""
    nm = subprocess.run(["nm", "--defined-only", "-S", TEXC], capture_output=True, text=True, check=True).stdout
    names, data = set(), []
    for p in (l.split() for l in nm.splitlines()):
        if len(p) == 4 and p[2] in "tTwWrR":
            names.add(p[3])
            if p[2] in "rR":
                data.append((int(p[0], 16), int(p[0], 16) + int(p[1], 16), p[3]))
    return names, sorted(data)


def section(name):
    """An executable's section as (start, end) addresses."""
    for line in subprocess.run(["readelf", "-SW", TEXC], capture_output=True, text=True, check=True).stdout.splitlines():
        p = line.replace("[ ", "[").split()
        if len(p) > 5 and p[1] == name:
            return int(p[3], 16), int(p[3], 16) + int(p[5], 16)
    sys.exit(f"{TEXC} has no {name} section")


def entered(args, scratch):
    """The functions a run entered, by callgrind (mangled names)."""
    out = os.path.join(scratch, "callgrind.out")
    cmd = ["valgrind", "--tool=callgrind", "--demangle=no", "--smc-check=all-non-file",
           f"--callgrind-out-file={out}", TEXC, *args]
    run(cmd, args, dict(os.environ, TEXC_NUM_THREADS="1"))
    with open(out, errors="replace") as f:
        return [m.group(1) for m in (re.match(r"^c?fn=\(\d+\) (.*)$", l) for l in f) if m]


def faulted(args, scratch, text, rodata, data):
    """The functions whose code, and the constants whose bytes, a run's
    page faults first touched, by perf."""
    out = os.path.join(scratch, "perf.data")
    run(["perf", "record", "-q", "-e", "page-faults", "-c", "1", "-d", "-o", out, TEXC, *args], args, None)
    script = subprocess.run(["perf", "script", "--no-demangle", "-i", out, "-F", "addr,sym"],
                            capture_output=True, text=True, check=True).stdout
    starts = [d[0] for d in data]
    names = []
    for line in script.splitlines():
        p = line.split()
        if not p:
            continue
        addr = int(p[0], 16)
        if text[0] <= addr < text[1] and len(p) >= 2:
            names.append(p[1])
        elif rodata[0] <= addr < rodata[1]:
            i = bisect.bisect_right(starts, addr) - 1
            if i >= 0 and addr < data[i][1]:
                names.append(data[i][2])
    return names


def run(cmd, args, env):
    r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"texc {' '.join(args)} failed under {cmd[0]}:\n{r.stderr[-2000:]}")


def write(order):
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    # mtime 0: the same list compresses to the same bytes.
    with open(OUT, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(("\n".join(order) + "\n").encode())


def add(order, seen, names, defined):
    """Append the defined names not in the list yet; how many."""
    before = len(order)
    for n in names:
        if n in defined and n not in seen:
            seen.add(n)
            order.append(n)
    return len(order) - before


def perf_records_faults(scratch):
    probe = os.path.join(scratch, "probe.data")
    r = subprocess.run(["perf", "record", "-q", "-e", "page-faults", "-c", "1", "-o", probe, "true"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return r.returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="ONNX models to run as workloads")
    ap.add_argument("--rounds", type=int, default=3, help="perf refinement rounds (0: none)")
    ap.add_argument("--refine-only", action="store_true", help="start from the list in the tree, not from callgrind")
    a = ap.parse_args()
    for tool in ("valgrind", "nm", "readelf"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed (apt install valgrind binutils)")
    models = [os.path.abspath(m) for m in a.models]
    build()
    defined, _ = defined_symbols()
    order, seen = [], set()
    with tempfile.TemporaryDirectory() as scratch:
        if a.refine_only:
            with gzip.open(OUT, "rt") as f:
                add(order, seen, f.read().split(), defined)
        else:
            for args in profiled_workloads(models):
                print("callgrind: texc", " ".join(args), file=sys.stderr)
                add(order, seen, entered(args, scratch), defined)
            write(order)
            print(f"{len(order)} functions from callgrind", file=sys.stderr)
        rounds = a.rounds if shutil.which("perf") and perf_records_faults(scratch) else 0
        for r in range(rounds):
            build()
            (defined, data), text, rodata = defined_symbols(), section(".text"), section(".rodata")
            new = 0
            for args in faulting_workloads(models):
                new += add(order, seen, faulted(args, scratch, text, rodata, data), defined)
            print(f"perf round {r + 1}: {new} functions or constants faulted outside the list", file=sys.stderr)
            if new == 0:
                break
            write(order)
    build()
    print(f"{len(order)} functions -> {os.path.relpath(OUT, ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
