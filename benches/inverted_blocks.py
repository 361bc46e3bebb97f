"""Inverted residual blocks as one ONNX model, for `texc bench` A/B runs.

Usage: ~/peers/bin/python benches/inverted_blocks.py C E HW DIR ACT [BLOCKS]
writes DIR/model.onnx and DIR/inputs.npz: BLOCKS (default 1) blocks of a
1 x 1 expansion C -> E with ACT (relu or silu), a 3 x 3 depthwise
convolution with ACT, a 1 x 1 projection E -> C and the residual add, on a
1 x C x HW x HW input. Then, e.g.:
    texc bench DIR/model.onnx --input DIR/inputs.npz --target host --threads 1 --repeat 50
(docs/onnx.md, "Copies stored by their producers").
"""
import sys, os, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
c, e, hw, d, act = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
nb = int(sys.argv[6]) if len(sys.argv) > 6 else 1
os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(0)
inits, nodes = [], []
def w(name, shape, fan):
    inits.append(nh.from_array((rng.standard_normal(shape) / np.sqrt(fan)).astype(np.float32), name)); return name
def b(name, n):
    inits.append(nh.from_array((rng.standard_normal(n) * 0.01).astype(np.float32), name)); return name
def activate(x, y):
    if act == "relu": nodes.append(h.make_node("Relu", [x], [y]))
    else:
        nodes.append(h.make_node("Sigmoid", [x], [y + "_s"])); nodes.append(h.make_node("Mul", [x, y + "_s"], [y]))
x = "x"
for i in range(nb):
    nodes.append(h.make_node("Conv", [x, w(f"we{i}", (e, c, 1, 1), c), b(f"be{i}", e)], [f"t{i}"]))
    activate(f"t{i}", f"a{i}")
    nodes.append(h.make_node("Conv", [f"a{i}", w(f"wd{i}", (e, 1, 3, 3), 9), b(f"bd{i}", e)], [f"dd{i}"], pads=[1] * 4, group=e))
    activate(f"dd{i}", f"g{i}")
    nodes.append(h.make_node("Conv", [f"g{i}", w(f"wp{i}", (c, e, 1, 1), e), b(f"bp{i}", c)], [f"p{i}"]))
    nodes.append(h.make_node("Add", [f"p{i}", x], [f"y{i}"])); x = f"y{i}"
gr = h.make_graph(nodes, "ir", [h.make_tensor_value_info("x", T.FLOAT, [1, c, hw, hw])], [h.make_tensor_value_info(x, T.FLOAT, [1, c, hw, hw])], inits)
onnx.save(h.make_model(gr, opset_imports=[h.make_opsetid("", 17)]), f"{d}/model.onnx")
np.savez(f"{d}/inputs.npz", x=rng.standard_normal((1, c, hw, hw)).astype(np.float32))
