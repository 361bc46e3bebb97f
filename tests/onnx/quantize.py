#!/usr/bin/env python3
"""Models and data for `texc quantize`'s tests (texc/tests/quantize_cli.rs).

    python3 tests/onnx/quantize.py build MODEL OUT_DIR
        OUT_DIR/MODEL.onnx (random weights, opset 13), OUT_DIR/calib.npz
        (8 batches of the input stacked along a new first axis) and
        OUT_DIR/eval.npy (another batch). MODEL: cnn or mlp.
    python3 tests/onnx/quantize.py compare F32.onnx QDQ.onnx EVAL.npy
        Runs both models on ONNX Runtime and prints `relative_error E`
        (‖q − f‖₂ / ‖f‖₂ of the output) and `qdq_nodes N` (QuantizeLinear
        and DequantizeLinear nodes in the QDQ model)."""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def weight(rng, name, shape):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return numpy_helper.from_array(rng.normal(0, np.sqrt(2.0 / fan_in), shape).astype(np.float32), name)


def cnn(rng):
    inits = [
        weight(rng, "w1", [8, 3, 3, 3]),
        numpy_helper.from_array(rng.normal(0, 0.1, [8]).astype(np.float32), "b1"),
        weight(rng, "w2", [16, 8, 3, 3]),
        numpy_helper.from_array(rng.normal(0, 0.1, [16]).astype(np.float32), "b2"),
        weight(rng, "fc", [10, 16]),
        numpy_helper.from_array(np.zeros([10], np.float32), "fcb"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 9, 9])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])
    return helper.make_graph(nodes, "cnn", [x], [y], inits), [4, 3, 9, 9]


def mlp(rng):
    inits = [weight(rng, "w1", [20, 32]), weight(rng, "w2", [32, 7])]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
        helper.make_node("MatMul", ["t", "w2"], ["y"], name="mm2"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 20])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 7])
    return helper.make_graph(nodes, "mlp", [x], [y], inits), [5, 20]


def build(model, out):
    import os

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    graph, shape = {"cnn": cnn, "mlp": mlp}[model](rng)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, f"{out}/{model}.onnx")
    calib = rng.normal(0, 1, [8] + shape).astype(np.float32)
    np.savez(f"{out}/calib.npz", x=calib)
    np.save(f"{out}/eval.npy", rng.normal(0, 1, shape).astype(np.float32))


def compare(f32_path, qdq_path, eval_path):
    import onnxruntime as ort

    x = np.load(eval_path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    run = lambda p: ort.InferenceSession(p, opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    f, q = run(f32_path), run(qdq_path)
    onnx.checker.check_model(onnx.load(qdq_path))
    nodes = [n.op_type for n in onnx.load(qdq_path).graph.node]
    print(f"relative_error {np.linalg.norm(q - f) / np.linalg.norm(f):.6e}")
    print(f"qdq_nodes {sum(op in ('QuantizeLinear', 'DequantizeLinear') for op in nodes)}")


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3])
    else:
        compare(*sys.argv[2:5])
