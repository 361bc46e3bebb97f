#!/usr/bin/env python3
"""texc's GPU kernels called from Python on PyTorch CUDA tensors (DLPack, no
copies, PyTorch's current stream) against PyTorch's own operations, in one
run: what a call costs beyond the kernel itself.

Usage: python3 benches/gpu_python.py [--repeat 50]

For each case, three medians (ms): texc called from Python on CUDA tensors
(CUDA events around `repeat` back-to-back calls, divided), the same kernel
as `texc bench` times it from the CLI on resident buffers (if `--texc` is
given), and PyTorch's operation timed the same way as the first. A column
"call µs" gives the host time to queue one texc call (Python, DLPack,
output allocation, launch), measured without waiting for the GPU.
Needs a GPU, a PyTorch built with CUDA and the texc package.
"""
import argparse
import json
import os
import subprocess
import time

import torch

import texc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GEMM = """
kernel gemm(A: {t}[M, K], B: {t}[K, N]) -> C: f32[M, N] {{
    C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]));
}}
"""
SOFTMAX = """
kernel softmax(X: f32[R, D]) -> Y: f32[R, D] {
    m[r] = max[d](X[r, d]);
    e[r, d] = exp(X[r, d] - m[r]);
    s[r] = sum[d](e[r, d]);
    Y[r, d] = e[r, d] / s[r];
}
"""
IGEMM = """
kernel igemm(A: i8[M, K], W: i8[N, K]) -> C: i32[M, N] {
    C[i, j] = sum[k](i32(A[i, k]) * i32(W[j, k]));
}
"""
ADD = """
kernel add(X: f32[N], Z: f32[N]) -> Y: f32[N] {
    Y[i] = X[i] + Z[i];
}
"""


def cases(target):
    g = 4096
    f16 = lambda *s: torch.randn(*s, device="cuda").half()  # noqa: E731
    bf16 = lambda *s: torch.randn(*s, device="cuda").bfloat16()  # noqa: E731
    f32 = lambda *s: torch.randn(*s, device="cuda")  # noqa: E731
    s8 = lambda *s: torch.randint(-128, 128, s, device="cuda", dtype=torch.int8)  # noqa: E731
    return [
        ("gemm 4096³ f16→f32", GEMM.format(t="f16"), {"M": g, "K": g, "N": g}, (f16(g, g), f16(g, g)),
         lambda a, b: torch.matmul(a, b, out_dtype=torch.float32) if _out_dtype() else (a @ b).float(), 2 * g**3),
        ("gemm 4096³ bf16→f32", GEMM.format(t="bf16"), {"M": g, "K": g, "N": g}, (bf16(g, g), bf16(g, g)),
         lambda a, b: torch.matmul(a, b, out_dtype=torch.float32) if _out_dtype() else (a @ b).float(), 2 * g**3),
        ("igemm 4096³ s8→s32", IGEMM, {"M": g, "K": g, "N": g}, (s8(g, g), s8(g, g)),
         lambda a, w: torch._int_mm(a, w.t()), 2 * g**3),
        ("igemm 8192³ s8→s32", IGEMM, {"M": 2 * g, "K": 2 * g, "N": 2 * g}, (s8(2 * g, 2 * g), s8(2 * g, 2 * g)),
         lambda a, w: torch._int_mm(a, w.t()), 2 * (2 * g)**3),
        ("softmax 16384×4096 f32", SOFTMAX, {"R": 16384, "D": g}, (f32(16384, g),),
         lambda x: torch.softmax(x, dim=1), None),
        ("add 1024 f32 (launch-bound)", ADD, {"N": 1024}, (f32(1024), f32(1024)), lambda x, z: x + z, None),
    ]


def _out_dtype():
    """Whether torch.matmul takes out_dtype (f32 results of f16 products, as texc's)."""
    try:
        a = torch.ones(16, 16, device="cuda").half()
        torch.matmul(a, a, out_dtype=torch.float32)
        return True
    except TypeError:
        return False


def events(fn, repeat):
    """Median over 5 rounds of (time of `repeat` back-to-back calls) / repeat, ms."""
    fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        rounds.append(start.elapsed_time(end) / repeat)
    rounds.sort()
    return rounds[len(rounds) // 2]


def queue_us(fn, repeat):
    """Host µs to queue one call (the GPU not waited for)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / repeat * 1e6


def cli_ms(texc_bin, target, source, sizes, repeat):
    if not texc_bin:
        return None
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "texc_gpu_python_case.tex")
    with open(path, "w") as f:
        f.write(source)
    shape = ",".join(f"{k}={v}" for k, v in sizes.items())
    out = subprocess.run([texc_bin, "bench", path, "--target", target, "--shape", shape, "--repeat", str(repeat),
                          "--json"], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)["time_ms"]["median"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--texc", default="", help="the texc binary, to time each kernel from the CLI too")
    a = ap.parse_args()
    major, _ = torch.cuda.get_device_capability(0)
    target = "nvptx-sm90" if major >= 9 else "nvptx-sm80"
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, texc {texc.__version__}, target {target}")
    print(f"{'case':32} {'texc from Python':>17} {'texc CLI':>9} {'PyTorch':>9} {'÷ PyTorch':>9} {'call µs':>8}")
    for name, source, sizes, args, ref, flops in cases(target):
        try:
            row(a, target, name, source, sizes, args, ref, flops)
        except Exception as e:  # noqa: BLE001 (one case's failure is reported, the others still run)
            print(f"{name:32} failed: {type(e).__name__}: {e}")


def row(a, target, name, source, sizes, args, ref, flops):
    """Time one case and print its line."""
    k = texc.compile(source, target=target, shapes=sizes)
    got, want = k(*args), ref(*args)
    torch.cuda.synchronize()
    err = ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()
    del got, want
    t_texc = events(lambda: k(*args), a.repeat)
    t_torch = events(lambda: ref(*args), a.repeat)
    t_cli = cli_ms(a.texc, target, source, sizes, a.repeat)
    us = queue_us(lambda: k(*args), a.repeat)
    unit = "TOPS" if "s8" in name else "TFLOP/s"
    rate = f" ({flops / t_texc / 1e9:.0f} {unit})" if flops else ""
    cli = f"{t_cli:9.4f}" if t_cli is not None else f"{'-':>9}"
    print(f"{name:32} {t_texc:17.4f} {cli} {t_torch:9.4f} {t_torch / t_texc:8.2f}× {us:8.1f}"
          f"  rel err {err:.1e}{rate}")


if __name__ == "__main__":
    main()
