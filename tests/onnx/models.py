#!/usr/bin/env python3
"""Builds the ONNX test models with random weights, made by the `onnx`
package's graph builder (nothing is downloaded), and runs them on ONNX
Runtime for reference outputs.

    python3 tests/onnx/models.py MODEL OUT_DIR [--size S] [--seed N]

MODEL is resnet18, mobilenetv2, mbconv, encoder or one of the small cases below.
Writes OUT_DIR/MODEL.onnx, OUT_DIR/x.npy (the input) and OUT_DIR/expected.npy
(ONNX Runtime's output, one thread, all graph optimizations off so that the
reference is the model as written)."""

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Builder:
    """A graph under construction: nodes, initializers and unique names."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.inits = []
        self.count = 0

    def name(self, base):
        self.count += 1
        return f"{base}_{self.count}"

    def weight(self, base, shape, scale=None, kind="normal"):
        n = self.name(base)
        if kind == "normal":
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
            s = scale if scale is not None else np.sqrt(2.0 / fan_in)
            a = self.rng.normal(0.0, s, shape)
        elif kind == "positive":
            a = self.rng.uniform(0.5, 1.5, shape)
        else:
            a = self.rng.uniform(-0.1, 0.1, shape)
        self.inits.append(numpy_helper.from_array(a.astype(np.float32), n))
        return n

    def const(self, base, array):
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(array), n))
        return n

    def op(self, op_type, inputs, base=None, **attrs):
        out = self.name(base or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"/{out}/{op_type}", **attrs))
        return out

    # ---------------------------------------------------------------- layers

    def conv(self, x, cin, cout, k, stride=1, pad=0, group=1, bias=False, pads=None):
        w = self.weight("w", [cout, cin // group, k, k])
        ins = [x, w] + ([self.weight("b", [cout], kind="small")] if bias else [])
        return self.op("Conv", ins, "conv", kernel_shape=[k, k], strides=[stride, stride],
                       pads=pads or [pad] * 4, group=group)

    def bn(self, x, c):
        ins = [x, self.weight("gamma", [c], kind="positive"), self.weight("beta", [c], kind="small"),
               self.weight("mean", [c], kind="small"), self.weight("var", [c], kind="positive")]
        return self.op("BatchNormalization", ins, "bn", epsilon=1e-5)

    def model(self, x_shape, out_name, out_shape, opset=17, x_type=TensorProto.FLOAT):
        """`out_shape` None: the output's shape is left to shape inference."""
        x = helper.make_tensor_value_info("x", x_type, x_shape)
        y = helper.make_tensor_value_info(out_name, TensorProto.FLOAT, out_shape)
        g = helper.make_graph(self.nodes, "model", [x], [y], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="texc-tests")
        m.ir_version = 8
        if out_shape is None:
            inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
            m.graph.output[0].CopyFrom(inferred.graph.output[0])
        onnx.checker.check_model(m)
        return m


def rename_output(b, y):
    """Make the last node's output the graph output `y`."""
    b.nodes[-1].output[0] = "y"
    return "y"


def resnet18(size, seed):
    b = Builder(seed)
    x = b.op("Relu", [b.bn(b.conv("x", 3, 64, 7, stride=2, pad=3), 64)])
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for cout, stride in [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]:
        y = b.op("Relu", [b.bn(b.conv(x, cin, cout, 3, stride=stride, pad=1), cout)])
        y = b.bn(b.conv(y, cout, cout, 3, pad=1), cout)
        shortcut = x if (stride == 1 and cin == cout) else b.bn(b.conv(x, cin, cout, 1, stride=stride), cout)
        x = b.op("Relu", [b.op("Add", [y, shortcut])])
        cin = cout
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    b.op("Gemm", [x, b.weight("fc_w", [1000, 512]), b.weight("fc_b", [1000], kind="small")], transB=1)
    return b.model([1, 3, size, size], rename_output(b, "y"), [1, 1000])


def mobilenetv2(size, seed):
    b = Builder(seed)

    def conv_bn(x, cin, cout, k, stride=1, group=1, act=True):
        y = b.bn(b.conv(x, cin, cout, k, stride=stride, pad=k // 2, group=group), cout)
        return b.op("Clip", [y, b.const("lo", np.float32(0.0)), b.const("hi", np.float32(6.0))]) if act else y

    x = conv_bn("x", 3, 32, 3, stride=2)
    cin = 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = conv_bn(x, cin, hidden, 1) if t != 1 else x
            y = conv_bn(y, hidden, hidden, 3, stride=stride, group=hidden)
            y = conv_bn(y, hidden, c, 1, act=False)
            x = b.op("Add", [x, y]) if stride == 1 and cin == c else y
            cin = c
    x = conv_bn(x, cin, 1280, 1)
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    b.op("Gemm", [x, b.weight("fc_w", [1000, 1280]), b.weight("fc_b", [1000], kind="small")], transB=1)
    return b.model([1, 3, size, size], rename_output(b, "y"), [1, 1000])


def mbconv(size, seed):
    """EfficientNet's blocks as torchvision exports them: a 1x1 expansion,
    a depthwise 3x3 or 5x5 convolution (stride 1 or 2), SiLU as Sigmoid and
    Mul, squeeze-and-excite (GlobalAveragePool, two 1x1 convolutions with
    bias, SiLU and Sigmoid, a Mul scaling the channels), a 1x1 projection
    and a residual Add; channel counts no vector width divides."""
    b = Builder(seed)

    def silu(y):
        return b.op("Mul", [y, b.op("Sigmoid", [y])])

    def conv_bn(x, cin, cout, k, stride=1, group=1, act=True):
        y = b.bn(b.conv(x, cin, cout, k, stride=stride, pad=k // 2, group=group), cout)
        return silu(y) if act else y

    x = conv_bn("x", 3, 24, 3, stride=2)
    cin = 24
    for e, c, k, s in [(6, 24, 3, 1), (6, 36, 5, 2), (6, 36, 3, 1), (4, 52, 5, 2), (6, 52, 5, 1)]:
        hidden = cin * e
        y = conv_bn(x, cin, hidden, 1)
        y = conv_bn(y, hidden, hidden, k, stride=s, group=hidden)
        squeeze = max(1, cin // 4)
        pooled = b.op("GlobalAveragePool", [y])
        z = silu(b.conv(pooled, hidden, squeeze, 1, bias=True))
        z = b.op("Sigmoid", [b.conv(z, squeeze, hidden, 1, bias=True)])
        y = conv_bn(b.op("Mul", [z, y]), hidden, c, 1, act=False)
        x = b.op("Add", [x, y]) if s == 1 and cin == c else y
        cin = c
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    b.op("Gemm", [x, b.weight("fc_w", [10, cin]), b.weight("fc_b", [10], kind="small")], transB=1)
    return b.model([1, 3, size, size], rename_output(b, "y"), [1, 10])


def encoder(size, seed):
    """A post-norm transformer encoder block as PyTorch exports it:
    attention with 4 heads, GELU (erf form) feed-forward, LayerNormalization."""
    b = Builder(seed)
    s, d, h = size, 64, 4
    dh = d // h

    def linear(x, din, dout):
        y = b.op("MatMul", [x, b.weight("w", [din, dout], scale=1.0 / np.sqrt(din))])
        return b.op("Add", [y, b.weight("b", [dout], kind="small")])

    def heads(x, perm):
        y = b.op("Reshape", [x, b.const("shape", np.array([1, s, h, dh], np.int64))])
        return b.op("Transpose", [y], perm=perm)

    def layer_norm(x):
        return b.op("LayerNormalization", [x, b.weight("ln_g", [d], kind="positive"),
                                            b.weight("ln_b", [d], kind="small")], axis=-1, epsilon=1e-5)

    q = heads(linear("x", d, d), [0, 2, 1, 3])
    k = heads(linear("x", d, d), [0, 2, 3, 1])
    v = heads(linear("x", d, d), [0, 2, 1, 3])
    scores = b.op("Div", [b.op("MatMul", [q, k]), b.const("scale", np.float32(np.sqrt(dh)))])
    ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]),
                           b.const("shape", np.array([1, s, d], np.int64))])
    x = layer_norm(b.op("Add", ["x", linear(ctx, d, d)]))
    f = linear(x, d, 4 * d)
    # GELU as torch.onnx exports nn.GELU(): x * 0.5 * (1 + erf(x / sqrt(2)))
    g = b.op("Erf", [b.op("Div", [f, b.const("sqrt2", np.float32(np.sqrt(2.0)))])])
    g = b.op("Mul", [b.op("Mul", [f, b.op("Add", [g, b.const("one", np.float32(1.0))])]),
                     b.const("half", np.float32(0.5))])
    x = layer_norm(b.op("Add", [x, linear(g, 4 * d, d)]))
    return b.model([1, s, d], rename_output(b, "y"), [1, s, d])


VOCAB = 50


def embedding(size, seed):
    """A transformer's front: token embeddings (a Gather of int64 ids, some
    negative: they count from the end), position embeddings (a Gather of
    constant positions), a Gather of the ids along a table's second axis,
    LayerNormalization and a projection."""
    b = Builder(seed)
    s, d = size, 32
    tok = b.op("Gather", [b.weight("tok", [VOCAB, d], scale=1.0), "x"], axis=0)
    pos = b.op("Gather", [b.weight("pos", [s, d], scale=1.0), b.const("positions", np.arange(s, dtype=np.int64))],
               axis=0)
    col = b.op("Transpose", [b.op("Gather", [b.weight("cols", [d, VOCAB], scale=1.0), "x"], axis=1)], perm=[1, 2, 0])
    h = b.op("Add", [b.op("Add", [tok, pos]), col])
    h = b.op("LayerNormalization", [h, b.weight("ln_g", [d], kind="positive"), b.weight("ln_b", [d], kind="small")],
             axis=-1, epsilon=1e-5)
    b.op("MatMul", [h, b.weight("proj", [d, 16], scale=1.0 / np.sqrt(d))])
    return b.model([1, s], rename_output(b, "y"), [1, s, 16], x_type=TensorProto.INT64)


def small(size, seed):
    """Operators the big models do not use: asymmetric padding, strides and
    dilation, average pooling, Concat, ReduceMean, Pow/Sqrt, Sigmoid, Tanh,
    LeakyRelu, HardSwish, broadcasting Sub, Squeeze/Unsqueeze, MatMul of
    matrices, comparisons, And/Or/Not, Where and a constant Range."""
    b = Builder(seed)
    x = b.conv("x", 3, 8, 3, stride=2, pads=[0, 1, 1, 0], bias=True)
    x = b.op("LeakyRelu", [x], alpha=0.1)
    y = b.op("Conv", [x, b.weight("w", [8, 8, 3, 3])], kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2])
    y = b.op("HardSwish", [y])
    x = b.op("Concat", [x, b.op("Sigmoid", [y]), b.op("Tanh", [x])], axis=1)
    x = b.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
    mean = b.op("ReduceMean", [x], axes=[2, 3], keepdims=1)
    centered = b.op("Sub", [x, mean])
    var = b.op("ReduceMean", [b.op("Pow", [centered, b.const("two", np.float32(2.0))])], axes=[2, 3], keepdims=1)
    x = b.op("Div", [centered, b.op("Sqrt", [b.op("Add", [var, b.const("eps", np.float32(1e-5))])])])
    x = b.op("ReduceMax", [x], axes=[2, 3], keepdims=1)
    x = b.op("Squeeze", [x, b.const("axes", np.array([2, 3], np.int64))])
    x = b.op("MatMul", [x, b.weight("m", [24, 10])])
    # Comparisons and logic feeding Where (attention masks do this).
    f = lambda v: b.const("c", np.float32(v))  # noqa: E731
    pos = b.op("Greater", [x, f(0.5)])
    inside = b.op("And", [b.op("GreaterOrEqual", [x, f(-100.0)]), b.op("LessOrEqual", [x, f(100.0)])])
    keep = b.op("And", [b.op("Or", [pos, b.op("Not", [b.op("Less", [x, f(100.0)])])]), inside])
    keep = b.op("And", [keep, b.op("Equal", [x, x])])
    x = b.op("Where", [keep, x, b.op("Mul", [x, f(0.1)])])
    x = b.op("Add", [x, b.op("Mul", [b.op("Range", [f(0.0), f(10.0), f(1.0)]), f(0.01)])])
    x = b.op("Unsqueeze", [x, b.const("axes", np.array([1], np.int64))])
    b.op("Softmax", [x], axis=-1)
    return b.model([1, 3, size, size], rename_output(b, "y"), [1, 1, 10])


def activations(size, seed):
    """Activations, pooling and normalization forms that map to std.nn
    operators added for ONNX (opset 18: Mish)."""
    b = Builder(seed)
    x = b.op("Elu", ["x"], alpha=0.5)
    x = b.op("Selu", [x])
    x = b.op("Conv", [x, b.weight("w", [4, 4, 3, 3])], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    x = b.op("Softplus", [x])
    x = b.op("Mish", [b.op("Sub", [x, b.const("one", np.float32(1.0))])])
    x = b.op("PRelu", [x, b.weight("slope", [4, 1, 1], scale=0.25)])
    x = b.op("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)
    x = b.op("HardSwish", [b.op("Mul", [x, b.const("four", np.float32(4.0))])])
    g = b.op("Flatten", [b.op("GlobalMaxPool", [x])], axis=1)
    f = b.op("Flatten", [x], axis=1)
    x = b.op("Concat", [g, b.op("Gemm", [f, b.weight("fc", [4, 4 * size * size])], transB=1)], axis=1)
    x = b.op("Reshape", [x, b.const("shape", np.array([1, 2, 4], np.int64))])
    x = b.op("BatchNormalization", [x, b.weight("g", [2], kind="positive"), b.weight("b", [2], kind="small"),
                                    b.weight("m", [2], kind="small"), b.weight("v", [2], kind="positive")])
    x = b.op("Gelu", [x], approximate="tanh")
    b.op("LogSoftmax", [x], axis=-1)
    return b.model([1, 4, size, size], rename_output(b, "y"), [1, 2, 4], opset=20)


def layout(size, seed):
    """Pooling beyond std.nn's square windows (ceil_mode, asymmetric pads,
    averages without the padding), Resize, DepthToSpace, Slice, Split,
    Gather, Cast and 1-D convolution."""
    b = Builder(seed)
    m = b.op("MaxPool", ["x"], kernel_shape=[2, 3], strides=[2, 1], pads=[0, 1, 1, 1], ceil_mode=1)
    a = b.op("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0)
    a = b.op("Cast", [a], to=TensorProto.FLOAT)
    m = b.op("Slice", [m, b.const("s", np.array([0], np.int64)), b.const("e", np.array([a_h(size)], np.int64)),
                       b.const("ax", np.array([3], np.int64))])
    a = b.op("Slice", [a, b.const("s", np.array([0], np.int64)), b.const("e", np.array([size], np.int64)),
                       b.const("ax", np.array([2], np.int64))])
    x = b.op("Concat", [m, a, a, m], axis=1)
    # An empty `roi` initializer, as tf2onnx and older exporters write the omitted input.
    x = b.op("Resize", [x, b.const("roi", np.array([], np.float32)), b.const("scales", np.array([1, 1, 2, 2], np.float32))], mode="nearest",
             coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    x = b.op("DepthToSpace", [x], blocksize=2, mode="CRD")
    x = b.op("Slice", [x, b.const("s", np.array([1, -1], np.int64)), b.const("e", np.array([-1, 0], np.int64)),
                       b.const("ax", np.array([2, 3], np.int64)), b.const("st", np.array([2, -3], np.int64))])
    lo, hi = "lo_part", "hi_part"
    b.nodes.append(helper.make_node("Split", [x, b.const("sp", np.array([1, 1], np.int64))], [lo, hi], name="/split/Split", axis=1))
    x = b.op("Concat", [hi, lo, b.op("Gather", [x, b.const("g", np.array([1, 0], np.int64))], axis=1)], axis=1)
    x = b.op("Gather", [x, b.const("row", np.array(0, np.int64))], axis=0)
    # [4, H', W'] as a batch of 1-D signals: [1, 4, H'·W'] through a 1-D convolution
    hw = b.name("flat")
    b.nodes.append(helper.make_node("Reshape", [x, b.const("shape", np.array([1, 4, -1], np.int64))], [hw], name="/r/Reshape"))
    b.op("Conv", [hw, b.weight("w1", [3, 4, 3]), b.weight("b1", [3], kind="small")], kernel_shape=[3], pads=[1, 1], strides=[2])
    return b.model([1, 2, size, size + 1], rename_output(b, "y"), None, opset=13)


def decoder(size, seed):
    """A decoder's operators: ConvTranspose (stride 2, padding, output
    padding, bias, and without), bilinear and non-integer nearest Resize
    (PyTorch's interpolate), Softmax over the channels, LayerNormalization
    over the last two axes, Expand of a weight and of a result."""
    b = Builder(seed)
    x = b.conv("x", 3, 6, 3, stride=2, pad=1, bias=True)
    x = b.op("Relu", [x])
    h = (size + 1) // 2
    x = b.op("ConvTranspose", [x, b.weight("wt", [6, 5, 3, 3]), b.weight("bt", [5], kind="small")],
             kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
    up = 2 * h
    x = b.op("Resize", [x, "", "", b.const("sizes", np.array([1, 5, up + up // 2, up + up // 2], np.int64))],
             mode="linear", coordinate_transformation_mode="pytorch_half_pixel")
    x = b.op("ConvTranspose", [x, b.weight("wt", [5, 4, 2, 2])], kernel_shape=[2, 2])
    s3 = up + up // 2 + 1
    x = b.op("Resize", [x, "", "", b.const("sizes", np.array([1, 4, s3 - 2, s3 + 3], np.int64))],
             mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    x = b.op("Softmax", [x], axis=1)
    x = b.op("LayerNormalization", [x, b.weight("g", [s3 - 2, s3 + 3], kind="positive"),
                                    b.weight("beta", [s3 - 2, s3 + 3], kind="small")], axis=-2, epsilon=1e-5)
    shift = b.op("Expand", [b.weight("shift", [4, 1, 1], kind="small"),
                            b.const("shape", np.array([1, 1, s3 - 2, 1], np.int64))])
    x = b.op("Add", [x, shift])
    b.op("Expand", [x, b.const("shape", np.array([2, 1, 1, 1], np.int64))])
    return b.model([1, 3, size, size], rename_output(b, "y"), None, opset=17)


def attention3d(size, seed):
    """A 3-D convolution (with and without bias, stride and padding) and
    opset 23's Attention, causal and not."""
    b = Builder(seed)
    x = b.op("Conv", ["x", b.weight("w", [4, 2, 3, 3, 3]), b.weight("b", [4], kind="small")],
             kernel_shape=[3, 3, 3], pads=[1] * 6)
    x = b.op("Relu", [x])
    k = b.op("Conv", [x, b.weight("w", [4, 4, 1, 1, 1])], kernel_shape=[1, 1, 1])
    q = b.op("Reshape", [x, b.const("shape", np.array([1, 4, 4, size * size], np.int64))])
    k = b.op("Reshape", [k, b.const("shape", np.array([1, 4, 4, size * size], np.int64))])
    a = b.op("Attention", [q, k, q], is_causal=1)
    c = b.op("Attention", [a, q, k])
    b.op("Add", [a, c])
    return b.model([1, 2, 4, size, size], rename_output(b, "y"), None, opset=23)


def a_h(size):
    return (size + 1) // 2


def shapes(size, seed):
    """The shape arithmetic of exporters, which the importer computes at
    import time: Shape → Gather → Unsqueeze → Concat → Reshape (a flatten),
    integer Mul and Div, Slice and Cast of constants, ConstantOfShape."""
    b = Builder(seed)
    c = b.conv("x", 3, 4, 3, pad=1, bias=True)
    s = b.op("Shape", [c])
    n = b.op("Unsqueeze", [b.op("Gather", [s, b.const("zero", np.array(0, np.int64))], axis=0),
                           b.const("ax", np.array([0], np.int64))])
    hw = b.op("Slice", [s, b.const("s", np.array([2], np.int64)), b.const("e", np.array([4], np.int64))])
    area = b.op("Mul", [b.op("Gather", [hw, b.const("zero", np.array(0, np.int64))], axis=0),
                        b.op("Gather", [hw, b.const("one", np.array(1, np.int64))], axis=0)])
    per = b.op("Div", [b.op("Mul", [area, b.const("four", np.array(4, np.int64))]), b.const("one", np.array(1, np.int64))])
    shape = b.op("Concat", [n, b.op("Unsqueeze", [per, b.const("ax", np.array([0], np.int64))])], axis=0)
    f = b.op("Reshape", [c, shape])
    y = b.op("Gemm", [f, b.weight("fc", [5, 4 * size * size]), b.weight("fb", [5], kind="small")], transB=1)
    bias = b.op("ConstantOfShape", [b.const("shape", np.array([1, 5], np.int64))],
                value=numpy_helper.from_array(np.array([0.5], np.float32)))
    scale = b.op("Cast", [b.op("Gather", [s, b.const("c", np.array(1, np.int64))], axis=0)], to=TensorProto.FLOAT)
    b.op("Add", [b.op("Mul", [y, scale]), bias])
    return b.model([1, 3, size, size], rename_output(b, "y"), [1, 5], opset=13)


def i64(a):
    return np.array(a, np.int64)


def masks(size, seed):
    """What PyTorch's exporters write for transformers: a bool initializer
    (a causal mask) in Where, Equal and Where on integer constants around an
    Expand's shape (ViT's class token), Trilu of a constant and of data,
    Gather of position embeddings with [1, T] indices and of data with 2-D
    indices, a 0-d Pow and 0-d values computed at run time, comparisons,
    Not/And/Or/Xor, IsNaN and Casts of run-time bools, ScatterND of constants
    (Swin's window mask, Swin V2's bias with updates from an Expand of 0)."""
    b = Builder(seed)
    t, d = size, 8
    x = b.op("MatMul", ["x", b.weight("wq", [d, d], scale=1.0)])
    scores = b.op("MatMul", [x, b.op("Transpose", [x], perm=[0, 2, 1])])
    causal = b.const("causal", np.tril(np.ones((1, t, t), bool)))
    scores = b.op("Where", [causal, scores, b.const("ninf", np.array(-np.inf, np.float32))])
    att = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), x])
    # The Expand shape of ViT's class token: Where(Equal(shape, -1), 1, shape).
    shape = b.op("Concat", [b.const("one", i64([1])), b.const("m1", i64([-1])), b.const("d", i64([d]))], axis=0)
    ones = b.op("ConstantOfShape", [b.const("three", i64([3]))], value=numpy_helper.from_array(i64([1])))
    minus = b.op("Mul", [ones, b.const("m1", i64(-1))])
    fixed = b.op("Where", [b.op("Equal", [shape, minus]), ones, shape])
    token = b.op("Expand", [b.weight("cls", [1, 1, d], scale=1.0), fixed])
    # Position embeddings: a Gather with [1, T] constant indices (Range → Unsqueeze).
    pos_ids = b.op("Unsqueeze", [b.op("Range", [b.const("z", i64(0)), b.const("t", i64(t)), b.const("o", i64(1))]),
                                 b.const("ax0", i64([0]))])
    pos = b.op("Gather", [b.weight("wpe", [t + 3, d], scale=1.0), pos_ids], axis=0)
    # A lower-triangular constant from Trilu, and Trilu of data (upper, k = -1).
    tri = b.op("Trilu", [b.const("ones_tt", np.ones((t, t), np.float32))], upper=0)
    mixed = b.op("MatMul", [tri, b.op("Trilu", [b.op("Reshape", [att, b.const("td", i64([t, d]))]),
                                                b.const("k", i64(-1))], upper=1)])
    # Gather of data with 2-D indices (rows picked twice, out of order).
    picked = b.op("Gather", [mixed, b.const("rows", i64([[t - 1, 0], [1, t - 1]]))], axis=0)
    picked = b.op("ReduceSum", [picked, b.const("ax01", i64([0, 1]))], keepdims=0)
    # A 0-d Pow of constants (GPT-2's 1/sqrt(d)), and a 0-d value of data.
    scale = b.op("Pow", [b.const("two", np.array(2.0, np.float32)), b.const("half", np.array(-0.5, np.float32))])
    total = b.op("ReduceMean", [att], keepdims=0)
    scaled = b.op("Mul", [b.op("Sub", [att, total]), scale])
    # A 0-d element of data picked by a scalar index.
    one = b.op("Gather", [b.op("Reshape", [att, b.const("flat_all", i64([-1]))]), b.const("k3", i64(3))], axis=0)
    scaled = b.op("Add", [scaled, one])
    # Bools of data: comparisons, logic, Cast to f32.
    pos_x = b.op("Greater", [scaled, b.const("zf", np.array(0.0, np.float32))])
    small = b.op("Less", [b.op("Abs", [scaled]), b.const("lim", np.array(0.5, np.float32))])
    logic = b.op("Or", [b.op("And", [pos_x, b.op("Not", [small])]), b.op("Xor", [pos_x, small])])
    scaled = b.op("Add", [scaled, b.op("Cast", [logic], to=TensorProto.FLOAT)])
    # IsNaN, as exporters guard a softmax whose row is all masked: log of the negatives is NaN.
    logs = b.op("Log", [scaled])
    scaled = b.op("Add", [scaled, b.op("Where", [b.op("IsNaN", [logs]), b.const("zf3", np.array(0.0, np.float32)),
                                                 logs])])
    y = b.op("Add", [b.op("Add", [scaled, b.op("Add", [pos, token])]), b.op("Unsqueeze", [mixed, b.const("ax0", i64([0]))])])
    # Swin's shifted-window mask: regions numbered by ScatterND into zeros, then compared.
    regions = b.op("ConstantOfShape", [b.const("tt", i64([t, t]))], value=numpy_helper.from_array(np.array([0.0], np.float32)))
    regions = b.op("ScatterND", [regions, b.const("at", i64([[[0, 1], [2, 3]], [[t - 1, 0], [1, 1]]])),
                                 b.const("upd", np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))])
    regions = b.op("ScatterND", [regions, b.const("row", i64([[t - 2]])), b.const("upd_row", np.full((1, t), 5.0, np.float32))])
    region_mask = b.op("Where", [b.op("Equal", [regions, b.const("zero_f", np.array(0.0, np.float32))]),
                                 b.const("zf2", np.array(0.0, np.float32)), b.const("m100", np.array(-100.0, np.float32))])
    y = b.op("Add", [y, b.op("MatMul", [region_mask, b.op("Reshape", [att, b.const("td2", i64([t, d]))])])])
    # Swin V2 zeroes the key third of its qkv bias: a ScatterND whose updates are an Expand of 0.
    zeros = b.op("Expand", [b.const("zero1", np.array([0.0], np.float32)), b.const("dlen", i64([d]))])
    qkv_bias = b.op("ScatterND", [b.weight("qkv_b", [3 * d], scale=1.0),
                                  b.const("keys", i64([[k] for k in range(d, 2 * d)])), zeros])
    bias = b.op("ReduceSum", [b.op("Reshape", [qkv_bias, b.const("three_d", i64([3, d]))]), b.const("ax0b", i64([0]))],
                keepdims=0)
    y = b.op("Add", [y, bias])
    b.op("Add", [y, picked])
    return b.model([1, t, d], rename_output(b, "y"), [1, t, d])


def int_data(size, seed):
    """Integer and bool tensors computed at run time from int64 ids, as a
    BERT-style padding mask is: comparisons, Where of integers, Cast to f32
    and bool, Unsqueeze and Expand of integers, integer arithmetic (Mod,
    truncating Div)."""
    b = Builder(seed)
    keep = b.op("Greater", ["x", b.const("z", i64(0))])
    ids = b.op("Where", [keep, "x", b.op("Neg", ["x"])])
    ids = b.op("Add", [b.op("Mul", [ids, b.const("two", i64(2))]), b.const("one", i64(1))])
    mask = b.op("Cast", [b.op("Unsqueeze", [keep, b.const("ax", i64([1]))]), ], to=TensorProto.FLOAT)
    bias = b.op("Mul", [b.op("Sub", [b.const("onef", np.array(1.0, np.float32)), mask]),
                        b.const("big", np.array(-100.0, np.float32))])
    as_bool = b.op("Cast", [b.op("Expand", [ids, b.const("shape", i64([3, 1, size]))]), ], to=TensorProto.BOOL)
    odd = b.op("Cast", [b.op("Equal", [b.op("Mod", [ids, b.const("three", i64(3))]), b.const("z2", i64(0))])],
               to=TensorProto.FLOAT)
    # Integer division truncates toward zero (some quotients here are negative).
    quot = b.op("Cast", [b.op("Div", [b.op("Sub", [ids, b.const("c", i64(40))]), b.const("d", i64(7))])],
                to=TensorProto.FLOAT)
    emb = b.op("Gather", [b.weight("tok", [2 * VOCAB + 1, 4], scale=1.0), ids], axis=0)
    y = b.op("Add", [b.op("Transpose", [emb], perm=[0, 2, 1]), bias])
    y = b.op("Add", [y, b.op("Cast", [as_bool], to=TensorProto.FLOAT)])
    b.op("Add", [b.op("Add", [y, odd]), quot])
    return b.model([1, size], rename_output(b, "y"), [3, 4, size], x_type=TensorProto.INT64)


def channels_last(size, seed):
    """LayerNormalization as Swin and ConvNeXt export it: over the channels
    of an [N, H, W, C] tensor; also over the last three axes, and with a
    scale that broadcasts to the normalized shape; Pad of such a tensor."""
    b = Builder(seed)
    c = 6
    x = b.op("Transpose", [b.conv("x", 3, c, 3, pad=1, bias=True)], perm=[0, 2, 3, 1])
    ln = lambda h, shape, axis: b.op("LayerNormalization", [h, b.weight("g", shape, kind="positive"),  # noqa: E731
                                                            b.weight("b", shape, kind="small")], axis=axis,
                                     epsilon=1e-6)
    h = ln(x, [c], -1)
    h = ln(h, [size, size, c], 1)
    h = b.op("LayerNormalization", [h, b.weight("g", [1, size, c], kind="positive")], axis=1, epsilon=1e-5)
    # Swin pads its channels-last windows (zeros), here unevenly and with another value too.
    h = b.op("Pad", [h, b.const("pads", i64([0, 1, 2, 0, 0, 2, 1, 0])), b.const("v", np.array(0.5, np.float32))])
    h = b.op("Pad", [h, b.const("pads", i64([0, 0, 0, 0, 0, 0, 0, 0]))])
    b.op("Transpose", [h], perm=[0, 3, 1, 2])
    return b.model([1, 3, size, size], rename_output(b, "y"), [1, c, size + 3, size + 3])


def recurrent(size, seed):
    """LSTM and GRU as ONNX defines them: a bidirectional LSTM with biases,
    initial states and peepholes; a reverse GRU (linear_before_reset = 1,
    PyTorch's) and a forward one (linear_before_reset = 0) with an initial
    state; every output, flattened and joined into one."""
    b = Builder(seed)
    t, n, i, h = size, 2, 5, 4
    w = lambda shape: b.weight("w", shape, scale=0.5)  # noqa: E731
    flat = lambda v: b.op("Reshape", [v, b.const("flat", i64([-1]))])  # noqa: E731
    outs = [b.name("Y"), b.name("Y_h"), b.name("Y_c")]
    b.nodes.append(helper.make_node(
        "LSTM", ["x", w([2, 4 * h, i]), w([2, 4 * h, h]), w([2, 8 * h]), "", w([2, n, h]), w([2, n, h]), w([2, 3 * h])],
        outs, name="/lstm/LSTM", direction="bidirectional", hidden_size=h))
    # [T, 2, N, H] → [T, N, 2H], the next layer's input.
    seq = b.op("Reshape", [b.op("Transpose", [outs[0]], perm=[0, 2, 1, 3]), b.const("tnh", i64([t, n, 2 * h]))])
    g1 = [b.name("G1"), b.name("G1_h")]
    b.nodes.append(helper.make_node("GRU", [seq, w([1, 3 * h, 2 * h]), w([1, 3 * h, h]), w([1, 6 * h])], g1,
                                    name="/gru/GRU", direction="reverse", hidden_size=h, linear_before_reset=1))
    g2 = [b.name("G2"), b.name("G2_h")]
    b.nodes.append(helper.make_node("GRU", ["x", w([1, 3 * h, i]), w([1, 3 * h, h]), w([1, 6 * h]), "",
                                            w([1, n, h])], g2, name="/gru2/GRU", hidden_size=h))
    b.op("Concat", [flat(v) for v in outs + g1 + g2], axis=0)
    total = t * 2 * n * h + 2 * (2 * n * h) + t * n * h + n * h + n * t * h + n * h
    return b.model([t, n, i], rename_output(b, "y"), [total])


def einsum(size, seed):
    """Einsum as exporters write it: a batched product, attention scores with
    `...`, the implicit output form, a diagonal and a reduction to a vector;
    the results flattened and joined."""
    b = Builder(seed)
    flat = lambda v: b.op("Reshape", [v, b.const("flat", i64([-1]))])  # noqa: E731
    e = lambda eq, *ins: b.op("Einsum", list(ins), equation=eq)  # noqa: E731
    proj = e("bij,jk->bik", "x", b.weight("w", [4, 5], scale=0.5))
    scores = e("...ij,...kj->...ik", "x", "x")
    implicit = e("ij,jk", b.op("Reshape", ["x", b.const("s", i64([2 * size, 4]))]), b.weight("v", [4, 3], scale=0.5))
    diag = e("bii->bi", b.op("MatMul", ["x", b.op("Transpose", ["x"], perm=[0, 2, 1])]))
    vec = e("bij,bij->b", "x", "x")
    b.op("Concat", [flat(v) for v in (proj, scores, implicit, diag, vec)], axis=0)
    total = 2 * size * 5 + 2 * size * size + 2 * size * 3 + 2 * size + 2
    return b.model([2, size, 4], rename_output(b, "y"), [total])


def rank5(size, seed):
    """Forms of Swin V2 and MaxViT: Softmax and LogSoftmax over the last and a
    middle axis of a rank-5 tensor; ReduceL2, ReduceL1, ReduceSumSquare and
    ReduceProd; GatherND of constants and of data (1- and 2-element index
    tuples). The results flattened and joined."""
    b = Builder(seed)
    flat = lambda v: b.op("Reshape", [v, b.const("flat", i64([-1]))])  # noqa: E731
    x = "x"  # [1, 2, 3, size, 4]
    outs = [b.op("Softmax", [x], axis=-1), b.op("LogSoftmax", [x], axis=2), b.op("Softmax", [x], axis=1)]
    outs.append(b.op("ReduceL2", [x], axes=[3], keepdims=1))
    outs.append(b.op("ReduceL1", [x], axes=[1, 4], keepdims=0))
    outs.append(b.op("ReduceSumSquare", [x], axes=[2], keepdims=0))
    outs.append(b.op("ReduceProd", [x], axes=[4], keepdims=0))
    table = b.const("table", np.arange(24, dtype=np.float32).reshape(4, 6))
    picked = b.op("GatherND", [table, b.const("ti", i64([[3], [0], [3]]))])
    flat_x = b.op("Reshape", [x, b.const("s2", i64([6, size * 4]))])
    outs.append(b.op("MatMul", [picked, b.op("Transpose", [b.op("Slice", [flat_x, b.const("z", i64([0])),
                                                                        b.const("six", i64([6])),
                                                                        b.const("one", i64([1]))])])]))
    outs.append(b.op("GatherND", [flat_x, b.const("di", i64([[[5], [0]], [[1], [1]]]))]))
    outs.append(b.op("GatherND", [b.op("Reshape", [x, b.const("s3", i64([6, size, 4]))]),
                                  b.const("pairs", i64([[5, size - 1], [0, 0], [2, 1]]))]))
    b.op("Concat", [flat(v) for v in outs], axis=0)
    return b.model([1, 2, 3, size, 4], rename_output(b, "y"), None)


def symbolic(size, seed):
    """A batch dimension left symbolic, as torch.onnx.export's dynamic_axes leaves it."""
    b = Builder(seed)
    b.op("Relu", [b.conv("x", 3, 4, 3, pad=1, bias=True)])
    m = b.model(["batch", 3, size, size], rename_output(b, "y"), ["batch", 4, size, size])
    return m


def unsupported_op(size, seed):
    """An operator texc does not import (Hardmax)."""
    b = Builder(seed)
    b.op("Hardmax", [b.op("Relu", ["x"])], axis=-1)
    return b.model([1, size], rename_output(b, "y"), [1, size])


def small_maps(size, seed):
    """3×3 convolutions on a 7×7 map (a network's last stage): many filters
    (128 → 512) and few (512 → 32), each with bias and ReLU."""
    b = Builder(seed)
    x = b.op("Relu", [b.conv("x", 128, 512, 3, pad=1, bias=True)])
    b.op("Relu", [b.conv(x, 512, 32, 3, pad=1, bias=True)])
    return b.model([1, 128, size, size], rename_output(b, "y"), [1, 32, size, size])


def bad_strides(size, seed):
    """A convolution with different strides per axis."""
    b = Builder(seed)
    b.op("Conv", ["x", b.weight("w", [4, 3, 3, 3])], kernel_shape=[3, 3], strides=[2, 1])
    return b.model([1, 3, size, size], rename_output(b, "y"), [1, 4, (size - 3) // 2 + 1, size - 2])


MODELS = {"embedding": (embedding, 12), "decoder": (decoder, 9), "attention3d": (attention3d, 5), "resnet18": (resnet18, 64), "mobilenetv2": (mobilenetv2, 64), "mbconv": (mbconv, 53), "encoder": (encoder, 16),
          "small": (small, 17), "activations": (activations, 6), "layout": (layout, 9), "shapes": (shapes, 5), "symbolic": (symbolic, 8), "unsupported_op": (unsupported_op, 8),
          "bad_strides": (bad_strides, 9), "masks": (masks, 6), "int_data": (int_data, 7),
          "channels_last": (channels_last, 5), "recurrent": (recurrent, 5), "einsum": (einsum, 3),
          "rank5": (rank5, 5), "small_maps": (small_maps, 7)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("out")
    ap.add_argument("--size", type=int)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    build, default_size = MODELS[a.model]
    m = build(a.size or default_size, a.seed)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"{a.model}.onnx")
    onnx.save(m, path)
    # A symbolic dimension is 1 in the reference run.
    shape = [d.dim_value or 1 for d in m.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(a.seed + 1)
    if m.graph.input[0].type.tensor_type.elem_type == TensorProto.INT64:
        x = rng.integers(-VOCAB, VOCAB, shape).astype(np.int64)
    else:
        x = rng.normal(0.0, 1.0, shape).astype(np.float32)
    np.save(os.path.join(a.out, "x.npy"), x)
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": x})[0]
    np.save(os.path.join(a.out, "expected.npy"), y)
    print(f"{path}: {len(m.graph.node)} nodes, output {list(y.shape)}")


if __name__ == "__main__":
    sys.exit(main())
