#!/usr/bin/env python3
"""Builds small f32 models with the `onnx` graph builder (random weights,
nothing downloaded), quantizes them with ONNX Runtime's own tools, and runs
the quantized model on ONNX Runtime for reference outputs.

    python3 tests/onnx/quantized.py MODEL MODE OUT_DIR [--act u8|i8] [--per-channel] [--size S] [--opset N] [--seed N]

MODEL: cnn (conv + relu + max pool, depthwise and grouped conv, clip,
global pool, gemm), encoder (tests/onnx/models.py's transformer block),
resnet18 or mobilenetv2 (at 32x32), qop (QLinearConv, QLinearMatMul,
ConvInteger and MatMulInteger written by hand), or qmm (QDQ products of two
activations written by hand).
MODE: static (`quantize_static`, QDQ format, a CalibrationDataReader over
random inputs), dynamic (`quantize_dynamic`), or qoperator
(`quantize_static` in the QOperator format).
Writes OUT_DIR/MODEL.onnx (the quantized model), x.npy, expected.npy (ONNX
Runtime's output, one thread, graph optimizations off so that the reference
is the model as written, its signed weights given to ORT as unsigned ones:
`exact_integer_products`) and step.txt (the output's quantization step: the
scale of the last DequantizeLinear, 0 where the output is not quantized).
"""

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def cnn(size, seed):
    b = models.Builder(seed)
    x = b.op("Relu", [b.conv("x", 3, 8, 3, pad=1, bias=True)])
    x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = b.op("Relu", [b.conv(x, 8, 8, 3, pad=1, group=8, bias=True)])
    x = b.op("Clip", [b.conv(x, 8, 16, 3, stride=2, pad=1, group=2, bias=True),
                      b.const("lo", np.float32(0.0)), b.const("hi", np.float32(6.0))])
    x = b.conv(x, 16, 16, 1, bias=True)
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    b.op("Gemm", [x, b.weight("fc_w", [10, 16]), b.weight("fc_b", [10], kind="small")], transB=1)
    return b.model([1, 3, size, size], models.rename_output(b, "y"), [1, 10])


def qop(size, seed):
    """The QOperator forms by hand: QLinearConv (per-channel weights, i32
    bias), QLinearMatMul, DynamicQuantizeLinear, ConvInteger and
    MatMulInteger with zero points, dequantized at the end."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def init(name, a):
        inits.append(numpy_helper.from_array(np.asarray(a), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out] if isinstance(out, str) else out, name=f"/{op}_{len(nodes)}", **attrs))
        return out

    init("xs", np.float32(0.05)), init("xz", np.uint8(120))
    xq = node("QuantizeLinear", ["x", "xs", "xz"], "xq")
    init("w", rng.integers(-127, 128, [8, 3, 3, 3]).astype(np.int8))
    init("ws", rng.uniform(0.002, 0.01, [8]).astype(np.float32)), init("wz", np.zeros(8, np.int8))
    init("ys", np.float32(0.08)), init("yz", np.uint8(128))
    init("bias", rng.integers(-2000, 2000, [8]).astype(np.int32))
    c = node("QLinearConv", [xq, "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"], "c", pads=[1, 1, 1, 1])
    # [1, 8, S, S] -> [8, S*S] rows; a matrix product with a constant.
    r = node("Reshape", [c, init("shape", np.array([8, size * size], np.int64))], "r")
    init("m", rng.integers(-127, 128, [size * size, 12]).astype(np.int8))
    init("ms", np.float32(0.004)), init("mz", np.int8(3))
    init("os", np.float32(0.5)), init("oz", np.uint8(100))
    mm = node("QLinearMatMul", [r, "ys", "yz", "m", "ms", "mz", "os", "oz"], "mm")
    f = node("DequantizeLinear", [mm, "os", "oz"], "f")
    q, s, z = node("DynamicQuantizeLinear", [f], ["dq", "dq_scale", "dq_zero"])
    init("m2", rng.integers(-127, 128, [12, 6]).astype(np.int8)), init("m2z", np.int8(-2))
    i = node("MatMulInteger", [q, "m2", z, "m2z"], "i")
    fi = node("Cast", [i], "fi", to=TensorProto.FLOAT)
    y1 = node("Mul", [fi, s], "y1")
    # ConvInteger on the dequantized conv output, quantized dynamically.
    fc = node("DequantizeLinear", [c, "ys", "yz"], "fc")
    q2, s2, z2 = node("DynamicQuantizeLinear", [fc], ["q2", "q2_scale", "q2_zero"])
    init("cw", rng.integers(0, 256, [4, 8, 3, 3]).astype(np.uint8)), init("cwz", np.uint8(130))
    ci = node("ConvInteger", [q2, "cw", z2, "cwz"], "ci", strides=[2, 2], pads=[0, 1, 1, 0])
    y2 = node("Mul", [node("Cast", [ci], "fci", to=TensorProto.FLOAT), s2], "y2")
    y2 = node("ReduceSum", [y2, init("axes", np.array([0, 2, 3], np.int64))], "y2s", keepdims=0)
    node("Add", [node("ReduceSum", [y1, init("axes0", np.array([0], np.int64))], "y1s", keepdims=0),
                 node("Pad", [y2, init("pads", np.array([0, 2], np.int64))], "y2p")], "y")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])
    g = helper.make_graph(nodes, "qop", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="texc-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def qmm(size, seed):
    """Products of two u8 activations in QDQ form by hand, as attention's
    are: batch dimensions that broadcast ([1, 2] against [2, 1]), a second
    operand's zero point above 128 (200) and at 128, a first operand's at 0
    and not; the two products requantized, added and requantized."""
    inits, nodes = [], []

    def init(name, a):
        inits.append(numpy_helper.from_array(np.asarray(a), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], name=f"/{op}_{len(nodes)}", **attrs))
        return out

    def qdq(x, scale, zero, name, out=None):
        init(f"{name}_s", np.float32(scale)), init(f"{name}_z", np.uint8(zero))
        q = node("QuantizeLinear", [x, f"{name}_s", f"{name}_z"], f"{name}_q")
        return node("DequantizeLinear", [q, f"{name}_s", f"{name}_z"], out or f"{name}_d")

    # x: [1, 2, S, 8]; t: [2, 1, 8, S].
    t = node("Transpose", ["x"], "t", perm=[1, 0, 3, 2])
    a1, b1 = qdq("x", 0.02, 121, "a1"), qdq(t, 0.03, 200, "b1")
    a2, b2 = qdq("x", 0.025, 0, "a2"), qdq(t, 0.02, 128, "b2")
    m1 = qdq(node("MatMul", [a1, b1], "m1"), 0.05, 110, "m1")
    m2 = qdq(node("MatMul", [a2, b2], "m2"), 0.04, 90, "m2")
    qdq(node("Add", [m1, m2], "sum"), 0.08, 100, "yq", out="y")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, size, 8])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2, size, size])
    g = helper.make_graph(nodes, "qmm", [x], [out], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="texc-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


BUILDERS = {
    "cnn": (cnn, 16),
    "encoder": (models.encoder, 8),
    "resnet18": (models.resnet18, 32),
    "mobilenetv2": (models.mobilenetv2, 32),
    "qop": (qop, 6),
    "qmm": (qmm, 7),
}


# The weight operand of ONNX's integer products and its zero point's input.
INTEGER_PRODUCTS = {"MatMulInteger": (1, 3), "ConvInteger": (1, 3), "QLinearConv": (3, 5), "QLinearMatMul": (3, 5)}


def shift_to_u8(a):
    """i8 values as u8 ones 128 higher (w − z unchanged when both shift)."""
    return (a.astype(np.int16) + 128).astype(np.uint8)


def exact_integer_products(m):
    """`m` with every i8 weight of an integer product given as u8: w + 128
    with zero point z + 128, the same w − z. Why: on x86 without VNNI, ONNX
    Runtime's u8 × i8 kernels add byte products in pairs into 16 bits with
    saturation (`vpmaddubsw`), so its outputs there are not the model's
    (MEASURED on an AMD Zen 3: a dynamically quantized CNN off by 8 % normwise);
    its u8 × u8 kernels widen to 16 bits first and are exact on every CPU."""
    inits = {t.name: t for t in m.graph.initializer}
    replaced = set()
    for n in m.graph.node:
        if n.op_type not in INTEGER_PRODUCTS:
            continue
        wi, zi = INTEGER_PRODUCTS[n.op_type]
        w = inits.get(n.input[wi])
        if w is None or w.data_type != TensorProto.INT8:
            continue
        has_zero = len(n.input) > zi and n.input[zi]
        z = numpy_helper.to_array(inits[n.input[zi]]) if has_zero else np.zeros((), np.int8)
        wu, zu = f"{n.input[wi]}_as_u8", f"{n.input[wi]}_zero_point_as_u8"
        if wu not in inits:  # a weight two products share is shifted once
            for name, a in ((wu, numpy_helper.to_array(w)), (zu, z)):
                inits[name] = numpy_helper.from_array(shift_to_u8(a), name)
                m.graph.initializer.append(inits[name])
        replaced.update(n.input[i] for i in (wi, zi) if len(n.input) > i and n.input[i])
        ins = list(n.input) + [""] * max(0, zi + 1 - len(n.input))
        ins[wi], ins[zi] = wu, zu
        del n.input[:]
        n.input.extend(ins)
    # The i8 forms no node reads any more go, so ORT has nothing to warn about.
    read = {i for n in m.graph.node for i in n.input} | {o.name for o in m.graph.output}
    keep = [t for t in m.graph.initializer if t.name in read or t.name not in replaced]
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=sorted(BUILDERS))
    ap.add_argument("mode", choices=["static", "dynamic", "qoperator", "none"])
    ap.add_argument("out")
    ap.add_argument("--act", choices=["u8", "i8"], default="u8")
    ap.add_argument("--per-channel", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", type=int, help="the input's spatial size or sequence length (default: the builder's)")
    ap.add_argument("--opset", type=int, help="the f32 model's opset before quantizing (default: the builder's)")
    ap.add_argument("--reduce-range", action="store_true",
                    help="7-bit weights, as ONNX Runtime quantizes for CPUs without VNNI")
    a = ap.parse_args()
    build, size = BUILDERS[a.model]
    m = build(a.size or size, a.seed)
    if a.opset:
        m.opset_import[0].version = a.opset
        m.ir_version = 10 if a.opset >= 21 else 8
    os.makedirs(a.out, exist_ok=True)
    f32_path = os.path.join(a.out, f"{a.model}.f32.onnx")
    path = os.path.join(a.out, f"{a.model}.onnx")
    onnx.save(m, f32_path)
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(a.seed + 1)
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)

    class Calibration(CalibrationDataReader):
        def __init__(self):
            r = np.random.default_rng(a.seed + 2)
            self.batches = iter([{"x": r.normal(0.0, 1.0, shape).astype(np.float32)} for _ in range(16)])

        def get_next(self):
            return next(self.batches, None)

    act = QuantType.QUInt8 if a.act == "u8" else QuantType.QInt8
    if a.model in ("resnet18", "mobilenetv2"):
        # As ONNX Runtime recommends before quantizing: batch normalization
        # folded into the convolutions (otherwise every Conv feeds a
        # BatchNormalization, not a QuantizeLinear).
        from onnxruntime.quantization.shape_inference import quant_pre_process
        quant_pre_process(f32_path, f32_path)
    if a.mode in ("static", "qoperator"):
        fmt = QuantFormat.QDQ if a.mode == "static" else QuantFormat.QOperator
        quantize_static(f32_path, path, Calibration(), quant_format=fmt, per_channel=a.per_channel,
                        reduce_range=a.reduce_range, activation_type=act, weight_type=QuantType.QInt8)
    elif a.mode == "dynamic":
        quantize_dynamic(f32_path, path, per_channel=a.per_channel, weight_type=QuantType.QInt8)
    else:
        onnx.save(m, path)
    q = onnx.load(path)
    x = rng.normal(0.0, 1.0, shape).astype(np.float32)
    np.save(os.path.join(a.out, "x.npy"), x)
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    exact = exact_integer_products(onnx.load(path)).SerializeToString()
    sess = ort.InferenceSession(exact, so, providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": x})[0]
    np.save(os.path.join(a.out, "expected.npy"), y)
    step = 0.0
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    for n in q.graph.node:
        if n.op_type == "DequantizeLinear" and n.output[0] == q.graph.output[0].name:
            step = float(inits[n.input[1]])
    with open(os.path.join(a.out, "step.txt"), "w") as f:
        f.write(f"{step!r}\n")
    ops = sorted({n.op_type for n in q.graph.node})
    print(f"{path}: {len(q.graph.node)} nodes ({', '.join(ops)}), output {list(y.shape)}, step {step}")


if __name__ == "__main__":
    sys.exit(main())
