#!/usr/bin/env python3
"""PyTorch-exported models for CI, which has no PyTorch: the graphs as the
exporters wrote them, without their weights.

`benches/zoo.py --keep DIR` exports the zoo's hand-written models (a
BERT-style encoder, a GPT-2-style decoder, a ViT, SDPA, LSTM, GRU, a UNet)
with both exporters (TorchScript at opset 17, dynamo at opset 18). `strip`
keeps each graph, its inputs and its small initializers (shapes, indices,
masks, anything not f32 or of at most 16 elements) as they are, and
replaces every larger f32 initializer by its shape and the mean, standard
deviation, minimum and maximum of its values (in the initializer's
`doc_string`), so the files are small. `materialize` draws such weights
again (normal with that mean and deviation, clipped to that range, so a
variance stays positive), writes the model, and runs ONNX Runtime on the
stored inputs: the reference texc is compared with (texc/tests/zoo_cli.rs).

Usage:
  ~/peers/bin/python benches/zoo.py --models bert,gpt2,vit_small,sdpa,lstm,gru,unet \\
      --exporters ts,dynamo --import-only --keep /tmp/zoo
  python3 tests/onnx/zoo_graphs.py strip /tmp/zoo tests/onnx/zoo
  python3 tests/onnx/zoo_graphs.py materialize tests/onnx/zoo/gpt2-ts.onnx OUT
      (writes OUT/model.onnx, OUT/inputs.npz and OUT/ort.npz)
"""
import json
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

MARK = "texc-zoo-stripped "
KEEP_ELEMENTS = 16


def strip(src, out):
    os.makedirs(out, exist_ok=True)
    for name in sorted(os.listdir(src)):
        d = os.path.join(src, name)
        path = os.path.join(d, "model.onnx")
        if not os.path.exists(path):
            continue
        m = onnx.load(path)
        stripped = 0
        for t in m.graph.initializer:
            if t.data_type != TensorProto.FLOAT or int(np.prod(t.dims)) <= KEEP_ELEMENTS:
                continue
            a = numpy_helper.to_array(t).astype(np.float64)
            stats = {"mean": a.mean(), "std": a.std(), "min": a.min(), "max": a.max()}
            dims, tname = list(t.dims), t.name
            t.Clear()
            t.name, t.data_type = tname, TensorProto.FLOAT
            t.dims.extend(dims)
            t.doc_string = MARK + json.dumps({k: float(v) for k, v in stats.items()})
            stripped += 1
        onnx.save(m, os.path.join(out, f"{name}.onnx"))
        shutil.copy(os.path.join(d, "inputs.npz"), os.path.join(out, f"{name}.npz"))
        print(f"{name}: {len(m.graph.node)} nodes, {stripped} initializers stripped")


def materialize(path, out, seed=0):
    os.makedirs(out, exist_ok=True)
    m = onnx.load(path)
    rng = np.random.default_rng(seed)
    for t in m.graph.initializer:
        if not t.doc_string.startswith(MARK):
            continue
        s = json.loads(t.doc_string[len(MARK):])
        a = rng.normal(s["mean"], s["std"], list(t.dims)).clip(s["min"], s["max"]).astype(np.float32)
        t.CopyFrom(numpy_helper.from_array(a, t.name))
    model = os.path.join(out, "model.onnx")
    onnx.save(m, model)
    inputs = os.path.join(out, "inputs.npz")
    shutil.copy(path[: -len(".onnx")] + ".npz", inputs)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    ys = sess.run(None, dict(np.load(inputs)))
    np.savez(os.path.join(out, "ort.npz"), **{o.name: y for o, y in zip(sess.get_outputs(), ys)})
    print(f"{model}: {len(m.graph.node)} nodes, outputs {[o.name for o in sess.get_outputs()]}")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "strip":
        strip(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "materialize":
        materialize(sys.argv[2], sys.argv[3])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
