#!/usr/bin/env python3
"""The coefficients of the vector `erf` of the LLVM backend
(codegen/src/llvm/math.rs, `vector_erff`), and its error in f32.

erf(x) = x·P(x²) / Q(x²) on [0, 3.84] (P of degree 6, Q of degree 4 with
Q(0) = 1; ±1 beyond, where erf rounds to within an ulp of 1 in f32), fitted
by linearized least squares (Sanathanan–Koerner: each pass divides by the
last pass's Q) on Chebyshev nodes, relative to erf, reweighted towards the
largest errors (a cheap approach to minimax). Prints the coefficients
(highest degree first) and the largest error of the f32 evaluation (Horner's
rule in fused multiply-adds, then one division) against math.erf.
Needs numpy only: python3 scripts/fit_erf.py
"""
import math

import numpy as np

F32 = np.float32
END = 3.84


def horner_fma(cs, z):
    r = np.full_like(z, F32(cs[0]))
    for c in cs[1:]:
        # One rounding per step, as a fused multiply-add rounds.
        r = (r.astype(np.float64) * z.astype(np.float64) + np.float64(F32(c))).astype(F32)
    return r


def fit(deg_p, deg_q, hi, passes=30):
    n = 6000
    k = np.arange(n)
    xs = hi / 2 + hi / 2 * np.cos(np.pi * (k + 0.5) / n)
    f = np.array([math.erf(x) for x in xs])
    z = xs * xs
    q_last = np.ones(n)
    w = np.ones(n)
    for _ in range(passes):
        # x·P(z) − f·(Q(z) − 1) = f, relative to f and divided by the last Q.
        a = np.hstack([xs[:, None] * np.vander(z, deg_p + 1), -f[:, None] * np.vander(z, deg_q + 1)[:, :-1]])
        s = w / (q_last * f)
        c, *_ = np.linalg.lstsq(a * s[:, None], f * s, rcond=None)
        p, q = c[: deg_p + 1], np.concatenate([c[deg_p + 1 :], [1.0]])
        q_last = np.polyval(q, z)
        e = np.abs(xs * np.polyval(p, z) / q_last - f) / f
        w = w * (1 + e / e.max()) ** 0.5
    return [float(F32(v)) for v in p], [float(F32(v)) for v in q]


def main():
    p, q = fit(6, 4, END)
    print("P (x², numerator / x):", p)
    print("Q (x², denominator):", q)
    x = np.linspace(0.0, END, 400001).astype(F32)
    z = (x * x).astype(F32)
    y = ((x * horner_fma(p, z)).astype(F32) / horner_fma(q, z)).astype(F32).astype(np.float64)
    exact = np.array([math.erf(float(v)) for v in x])
    rel = np.abs(y - exact) / np.maximum(exact, 1e-30)
    print(f"  max relative error {rel.max():.3g} at x = {x[rel.argmax()]}")
    print(f"  erf({END}) in f32: {F32(math.erf(END))!r} (±1 returned from there on)")


if __name__ == "__main__":
    main()
