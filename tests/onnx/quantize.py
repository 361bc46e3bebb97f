#!/usr/bin/env python3
"""Models and data for `texc quantize`'s tests (texc/tests/quantize_cli.rs).

    python3 tests/onnx/quantize.py build MODEL OUT_DIR
        OUT_DIR/MODEL.onnx (random weights, opset 13), OUT_DIR/calib.npz
        (8 batches of the input stacked along a new first axis) and
        OUT_DIR/eval.npy (another batch). MODEL: cnn, residual, mlp or mlp_const (w2 in
        a Constant node).
    python3 tests/onnx/quantize.py compare F32.onnx QDQ.onnx EVAL.npy
        Runs both models on ONNX Runtime, as written, and prints `relative_error E`
        (‖q − f‖₂ / ‖f‖₂ of the output) and `qdq_nodes N` (QuantizeLinear
        and DequantizeLinear nodes in the QDQ model).
    python3 tests/onnx/quantize.py digits OUT_DIR
        Trains a small CNN (Conv 3×3 → Relu → Conv 3×3 stride 2 → Relu →
        Gemm) on scikit-learn's 8×8 digits (shipped inside the package, no
        download) with NumPy: OUT_DIR/digits.onnx (batch 40),
        OUT_DIR/calib.npz (5 batches of training images) and OUT_DIR/test.npz
        (the held-out images, 9 batches, and their labels).
    python3 tests/onnx/quantize.py accuracy MODEL.onnx TEST.npz
        Prints `top1 A` (percent) of MODEL on ONNX Runtime, as written."""

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


def residual(rng):
    """A stem (convolution, max pooling) and a residual block: the next convolution's output is added to the pooled one."""
    inits = [
        weight(rng, "w0", [8, 3, 3, 3]),
        numpy_helper.from_array(rng.normal(0, 0.1, [8]).astype(np.float32), "b0"),
        weight(rng, "w1", [8, 8, 3, 3]),
        numpy_helper.from_array(rng.normal(0, 0.1, [8]).astype(np.float32), "b1"),
        weight(rng, "fc", [10, 8]),
        numpy_helper.from_array(rng.normal(0, 0.1, [10]).astype(np.float32), "fcb"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("MaxPool", ["r0"], ["m"], name="pool0", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["m", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c1", "m"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r1"], name="relu1"),
        helper.make_node("GlobalAveragePool", ["r1"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 9, 9])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])
    return helper.make_graph(nodes, "residual", [x], [y], inits), [4, 3, 9, 9]


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


def mlp_const(rng):
    """The MLP with its second weight in a Constant node, as some exporters write it."""
    graph, shape = mlp(rng)
    w2 = [t for t in graph.initializer if t.name == "w2"][0]
    graph.initializer.remove(w2)
    graph.node.insert(0, helper.make_node("Constant", [], ["w2"], name="w2_const", value=w2))
    return graph, shape


def build(model, out):
    import os

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    graph, shape = {"cnn": cnn, "residual": residual, "mlp": mlp, "mlp_const": mlp_const}[model](rng)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, f"{out}/{model}.onnx")
    calib = rng.normal(0, 1, [8] + shape).astype(np.float32)
    np.savez(f"{out}/calib.npz", x=calib)
    np.save(f"{out}/eval.npy", rng.normal(0, 1, shape).astype(np.float32))


def as_written(path):
    """An ONNX Runtime session (one thread) that runs the model at `path` as
    written: graph optimizations off, so a QDQ model dequantizes and
    multiplies in f32. ORT's optimizer fuses Q/DQ pairs into u8 × i8 integer
    kernels that on x86 without VNNI add byte products in pairs into 16 bits
    with saturation (`vpmaddubsw`), so the fused model's outputs there are
    not the model's (MEASURED on an AMD Zen 3: texc's exact products 1.0e-2
    normwise from ORT's on the CNN; the MLP's error against f32 5.9e-2, as
    written 1.1e-2)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def agree(qdq_path, eval_path, texc_out):
    """ONNX Runtime's output of the QDQ model (as written) against texc's (`texc run` wrote `texc_out`)."""
    x = np.load(eval_path)
    q = as_written(qdq_path).run(None, {"x": x})[0]
    t = np.load(texc_out)
    print(f"relative_error {np.linalg.norm(t - q) / np.linalg.norm(q):.6e}")


def compare(f32_path, qdq_path, eval_path):
    x = np.load(eval_path)
    run = lambda p: as_written(p).run(None, {"x": x})[0]  # noqa: E731
    f, q = run(f32_path), run(qdq_path)
    onnx.checker.check_model(onnx.load(qdq_path))
    nodes = [n.op_type for n in onnx.load(qdq_path).graph.node]
    print(f"relative_error {np.linalg.norm(q - f) / np.linalg.norm(f):.6e}")
    print(f"qdq_nodes {sum(op in ('QuantizeLinear', 'DequantizeLinear') for op in nodes)}")
    ints = [numpy_helper.to_array(t) for t in onnx.load(qdq_path).graph.initializer if t.data_type == TensorProto.INT8]
    print(f"widest_weight {max(int(np.abs(w.astype(np.int64)).max()) for w in ints)}")


def im2col(x, stride):
    """x [n, c, h, w] → patches [n, oh, ow, c*9] of 3×3 windows, padding 1."""
    n, c, h, w = x.shape
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    cols = np.empty((n, oh, ow, c, 3, 3), np.float32)
    for i in range(3):
        for j in range(3):
            cols[:, :, :, :, i, j] = p[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride].transpose(0, 2, 3, 1)
    return cols.reshape(n, oh, ow, c * 9)


def col2im(d, shape, stride):
    n, c, h, w = shape
    oh, ow = d.shape[1], d.shape[2]
    d = d.reshape(n, oh, ow, c, 3, 3)
    p = np.zeros((n, c, h + 2, w + 2), np.float32)
    for i in range(3):
        for j in range(3):
            p[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride] += d[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    return p[:, :, 1:-1, 1:-1]


def digits(out):
    import os

    from sklearn.datasets import load_digits

    os.makedirs(out, exist_ok=True)
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    x, y = x[order], y[order]
    xtr, ytr, xte, yte = x[:1400], y[:1400], x[1400:1760], y[1400:1760]
    params = {
        "w1": rng.normal(0, np.sqrt(2 / 9), (8, 1, 3, 3)).astype(np.float32),
        "b1": np.zeros(8, np.float32),
        "w2": rng.normal(0, np.sqrt(2 / 72), (16, 8, 3, 3)).astype(np.float32),
        "b2": np.zeros(16, np.float32),
        "fc": rng.normal(0, np.sqrt(2 / 256), (10, 256)).astype(np.float32),
        "fcb": np.zeros(10, np.float32),
    }
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(v) for k, v in params.items()}

    def forward(xb):
        c1 = im2col(xb, 1)
        a1 = c1 @ params["w1"].reshape(8, -1).T + params["b1"]
        r1 = np.maximum(a1, 0).transpose(0, 3, 1, 2)
        c2 = im2col(r1, 2)
        a2 = c2 @ params["w2"].reshape(16, -1).T + params["b2"]
        r2 = np.maximum(a2, 0).transpose(0, 3, 1, 2)
        f = r2.reshape(len(xb), -1)
        return f @ params["fc"].T + params["fcb"], (c1, a1, r1, c2, a2, f)

    # Adam, mini-batches of 50, 15 epochs.
    step = 0
    for epoch in range(15):
        perm = rng.permutation(len(xtr))
        for s in range(0, len(xtr), 50):
            xb, yb = xtr[perm[s : s + 50]], ytr[perm[s : s + 50]]
            logits, (c1, a1, r1, c2, a2, f) = forward(xb)
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            p[np.arange(len(yb)), yb] -= 1
            dl = p / len(yb)
            g = {"fc": dl.T @ f, "fcb": dl.sum(0)}
            dr2 = (dl @ params["fc"]).reshape(r1.shape[0], 16, 4, 4).transpose(0, 2, 3, 1) * (a2 > 0)
            g["w2"] = (dr2.reshape(-1, 16).T @ c2.reshape(-1, 72)).reshape(16, 8, 3, 3)
            g["b2"] = dr2.reshape(-1, 16).sum(0)
            dr1 = col2im(dr2 @ params["w2"].reshape(16, -1), r1.shape, 2).transpose(0, 2, 3, 1) * (a1 > 0)
            g["w1"] = (dr1.reshape(-1, 8).T @ c1.reshape(-1, 9)).reshape(8, 1, 3, 3)
            g["b1"] = dr1.reshape(-1, 8).sum(0)
            step += 1
            for k in params:
                m[k] = 0.9 * m[k] + 0.1 * g[k]
                v[k] = 0.999 * v[k] + 0.001 * g[k] ** 2
                mh, vh = m[k] / (1 - 0.9**step), v[k] / (1 - 0.999**step)
                params[k] -= (0.01 * mh / (np.sqrt(vh) + 1e-8)).astype(np.float32)
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Flatten", ["r2"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1),
    ]
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, 1, 8, 8])
    yo = helper.make_tensor_value_info("y", TensorProto.FLOAT, [40, 10])
    model = helper.make_model(
        helper.make_graph(nodes, "digits", [xi], [yo], inits), opset_imports=[helper.make_opsetid("", 13)]
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, f"{out}/digits.onnx")
    np.savez(f"{out}/calib.npz", x=xtr[:200].reshape(5, 40, 1, 8, 8))
    np.savez(f"{out}/test.npz", x=xte.reshape(9, 40, 1, 8, 8), labels=yte)


def accuracy(model_path, test_path):
    t = np.load(test_path)
    sess = as_written(model_path)
    pred = np.concatenate([sess.run(None, {"x": xb})[0].argmax(1) for xb in t["x"]])
    print(f"top1 {100.0 * (pred == t['labels']).mean():.4f}")


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "digits":
        digits(sys.argv[2])
    elif sys.argv[1] == "accuracy":
        accuracy(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "agree":
        agree(*sys.argv[2:5])
    else:
        compare(*sys.argv[2:5])
