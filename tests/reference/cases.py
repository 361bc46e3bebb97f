"""NumPy references for the conformance test (tests/tests/conformance.rs).

Usage: python3 cases.py OUTDIR

For every case, writes OUTDIR/<case>/<input>.npy and OUTDIR/<case>/ref_<output>.npy,
and one line per case to OUTDIR/manifest.txt:
    case<TAB>tex file<TAB>kernel<TAB>outputs (comma-separated)
References are computed in float64 (then cast to the output dtype), with
PyTorch semantics for norms, pools and gelu: biased variance, eps inside
the square root, count_include_pad for average pooling, exact erf.
"""
import math
import os
import sys

import numpy as np

rng = np.random.default_rng(20261121)
OUT = sys.argv[1]
manifest = []


def f32(*shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def case(name, tex, kernel, inputs, refs, consts=""):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    for k, v in inputs.items():
        np.save(os.path.join(d, k + ".npy"), v)
    for k, v in refs.items():
        np.save(os.path.join(d, "ref_" + k + ".npy"), v)
    manifest.append("\t".join([name, tex, kernel, ",".join(refs), consts]))


def d64(x):
    return x.astype(np.float64)


def matmul(a, b):
    return d64(a) @ d64(b)


def conv2d(x, w, pad=0, stride=1, dilation=1, groups=1):
    x, w = d64(x), d64(w)
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - dilation * (r - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dilation * (s - 1) - 1) // stride + 1
    y = np.zeros((n, k, oh, ow))
    kg = k // groups
    for ko in range(k):
        g = ko // kg
        for ri in range(r):
            for si in range(s):
                patch = xp[:, g * cg:(g + 1) * cg, ri * dilation: ri * dilation + stride * (oh - 1) + 1: stride,
                           si * dilation: si * dilation + stride * (ow - 1) + 1: stride]
                y[:, ko] += np.einsum("nchw,c->nhw", patch, w[ko, :, ri, si])
    return y


def pool(x, k, stride, pad, op):
    x = d64(x)
    n, c, h, w = x.shape
    fill = -np.inf if op == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    wins = np.stack([xp[:, :, r: r + stride * (oh - 1) + 1: stride, s: s + stride * (ow - 1) + 1: stride]
                     for r in range(k) for s in range(k)])
    return wins.max(0) if op == "max" else wins.sum(0) / (k * k)


def softmax(x):
    x = d64(x)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def layer_norm(x, g, b, eps=1e-5):
    x = d64(x)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def batch_norm(x, g, b, m, v, eps=1e-5):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    r = lambda t: d64(t).reshape(shape)
    return (d64(x) - r(m)) / np.sqrt(r(v) + eps) * r(g) + r(b)


def group_norm(x, g, b, groups, eps=1e-5):
    n, c, h, w = x.shape
    xg = d64(x).reshape(n, groups, -1)
    mu = xg.mean(-1, keepdims=True)
    var = ((xg - mu) ** 2).mean(-1, keepdims=True)
    y = ((xg - mu) / np.sqrt(var + eps)).reshape(n, c, h, w)
    return y * d64(g).reshape(1, -1, 1, 1) + d64(b).reshape(1, -1, 1, 1)


def instance_norm(x, eps=1e-5):
    x = d64(x)
    mu = x.mean((2, 3), keepdims=True)
    var = ((x - mu) ** 2).mean((2, 3), keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


erf = np.vectorize(math.erf)


def gelu(x):
    x = d64(x)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-d64(x)))


def quantize(x, scale, zp):
    # ONNX's QuantizeLinear: the quotient in f32 (as ONNX Runtime divides), then rounded half to even.
    quotient = x.astype(np.float32) / np.asarray(scale, dtype=np.float32)
    return np.clip(np.round(d64(quotient)) + zp, -128, 127).astype(np.int8)


def as32(x):
    return x.astype(np.float32)


def positive(*shape):
    return f32(*shape, lo=0.5, hi=1.5)


S = "tests/conformance/std_ops.tex"

# ---- std.nn operators, at shapes that no tile size divides
A, B = f32(13, 7), f32(7, 9)
case("matmul", S, "t_matmul", {"A": A, "B": B}, {"C": as32(matmul(A, B))})
A, B = f32(3, 5, 6), f32(3, 6, 4)
case("batch_matmul", S, "t_batch_matmul", {"A": A, "B": B}, {"C": as32(d64(A) @ d64(B))})
X, W, b = f32(5, 11), f32(6, 11), f32(6)
case("dense", S, "t_dense", {"X": X, "W": W, "b": b}, {"Y": as32(d64(X) @ d64(W).T + b)})
X, W = f32(2, 3, 11, 10), f32(4, 3, 3, 3)
case("conv2d_pad_stride_dilation", S, "t_conv2d", {"X": X, "Wt": W}, {"Y": as32(conv2d(X, W, 1, 2, 2))})
case("conv2d_im2col", S, "t_conv2d_im2col", {"X": X, "Wt": W}, {"Y": as32(conv2d(X, W, 1, 2, 2))})
case("conv2d_im2col_t", S, "t_conv2d_im2col_t", {"X": X, "Wt": W}, {"Y": as32(conv2d(X, W, 1, 2, 2))})
X, W, b = f32(2, 3, 8, 12), f32(4, 3, 3, 3), f32(4)
bias = d64(b).reshape(1, -1, 1, 1)
case("winograd_f2_bias_relu", S, "t_winograd_f2", {"X": X, "Wt": W, "b": b},
     {"Y": as32(np.maximum(conv2d(X, W, 1) + bias, 0))})
case("winograd_f4_bias", S, "t_winograd_f4", {"X": X, "Wt": W, "b": b}, {"Y": as32(conv2d(X, W, 1) + bias)})
X, W = f32(1, 6, 7, 9), f32(4, 3, 2, 3)
case("conv2d_groups", S, "t_conv2d_groups", {"X": X, "Wt": W}, {"Y": as32(conv2d(X, W, groups=2))})
X, b = f32(4, 5), f32(5)
case("bias_add2", S, "t_bias_add2", {"X": X, "b": b}, {"Y": as32(d64(X) + b)})
X, b = f32(2, 3, 4, 5), f32(3)
case("bias_add4", S, "t_bias_add4", {"X": X, "b": b}, {"Y": as32(d64(X) + d64(b).reshape(1, -1, 1, 1))})
P, Q = f32(2, 3, 4, 5), f32(2, 3, 4, 5)
case("add", S, "t_add", {"A": P, "B": Q}, {"Y": as32(d64(P) + Q)})
P, Q = f32(2, 3, 7), f32(2, 3, 7)
case("sub", S, "t_sub", {"A": P, "B": Q}, {"Y": as32(d64(P) - Q)})
P, Q = f32(5, 6), f32(5, 6)
case("mul", S, "t_mul", {"A": P, "B": Q}, {"Y": as32(d64(P) * Q)})
P, Q = f32(17), f32(17, lo=0.5, hi=2.0)
case("div", S, "t_div", {"A": P, "B": Q}, {"Y": as32(d64(P) / Q)})
X = f32(2, 3, 4, 5)
case("relu", S, "t_relu", {"X": X}, {"Y": as32(np.maximum(d64(X), 0))})
X = f32(6, 7, lo=-8, hi=8)
case("relu6", S, "t_relu6", {"X": X}, {"Y": as32(np.clip(d64(X), 0, 6))})
X = f32(6, 7, lo=-5, hi=5)
case("sigmoid", S, "t_sigmoid", {"X": X}, {"Y": as32(sigmoid(X))})
X = f32(2, 3, 5, lo=-3, hi=3)
case("tanh", S, "t_tanh", {"X": X}, {"Y": as32(np.tanh(d64(X)))})
X = f32(4, 9, lo=-4, hi=4)
case("gelu", S, "t_gelu", {"X": X}, {"Y": as32(gelu(X))})
X = f32(19, lo=-4, hi=4)
case("silu", S, "t_silu", {"X": X}, {"Y": as32(d64(X) * sigmoid(X))})
X = f32(2, 3, 4, 5)
case("leaky_relu", S, "t_leaky_relu", {"X": X}, {"Y": as32(np.where(X >= 0, d64(X), 0.1 * d64(np.float32(0.1)) / 0.1 * d64(X)))})
X = f32(5, 13, lo=-4, hi=4)
case("softmax2", S, "t_softmax2", {"X": X}, {"Y": as32(softmax(X))})
X = f32(2, 3, 7, lo=-4, hi=4)
case("softmax3", S, "t_softmax3", {"X": X}, {"Y": as32(softmax(X))})
X = f32(2, 2, 3, 5, lo=-4, hi=4)
case("softmax4", S, "t_softmax4", {"X": X}, {"Y": as32(softmax(X))})
X, g, b, m, v = f32(2, 3, 4, 5), f32(3), f32(3), f32(3), positive(3)
case("batch_norm", S, "t_batch_norm", {"X": X, "g": g, "b": b, "m": m, "v": v}, {"Y": as32(batch_norm(X, g, b, m, v, 1e-3))})
X, g, b, m, v = f32(4, 6), f32(6), f32(6), f32(6), positive(6)
case("batch_norm2", S, "t_batch_norm2", {"X": X, "g": g, "b": b, "m": m, "v": v}, {"Y": as32(batch_norm(X, g, b, m, v))})
X, g, b = f32(5, 33), f32(33), f32(33)
case("layer_norm", S, "t_layer_norm", {"X": X, "g": g, "b": b}, {"Y": as32(layer_norm(X, g, b))})
X, g, b = f32(2, 3, 17), f32(17), f32(17)
case("layer_norm3", S, "t_layer_norm3", {"X": X, "g": g, "b": b}, {"Y": as32(layer_norm(X, g, b))})
X, g, b = f32(2, 8, 3, 5), f32(8), f32(8)
case("group_norm", S, "t_group_norm", {"X": X, "g": g, "b": b}, {"Y": as32(group_norm(X, g, b, 4))})
X = f32(2, 3, 5, 7)
case("instance_norm", S, "t_instance_norm", {"X": X}, {"Y": as32(instance_norm(X))})
X = f32(2, 3, 11, 8)
case("max_pool2d", S, "t_max_pool2d", {"X": X}, {"Y": as32(pool(X, 3, 2, 1, "max"))})
case("avg_pool2d", S, "t_avg_pool2d", {"X": X}, {"Y": as32(pool(X, 3, 2, 1, "avg"))})
X = f32(1, 2, 9, 7)
case("max_pool2d_k2", S, "t_max_pool2d_k2", {"X": X}, {"Y": as32(pool(X, 2, 2, 0, "max"))})
X = f32(2, 3, 5, 6)
case("global_avg_pool2d", S, "t_global_avg_pool2d", {"X": X}, {"Y": as32(d64(X).mean((2, 3), keepdims=True))})
X = f32(1, 2, 3, 4)
case("pad4", S, "t_pad4", {"X": X}, {"Y": np.pad(X, ((0, 0), (1, 0), (2, 1), (0, 2)), constant_values=np.float32(-1.5))})
X = f32(3, 4)
case("pad2", S, "t_pad2", {"X": X}, {"Y": np.pad(X, 1)})
X = f32(3, 5)
case("transpose2", S, "t_transpose2", {"X": X}, {"Y": np.ascontiguousarray(X.T)})
X = f32(2, 3, 4, 5)
case("transpose4", S, "t_transpose4", {"X": X}, {"Y": np.ascontiguousarray(np.transpose(X))})
X = f32(2, 3, 4, 5)
case("permute4", S, "t_permute4", {"X": X}, {"Y": np.ascontiguousarray(np.transpose(X, (0, 2, 3, 1)))})
X = f32(2, 3, 5)
case("permute3", S, "t_permute3", {"X": X}, {"Y": np.ascontiguousarray(np.transpose(X, (1, 0, 2)))})
X = f32(6, 9, lo=-8, hi=8)
case("quantize", S, "t_quantize", {"X": X}, {"Q": quantize(X, d64(np.float32(0.05)), -4)})
X, s = f32(2, 3, 4, 5, lo=-3, hi=3), np.array(0.02, dtype=np.float32)
case("quantize4", S, "t_quantize4", {"X": X, "s": s}, {"Q": quantize(X, d64(s), 0)})
X, s, z = f32(4, 9, lo=-3, hi=3), f32(4, lo=0.01, hi=0.05), rng.integers(-10, 10, 4).astype(np.int32)
case("quantize_per_channel", S, "t_quantize_pc", {"X": X, "s": s, "z": z},
     {"Q": quantize(X, d64(s).reshape(-1, 1), z.reshape(-1, 1))})
Q = rng.integers(-128, 128, (5, 6)).astype(np.int8)
case("dequantize", S, "t_dequantize", {"Q": Q}, {"Y": as32((Q.astype(np.int64) + 4) * d64(np.float32(0.05)))})
Q, s, z = rng.integers(-128, 128, (3, 2, 2, 4)).astype(np.int8), f32(3, lo=0.01, hi=0.1), rng.integers(-5, 5, 3).astype(np.int32)
case("dequantize_per_channel", S, "t_dequantize_pc", {"Q": Q, "s": s, "z": z},
     {"Y": as32((Q.astype(np.int64) - z.reshape(-1, 1, 1, 1)) * d64(s).reshape(-1, 1, 1, 1))})
X, s, z = f32(2, 5, 3, lo=-3, hi=3), f32(5, lo=0.01, hi=0.05), rng.integers(0, 256, 5).astype(np.int32)
q = X / s.reshape(1, -1, 1)  # the quotient in f32, as ONNX Runtime divides
case("quantize_u8_axis1", S, "t_quantize_u8_axis1", {"X": X, "s": s, "z": z},
     {"Q": np.clip(np.round(d64(q)) + z.reshape(1, -1, 1), 0, 255).astype(np.uint8)})
Q, s, z = rng.integers(0, 256, (2, 3, 4)).astype(np.uint8), f32(4, lo=0.01, hi=0.05), rng.integers(0, 256, 4).astype(np.int32)
case("dequantize_u8_axis2", S, "t_dequantize_u8_axis2", {"Q": Q, "s": s, "z": z},
     {"Y": as32((Q.astype(np.int64) - z) * d64(s))})

# ---- the examples, at their default sizes and at odd ones
for (m, k, n) in [(64, 64, 64), (13, 7, 31)]:
    A, B = f32(m, k), f32(k, n)
    case(f"ex_matmul_{m}x{k}x{n}", "examples/matmul.tex", "matmul", {"A": A, "B": B}, {"C": as32(matmul(A, B))})
for (h, w, pad, stride) in [(20, 20, 1, 2), (9, 13, 2, 3)]:
    X, W = f32(1, 16, h, w), f32(16, 16, 3, 3)
    case(f"ex_conv2d_{h}x{w}_p{pad}_s{stride}", "examples/conv2d.tex", "conv2d", {"X": X, "Wt": W},
         {"Y": as32(conv2d(X, W, pad, stride))}, consts=f"pad={pad},stride={stride}")
X = f32(64, 100, lo=-5, hi=5)
case("ex_softmax", "examples/softmax.tex", "softmax", {"X": X}, {"Y": as32(softmax(X))})
X = f32(8, 257, lo=-5, hi=5)
case("ex_gelu", "examples/gelu.tex", "gelu", {"X": X}, {"Y": as32(gelu(X))})
X = f32(3, 9, 11)
cols = np.zeros((27, 9 * 11), dtype=np.float32)
xp = np.pad(X, ((0, 0), (1, 1), (1, 1)))
for c in range(3):
    for r in range(3):
        for s in range(3):
            cols[c * 9 + r * 3 + s] = xp[c, r:r + 9, s:s + 11].reshape(-1)
case("ex_im2col", "examples/im2col.tex", "im2col", {"X": X}, {"Cols": cols})
A, B = f32(48, 40).astype(np.float16), f32(40, 33).astype(np.float16)
case("ex_gemm_f16", "examples/gemm_f16.tex", "gemm_f16", {"A": A, "B": B}, {"C": as32(matmul(A, B))})
X = f32(16, 64, lo=-4, hi=4)
X[0, :4] = [0.01, 0.03, -0.05, 100.0]  # ties round to even; saturation
case("ex_quantize_int8", "examples/quantize.tex", "quantize_int8", {"X": X},
     {"Q": quantize(X, d64(np.float32(0.02)), 3)})
X, W, g, b, m, v = f32(1, 16, 14, 14), f32(32, 16, 3, 3), f32(32), f32(32), f32(32), positive(32)
case("ex_conv_bn_relu", "examples/conv_bn_relu.tex", "conv_bn_relu",
     {"X": X, "Wt": W, "gamma": g, "beta": b, "mean": m, "var": v},
     {"Y": as32(np.maximum(batch_norm(conv2d(X, W, 1), g, b, m, v), 0))})
X, W = f32(2, 8, 15, 13), f32(8, 1, 3, 3)
case("ex_depthwise", "examples/depthwise.tex", "depthwise3x3", {"X": X, "Wt": W}, {"Y": as32(conv2d(X, W, 1, groups=8))})
X = f32(2, 4, 17, 16)
case("ex_pools", "examples/pooling.tex", "pools", {"X": X},
     {"Ymax": as32(pool(X, 3, 2, 1, "max")), "Yavg": as32(pool(X, 3, 2, 1, "avg"))})
X, g, b, m, v = f32(2, 6, 5, 7), f32(6), f32(6), f32(6), positive(6)
case("ex_bn", "examples/norms.tex", "bn", {"X": X, "gamma": g, "beta": b, "mean": m, "var": v}, {"Y": as32(batch_norm(X, g, b, m, v))})
X, g, b = f32(10, 33), f32(33), f32(33)
case("ex_ln", "examples/norms.tex", "ln", {"X": X, "gamma": g, "beta": b}, {"Y": as32(layer_norm(X, g, b))})
X = f32(2, 3, 9, 4)
case("ex_inorm", "examples/norms.tex", "inorm", {"X": X}, {"Y": as32(instance_norm(X))})
X, g, b = f32(2, 6, 5, 3), f32(6), f32(6)
case("ex_gn", "examples/norms.tex", "gn", {"X": X, "gamma": g, "beta": b}, {"Y": as32(group_norm(X, g, b, 3))})

# ---- activations, layout and pooling added for ONNX models (PyTorch's definitions)
X = f32(2, 3, 4, 5, lo=-5, hi=5)
case("hardswish", S, "t_hardswish", {"X": X}, {"Y": as32(d64(X) * np.clip(d64(X) + 3, 0, 6) / 6)})
X = f32(6, 7, lo=-5, hi=5)
case("hardsigmoid", S, "t_hardsigmoid", {"X": X}, {"Y": as32(np.clip(d64(X) / 6 + 0.5, 0, 1))})
X = f32(23, lo=-3, hi=3)
case("hardtanh", S, "t_hardtanh", {"X": X}, {"Y": as32(np.clip(d64(X), -0.5, 2.0))})
X = f32(2, 3, 7, lo=-3, hi=3)
case("elu", S, "t_elu", {"X": X}, {"Y": as32(np.where(X > 0, d64(X), d64(np.float32(0.7)) * np.expm1(d64(X))))})
X = f32(5, 6, lo=-3, hi=3)
case("selu", S, "t_selu", {"X": X},
     {"Y": as32(1.0507009873554805 * np.where(X > 0, d64(X), 1.6732632423543772 * np.expm1(d64(X))))})
X = f32(5, 9, lo=-8, hi=8)
case("softplus", S, "t_softplus", {"X": X},
     {"Y": as32(np.where(2 * d64(X) > 10, d64(X), np.log1p(np.exp(2 * d64(X))) / 2))})
X = f32(2, 3, 4, 5, lo=-5, hi=5)
case("mish", S, "t_mish", {"X": X}, {"Y": as32(d64(X) * np.tanh(np.log1p(np.exp(d64(X)))))})
X = f32(4, 9, lo=-4, hi=4)
case("gelu_tanh", S, "t_gelu_tanh", {"X": X},
     {"Y": as32(0.5 * d64(X) * (1 + np.tanh(math.sqrt(2 / math.pi) * (d64(X) + 0.044715 * d64(X) ** 3))))})
X, a = f32(2, 3, 4, 5), f32(3, lo=0.0, hi=0.5)
case("prelu", S, "t_prelu", {"X": X, "a": a}, {"Y": as32(np.where(X >= 0, d64(X), d64(a).reshape(1, -1, 1, 1) * d64(X)))})
X = f32(2, 5, 13, lo=-4, hi=4)
m = d64(X).max(-1, keepdims=True)
case("log_softmax", S, "t_log_softmax", {"X": X}, {"Y": as32(d64(X) - m - np.log(np.exp(d64(X) - m).sum(-1, keepdims=True)))})
X, g, b, m, v = f32(2, 6, 7), f32(6), f32(6), f32(6), positive(6)
case("batch_norm3", S, "t_batch_norm3", {"X": X, "g": g, "b": b, "m": m, "v": v},
     {"Y": as32((d64(X) - d64(m)[:, None]) / np.sqrt(d64(v)[:, None] + d64(np.float32(1e-5))) * d64(g)[:, None] + d64(b)[:, None])})
X = f32(2, 3, 5, 7)
case("global_max_pool2d", S, "t_global_max_pool", {"X": X}, {"Y": X.max((2, 3), keepdims=True)})
X = f32(2, 3, 5, 7)
case("flatten", S, "t_flatten", {"X": X}, {"Y": X.reshape(2, -1)})
X, W, b = f32(2, 6, 17), f32(4, 3, 3), f32(4)
Xp = np.pad(d64(X), ((0, 0), (0, 0), (2, 2)))
ref = np.zeros((2, 4, (17 + 4 - 4 - 1) // 2 + 1))
for k in range(4):
    g = k // 2
    for l in range(ref.shape[2]):
        ref[:, k, l] = sum((Xp[:, g * 3 + c, l * 2 + r * 2] * W[k, c, r]) for c in range(3) for r in range(3)) + b[k]
case("conv1d", S, "t_conv1d", {"X": X, "Wt": W, "b": b}, {"Y": as32(ref)})
X, W, b = f32(2, 5, 3, 7), f32(6, 5, 1, 1), f32(6)
case("conv2d_1x1_bias", S, "t_conv2d_1x1_bias", {"X": X, "Wt": W, "b": b},
     {"Y": as32(conv2d(X, W) + d64(b).reshape(1, -1, 1, 1))})

# ---- operators added for ONNX models, part 2 (PyTorch's definitions)
def conv_transpose2d(x, w, stride=1, pad=0, output_padding=0):
    # scatter form: input pixel (y, x) adds W[c, k] at y·stride + r, x·stride + s of the
    # uncropped output, which is then cropped by pad on each side (output_padding extends the end)
    x, w = d64(x), d64(w)
    n, c, h, wd = x.shape
    _, k, r, s = w.shape
    full = np.zeros((n, k, (h - 1) * stride + r + output_padding, (wd - 1) * stride + s + output_padding))
    for y in range(h):
        for xx in range(wd):
            full[:, :, y * stride: y * stride + r, xx * stride: xx * stride + s] += np.einsum("nc,ckrs->nkrs", x[:, :, y, xx], w)
    oh = (h - 1) * stride - 2 * pad + r + output_padding
    ow = (wd - 1) * stride - 2 * pad + s + output_padding
    return full[:, :, pad: pad + oh, pad: pad + ow]


def adaptive_pool(x, oh, ow, op):
    x = d64(x)
    n, c, h, w = x.shape
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        h0, h1 = math.floor(i * h / oh), math.ceil((i + 1) * h / oh)
        for j in range(ow):
            w0, w1 = math.floor(j * w / ow), math.ceil((j + 1) * w / ow)
            win = x[:, :, h0:h1, w0:w1]
            y[:, :, i, j] = win.max((2, 3)) if op == "max" else win.mean((2, 3))
    return y


def upsample_bilinear(x, oh, ow):
    # ATen's upsample_bilinear2d (align_corners = False), in float64
    x = d64(x)
    n, c, h, w = x.shape

    def src(dst, insize, outsize):
        s = max((dst + 0.5) * insize / outsize - 0.5, 0.0)
        i0 = int(s)
        return i0, i0 + (1 if i0 < insize - 1 else 0), s - i0

    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        h0, h1, lh = src(i, h, oh)
        for j in range(ow):
            w0, w1, lw = src(j, w, ow)
            y[:, :, i, j] = ((1 - lh) * ((1 - lw) * x[:, :, h0, w0] + lw * x[:, :, h0, w1])
                             + lh * ((1 - lw) * x[:, :, h1, w0] + lw * x[:, :, h1, w1]))
    return y


def upsample_nearest(x, oh, ow):
    n, c, h, w = x.shape
    hi = [min(int(math.floor(np.float32(i) * (np.float32(h) / np.float32(oh)))), h - 1) for i in range(oh)]
    wi = [min(int(math.floor(np.float32(j) * (np.float32(w) / np.float32(ow)))), w - 1) for j in range(ow)]
    # ATen computes the source index in float32; at these sizes it is the exact floor(i·H/OH)
    assert hi == [i * h // oh for i in range(oh)] and wi == [j * w // ow for j in range(ow)]
    return x[:, :, hi][:, :, :, wi]


def sdpa(q, k, v, causal=False):
    q, k, v = d64(q), d64(k), d64(v)
    s = np.einsum("bhld,bhsd->bhls", q, k) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones((q.shape[2], k.shape[2]), dtype=bool)), s, -np.inf)
    return np.einsum("bhls,bhse->bhle", softmax(s), v)


def conv3d(x, w, pad=0, stride=1):
    x, w = d64(x), d64(w)
    n, c, d, h, wd = x.shape
    k, _, t, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad), (pad, pad)))
    od, oh, ow = (d + 2 * pad - t) // stride + 1, (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    y = np.zeros((n, k, od, oh, ow))
    for ti in range(t):
        for ri in range(r):
            for si in range(s):
                patch = xp[:, :, ti: ti + stride * (od - 1) + 1: stride, ri: ri + stride * (oh - 1) + 1: stride,
                           si: si + stride * (ow - 1) + 1: stride]
                y += np.einsum("ncdhw,kc->nkdhw", patch, w[:, :, ti, ri, si])
    return y


for (h, w, stride, pad, op) in [(5, 7, 2, 1, 1), (4, 3, 3, 2, 2), (6, 5, 1, 0, 0)]:
    X, W = f32(2, 3, h, w), f32(3, 5, 3, 4)
    case(f"conv_transpose2d_s{stride}_p{pad}_op{op}", S, "t_conv_transpose2d", {"X": X, "Wt": W},
         {"Y": as32(conv_transpose2d(X, W, stride, pad, op))}, consts=f"stride={stride},pad={pad},op={op}")
X, W, b = f32(2, 4, 5, 6), f32(4, 3, 5, 3), f32(3)
case("conv_transpose2d_bias", S, "t_conv_transpose2d_bias", {"X": X, "Wt": W, "b": b},
     {"Y": as32(conv_transpose2d(X, W, 3, 2, 1) + d64(b).reshape(1, -1, 1, 1))})
for (h, w, oh, ow) in [(10, 10, 3, 4), (10, 11, 7, 6), (5, 7, 7, 3), (9, 5, 1, 5)]:
    X = f32(2, 3, h, w)
    case(f"adaptive_avg_pool2d_{h}x{w}_{oh}x{ow}", S, "t_adaptive_avg_pool2d", {"X": X},
         {"Y": as32(adaptive_pool(X, oh, ow, "avg"))}, consts=f"OH={oh},OW={ow}")
    case(f"adaptive_max_pool2d_{h}x{w}_{oh}x{ow}", S, "t_adaptive_max_pool2d", {"X": X},
         {"Y": as32(adaptive_pool(X, oh, ow, "max"))}, consts=f"OH={oh},OW={ow}")
for (h, w, oh, ow) in [(11, 6, 5, 13), (5, 7, 10, 7), (7, 4, 3, 11), (1, 3, 4, 1)]:
    X = f32(2, 3, h, w)
    case(f"upsample_bilinear2d_{h}x{w}_{oh}x{ow}", S, "t_upsample_bilinear2d", {"X": X},
         {"Y": as32(upsample_bilinear(X, oh, ow))}, consts=f"OH={oh},OW={ow}")
    case(f"upsample_nearest2d_{h}x{w}_{oh}x{ow}", S, "t_upsample_nearest2d", {"X": X},
         {"Y": upsample_nearest(X, oh, ow)}, consts=f"OH={oh},OW={ow}")
for (l, s) in [(7, 5), (5, 11)]:
    Q, K, V = f32(2, 3, l, 5, lo=-2, hi=2), f32(2, 3, s, 5, lo=-2, hi=2), f32(2, 3, s, 6)
    case(f"sdpa_{l}x{s}", S, "t_sdpa", {"Q": Q, "K": K, "V": V}, {"Y": as32(sdpa(Q, K, V))})
    case(f"sdpa_causal_{l}x{s}", S, "t_sdpa_causal", {"Q": Q, "K": K, "V": V}, {"Y": as32(sdpa(Q, K, V, True))})
Q, K, V = f32(1, 2, 7, 3, lo=-2, hi=2), f32(1, 2, 7, 3, lo=-2, hi=2), f32(1, 2, 7, 5)
case("sdpa_causal_square", S, "t_sdpa_causal", {"Q": Q, "K": K, "V": V}, {"Y": as32(sdpa(Q, K, V, True))})
X = f32(2, 7, 5, lo=-4, hi=4)
case("softmax_dim1_3", S, "t_softmax_dim1_3", {"X": X}, {"Y": as32(np.moveaxis(softmax(np.moveaxis(X, 1, -1)), -1, 1))})
m = d64(X).max(1, keepdims=True)
case("log_softmax_dim1_3", S, "t_log_softmax_dim1_3", {"X": X},
     {"Y": as32(d64(X) - m - np.log(np.exp(d64(X) - m).sum(1, keepdims=True)))})
X = f32(2, 5, 3, 7, lo=-4, hi=4)
case("softmax_dim1_4", S, "t_softmax_dim1_4", {"X": X}, {"Y": as32(np.moveaxis(softmax(np.moveaxis(X, 1, -1)), -1, 1))})
m = d64(X).max(1, keepdims=True)
case("log_softmax_dim1_4", S, "t_log_softmax_dim1_4", {"X": X},
     {"Y": as32(d64(X) - m - np.log(np.exp(d64(X) - m).sum(1, keepdims=True)))})
X, g, b = f32(3, 5, 7), f32(5, 7), f32(5, 7)
case("layer_norm2_3", S, "t_layer_norm2_3", {"X": X, "g": g, "b": b},
     {"Y": as32(layer_norm(d64(X).reshape(3, -1), d64(g).reshape(-1), d64(b).reshape(-1)).reshape(3, 5, 7))})
X, g, b = f32(2, 3, 5, 7), f32(5, 7), f32(5, 7)
case("layer_norm2_4", S, "t_layer_norm2_4", {"X": X, "g": g, "b": b},
     {"Y": as32(layer_norm(d64(X).reshape(2, 3, -1), d64(g).reshape(-1), d64(b).reshape(-1), d64(np.float32(1e-3)))
                .reshape(2, 3, 5, 7))})
X, W = f32(2, 3, 5, 7, 6), f32(4, 3, 3, 2, 3)
case("conv3d_pad_stride", S, "t_conv3d", {"X": X, "Wt": W}, {"Y": as32(conv3d(X, W, 1, 2))})
X, W, b = f32(1, 2, 5, 6, 7), f32(3, 2, 2, 3, 3), f32(3)
case("conv3d_bias", S, "t_conv3d_bias", {"X": X, "Wt": W, "b": b},
     {"Y": as32(conv3d(X, W) + d64(b).reshape(1, -1, 1, 1, 1))})
for r in [2, 3]:
    X = f32(2, 2 * r * r, 3, 5)
    ref = X.reshape(2, 2, r, r, 3, 5).transpose(0, 1, 4, 2, 5, 3).reshape(2, 2, 3 * r, 5 * r)
    case(f"pixel_shuffle_r{r}", S, "t_pixel_shuffle", {"X": X}, {"Y": ref}, consts=f"r={r}")

# Indices outside 0..V (PyTorch raises) give rows of zeros.
W = f32(11, 6)
I = rng.integers(-2, 13, 9).astype(np.int64)
case("embedding_1", S, "t_embedding_1", {"I": I, "W": W},
     {"Y": np.where(((I >= 0) & (I < 11))[:, None], W[np.clip(I, 0, 10)], 0).astype(np.float32)})
W = f32(40, 5)
I = rng.integers(0, 40, (3, 7)).astype(np.int64)
case("embedding_2", S, "t_embedding_2", {"I": I, "W": W}, {"Y": W[I]})

# Winograd at sizes that are not multiples of its tiles (the last tiles
# reach past the image), padded and unpadded.
X, W, b = f32(1, 3, 7, 9), f32(4, 3, 3, 3), f32(4)
bias = d64(b).reshape(1, -1, 1, 1)
case("winograd_f2_odd", S, "t_winograd_f2", {"X": X, "Wt": W, "b": b},
     {"Y": as32(np.maximum(conv2d(X, W, 1) + bias, 0))})
case("winograd_f2k_odd", S, "t_winograd_f2k", {"X": X, "Wt": W, "b": b},
     {"Y": as32(np.maximum(conv2d(X, W, 1) + bias, 0))})
case("winograd_f4_odd", S, "t_winograd_f4", {"X": X, "Wt": W, "b": b}, {"Y": as32(conv2d(X, W, 1) + bias)})
case("winograd_f2_valid", S, "t_winograd_f2_valid", {"X": X, "Wt": W}, {"Y": as32(conv2d(X, W, 0))})
case("winograd_f2k_valid", S, "t_winograd_f2k_valid", {"X": X, "Wt": W, "b": b}, {"Y": as32(conv2d(X, W, 0) + bias)})
case("winograd_f4_valid", S, "t_winograd_f4_valid", {"X": X, "Wt": W, "b": b},
     {"Y": as32(np.maximum(conv2d(X, W, 0) + bias, 0))})

X, W, b = f32(2, 5, 7, 10), f32(6, 5, 1, 1), f32(6)
case("conv2d_1x1_strided", S, "t_conv2d_1x1_strided", {"X": X, "Wt": W, "b": b},
     {"Y": as32(conv2d(X, W, 0, 2) + d64(b).reshape(1, -1, 1, 1))})

with open(os.path.join(OUT, "manifest.txt"), "w") as f:
    f.write("\n".join(manifest) + "\n")
print(f"{len(manifest)} cases")
