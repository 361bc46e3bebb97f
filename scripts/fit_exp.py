#!/usr/bin/env python3
"""The polynomial of the vector `exp` of the LLVM backend
(codegen/src/llvm/math.rs, `vector_expf_of`), and its error in f32.

e^r = 1 + r + r²·P(r) on r ∈ [−ln2/2, ln2/2] (what is left of x after
taking k·ln2 out), evaluated by Horner's rule through all seven
coefficients (P's, then 1 and 1), P of degree 4, fitted by least squares on Chebyshev
nodes, weighted to relative error and reweighted towards the largest errors
(a cheap approach to minimax). Cephes' `expf` uses degree 5 for the same
form; degree 4's error (3e-9) is as far below f32's rounding (6e-8) as
Cephes' (1.1e-9), and one coefficient fewer is one register fewer on AVX2's
16. Prints the coefficients (highest degree first), the approximation's
error, and the largest error of Horner's rule in f32 (fused multiply-adds)
against e^r, in units of 2^−23.
Needs numpy only: python3 scripts/fit_exp.py
"""
import math

import numpy as np

F32 = np.float32


def fit(deg):
    n = 4000
    k = np.arange(n)
    h = math.log(2) / 2
    xs = h * np.cos(np.pi * (k + 0.5) / n)
    f = (np.exp(xs) - 1 - xs) / xs**2
    # Weighted so that the residual is the relative error of e^r itself.
    scale = xs**2 / np.exp(xs)
    a = np.vander(xs, deg + 1) * scale[:, None]
    w = np.ones(n)
    for _ in range(40):
        c, *_ = np.linalg.lstsq(a * w[:, None], f * scale * w, rcond=None)
        e = np.abs(a @ c - f * scale)
        w = w * (1 + e / e.max())
    return c


def exp_f32(cs, r):
    """e^r as the backend computes it: Horner's rule through P's
    coefficients and then the 1 of r and the 1, in fused multiply-adds."""
    r = r.astype(F32)
    p = np.full_like(r, F32(cs[0]))
    for c in list(cs[1:]) + [1.0, 1.0]:
        p = (p.astype(np.float64) * r + F32(c)).astype(F32)
    return p


def main():
    cs = [float(F32(c)) for c in fit(4)]
    h = math.log(2) / 2
    r = np.linspace(-h, h, 200001)
    exact = np.exp(r.astype(F32).astype(np.float64))
    approx = np.max(np.abs(np.polyval(cs, r) * r * r + r + 1 - np.exp(r)) / np.exp(r))
    ulps = np.max(np.abs(exp_f32(cs, r) - exact) / exact) / 2**-23
    print("P (highest degree first):", ", ".join(f"{c:.10e}" for c in cs))
    print(f"approximation error {approx:.2e}, in f32 {ulps:.3f} units of 2^-23")


if __name__ == "__main__":
    main()
