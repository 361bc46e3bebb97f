#!/usr/bin/env python3
"""The coefficients of the vector `erf` of the LLVM backend
(codegen/src/llvm/math.rs, `vector_erff`), and its error in f32.

erf(x) = x·P(x²) on [0, 1] (P of degree 6) and 1 − e^−x²·Q(1/x) on [1, 4]
(Q of degree 7 approximating erfcx(x) = e^x²·erfc(x)), each fitted by least
squares on Chebyshev nodes, reweighted towards the largest errors (a cheap
approach to minimax). Prints the coefficients (highest degree first) and the
largest error of Horner's rule evaluated in f32 against math.erf.
Needs numpy only: python3 scripts/fit_erf.py
"""
import math

import numpy as np

F32 = np.float32


def horner(cs, z):
    r = np.full_like(z, F32(cs[0]))
    for c in cs[1:]:
        r = (r * z + F32(c)).astype(F32)
    return r


def fit(fn, lo, hi, deg, var):
    n = 4000
    k = np.arange(n)
    xs = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / n)
    a = np.vander(var(xs), deg + 1)
    w = np.ones(n)
    for _ in range(30):
        c, *_ = np.linalg.lstsq(a * w[:, None], fn(xs) * w, rcond=None)
        e = np.abs(a @ c - fn(xs))
        w = w * (1 + e / e.max())
    return c


def main():
    erf = np.vectorize(math.erf)
    small = fit(lambda x: erf(x) / x, 1e-4, 1.0, 6, lambda x: x * x)
    x = np.linspace(1e-6, 1.0, 20001).astype(F32)
    y = (x * horner(small, (x * x).astype(F32))).astype(F32)
    exact = erf(x.astype(np.float64))
    print("P (x², [0, 1]):", [float(F32(c)) for c in small])
    print("  max relative error", float(np.max(np.abs(y - exact) / exact)))
    big = fit(np.vectorize(lambda v: math.erfc(v) * math.exp(v * v)), 1.0, 4.0, 7, lambda x: 1 / x)
    x = np.linspace(1.0, 4.0, 40001).astype(F32)
    q = horner(big, (F32(1) / x).astype(F32))
    y = (F32(1) - np.exp(-(x * x).astype(F32)).astype(F32) * q).astype(F32)
    print("Q (1/x, [1, 4]):", [float(c) for c in big])
    print("  max absolute error", float(np.max(np.abs(y - erf(x.astype(np.float64))))))


if __name__ == "__main__":
    main()
