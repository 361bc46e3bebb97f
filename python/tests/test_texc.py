"""texc's Python package: results against NumPy, every error path, memory
over many calls, and calls from several threads at once.

Run from the repository root: `python -m pytest python/tests` (after
`pip install ./python`, or `maturin develop`; scripts/test.sh does both).
"""

import importlib.util
import os
import pathlib
import threading

import numpy as np
import pytest

import texc
from texc import TexcError

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

MATMUL = """
kernel matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](A[i, k] * B[k, j]);
}
"""

rng = np.random.default_rng(7)


def rand(*shape, dtype=np.float32):
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


def close(got, want, tol=1e-5):
    """Relative error as texc's --check measures it: max |Δ| / max |exact|."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape
    scale = max(np.abs(want).max(), 1e-30)
    err = np.abs(got - want).max() / scale
    assert err <= tol, f"relative error {err:.3e} > {tol:.0e}"


# ---------------------------------------------------------------- results


@pytest.mark.parametrize("target", ["host", "cranelift", "interp"])
def test_matmul_odd_sizes(target):
    k = texc.compile(MATMUL, target=target, shapes={"M": 37, "K": 19, "N": 23})
    A, B = rand(37, 19), rand(19, 23)
    C = k(A, B)
    assert C.dtype == np.float32 and C.shape == (37, 23)
    close(C, A.astype(np.float64) @ B)


def test_matmul_example_file_with_its_schedule():
    # examples/matmul.tex has a schedule for x86-avx2; host may pick it.
    k = texc.compile(EXAMPLES / "matmul.tex", shapes={"M": 65, "K": 33, "N": 71})
    A, B = rand(65, 33), rand(33, 71)
    close(k(A, B), A.astype(np.float64) @ B)
    assert k.sizes == {"K": 33, "M": 65, "N": 71}
    assert k.params == [("A", "float32", [65, 33]), ("B", "float32", [33, 71])]
    assert k.outputs == [("C", "float32", [65, 71])]


def test_path_as_string_and_keyword_arguments():
    k = texc.compile(str(EXAMPLES / "matmul.tex"), shapes={"M": 3, "K": 5, "N": 7})
    A, B = rand(3, 5), rand(5, 7)
    close(k(B=B, A=A), A.astype(np.float64) @ B)
    close(k(A, B=B), A.astype(np.float64) @ B)


def test_elementwise_and_several_outputs():
    src = """
    kernel ew(X: f32[N, D], W: f32[N, D], b: f32 = 0.5) -> (Y: f32[N, D], Z: f32[N, D]) {
        Y[n, d] = X[n, d] * W[n, d] + b;
        Z[n, d] = max(X[n, d] - W[n, d], 0.0);
    }
    """
    k = texc.compile(src, shapes={"N": 13, "D": 29})
    X, W = rand(13, 29), rand(13, 29)
    Y, Z = k(X, W)
    close(Y, X.astype(np.float64) * W + 0.5)
    close(Z, np.maximum(X.astype(np.float64) - W, 0.0))
    Y2, _ = k(X, W, b=-2.0)
    close(Y2, X.astype(np.float64) * W - 2.0)


def test_gelu_example_non_contiguous_input():
    k = texc.compile(EXAMPLES / "gelu.tex", shapes={"N": 7, "D": 11})
    X = rand(11, 7).T  # a transposed view: any layout is accepted
    assert not X.flags.c_contiguous
    from math import erf, sqrt

    want = np.vectorize(lambda x: 0.5 * x * (1.0 + erf(x / sqrt(2.0))))(X.astype(np.float64))
    close(k(X), want)


def test_softmax_example():
    k = texc.compile(EXAMPLES / "softmax.tex", shapes={"N": 13, "D": 101})
    X = rand(13, 101) * 4
    e = np.exp(X.astype(np.float64) - X.max(axis=1, keepdims=True))
    close(k(X), e / e.sum(axis=1, keepdims=True))


def test_reduction_sum_over_rows():
    src = "kernel colsum(X: f32[N, D]) -> Y: f32[D] { Y[d] = sum[n](X[n, d]); }"
    k = texc.compile(src, shapes={"N": 101, "D": 17})
    X = rand(101, 17)
    close(k(X), X.astype(np.float64).sum(axis=0))


def test_std_nn_layer_norm_from_examples():
    # examples/norms.tex defines several kernels: `ln` calls std.nn's layer_norm.
    k = texc.compile(EXAMPLES / "norms.tex", kernel="ln", shapes={"N": 9, "D": 45})
    X, g, b = rand(9, 45), rand(45), rand(45)
    x = X.astype(np.float64)
    mu = x.mean(axis=1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    close(k(X, g, b), (x - mu) / np.sqrt(var + 1e-5) * g + b, tol=1e-4)


def test_std_nn_dense_call_in_source_text():
    src = """
    import std.nn;
    kernel layer(X: f32[N, K], W: f32[M, K], b: f32[M]) -> Y: f32[N, M] {
        Y = relu(dense(X, W, b));
    }
    """
    k = texc.compile(src, shapes={"N": 5, "K": 31, "M": 19})
    X, W, b = rand(5, 31), rand(19, 31), rand(19)
    close(k(X, W, b), np.maximum(X.astype(np.float64) @ W.T + b, 0.0))


def test_integer_and_double_kernels():
    k = texc.compile("kernel f(A: i32[N], B: i32[N]) -> C: i32[N] { C[n] = A[n] * B[n] + 3; }", shapes={"N": 9})
    A = np.arange(9, dtype=np.int32)
    assert (k(A, A) == A * A + 3).all()
    k = texc.compile("kernel g(A: f64[N]) -> C: f64[N] { C[n] = A[n] * 2.0; }", shapes={"N": 5})
    A = rand(5, dtype=np.float64)
    assert (k(A) == A * 2).all()


def test_integer_scalars_must_fit_their_type():
    k = texc.compile("kernel f(A: i32[N], s: i32) -> C: i32[N] { C[n] = A[n] + s; }", shapes={"N": 4})
    A = np.arange(4, dtype=np.int32)
    assert (k(A, 2**31 - 4) == A + (2**31 - 4)).all()
    for bad in [2**31, -(2**31) - 1, 1.5, float("nan")]:
        with pytest.raises(ValueError, match=r"argument `s`: .* is not a valid int32 value \(the integers"):
            k(A, bad)


def test_half_bool_and_narrow_integer_dtypes():
    k = texc.compile("kernel h(A: f16[N], B: f16[N]) -> C: f16[N] { C[n] = A[n] * B[n] + 1.0; }", shapes={"N": 37})
    a, b = rand(37, dtype=np.float16), rand(37, dtype=np.float16)
    c = k(a, b)
    assert c.dtype == np.float16
    close(c, a.astype(np.float64) * b + 1.0, tol=1e-3)
    # NumPy has no bfloat16: bf16 parameters take float32 (rounded), outputs come back as float32.
    k = texc.compile("kernel g(A: bf16[N]) -> C: bf16[N] { C[n] = bf16(f32(A[n]) * 2.0); }", shapes={"N": 5})
    assert k.params == [("A", "float32", [5])]
    assert (k(np.array([0, 1, 2, 3, 1 / 3], np.float32)) == [0, 2, 4, 6, 0.66796875]).all()
    k = texc.compile("kernel p(A: f32[N]) -> C: bool[N] { C[n] = A[n] > 0.0; }", shapes={"N": 4})
    assert k(np.array([-1, 2, -3, 4], np.float32)).tolist() == [False, True, False, True]
    k = texc.compile("kernel q(A: u8[N], s: i64 = 3) -> C: i64[N] { C[n] = i64(A[n]) * s; }", shapes={"N": 4})
    A = np.array([1, 2, 3, 250], np.uint8)
    assert k(A).tolist() == [3, 6, 9, 750] and k(A, s=-1).tolist() == [-1, -2, -3, -250]


def test_knobs_change_the_schedule_not_the_result():
    shapes = {"M": 40, "K": 24, "N": 56}
    plain = texc.compile(MATMUL, shapes=shapes)
    tuned = texc.compile(MATMUL, shapes=shapes, knobs={"rows": 2, "par": 0})
    assert plain.source("loops") != tuned.source("loops")
    A, B = rand(40, 24), rand(24, 56)
    close(tuned(A, B), A.astype(np.float64) @ B)


def test_interpreter_matches_compiled():
    shapes = {"N": 16, "D": 33}
    X = rand(16, 33)
    a = texc.compile(EXAMPLES / "softmax.tex", shapes=shapes)(X)
    b = texc.compile(EXAMPLES / "softmax.tex", shapes=shapes, target="interp")(X)
    close(a, b)


def test_onnx_model_keeps_its_weights(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    W, B = rand(8, 5), rand(5)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Add", ["h", "B"], ["a"]),
            helper.make_node("Relu", ["a"], ["y"]),
        ],
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "small.onnx"
    onnx.save(model, str(path))
    for target in ["host", "interp"]:
        k = texc.compile(path, target=target)
        assert [p[0] for p in k.params] == ["x"]  # the weights are inside
        x = rand(3, 8)
        close(k(x), np.maximum(x.astype(np.float64) @ W + B, 0.0))


def test_load_onnx_takes_onnx_names_and_symbolic_dims(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    W = rand(6, 4)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input.1", "W"], ["h"]), helper.make_node("Tanh", ["h"], ["out:0"])],
        "names",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("out:0", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(W, "W")],
    )
    path = tmp_path / "names.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    k = texc.load_onnx(path, dims={"batch": 5})
    names = dict(k.onnx_names)
    assert set(names) == {"input.1", "out:0"}
    x = rand(5, 6)
    want = np.tanh(x.astype(np.float64) @ W)
    close(k(**{"input.1": x}), want)  # the ONNX name
    close(k(**{names["input.1"]: x}), want)  # the kernel's name
    assert k.params[0][2] == [5, 6]
    with pytest.raises(TexcError, match="batch"):
        texc.load_onnx(path)  # the symbolic dimension needs a size
    with pytest.raises(ValueError, match="at least 1"):
        texc.load_onnx(path, dims={"batch": 0})
    with pytest.raises(ValueError, match="expected an .onnx file"):
        texc.load_onnx(EXAMPLES / "matmul.tex")


# ---------------------------------------------------------------- tuning

TUNABLE = """
kernel t(X: f32[N]) -> Y: f32[N] { Y[i] = X[i] * 2.0; }
schedule t for x86-avx2 { tune ti in [4, 8, 16]; split Y.i by ?ti -> (io, ii); }
"""


def test_tune_records_and_compile_uses_the_best(tmp_path):
    db = tmp_path / "tuning.jsonl"
    sizes = {"N": 4096}
    r = texc.tune(TUNABLE, target="x86-avx2", shapes=sizes, db=db, trials=3, repeat=3, warmup=1)
    assert r["kernel"] == "t" and len(r["trials"]) == 3
    times = [t["ms"] for t in r["trials"]]
    assert all(ms > 0 for ms in times) and r["best_ms"] == min(times)
    assert r["default_ms"] in times and str(r["db"]) == str(db)
    assert r["knobs"] is not None and set(r["knobs"]) == {"ti"}
    records = texc.db(db)
    assert len(records) >= 3 and {rec["kernel"] for rec in records} == {"t"}
    assert all(rec["target"] == "x86-avx2" and rec["time_ms"] > 0 for rec in records)
    k = texc.compile(TUNABLE, target="x86-avx2", shapes=sizes, db=db)
    assert k.knobs == r["knobs"]
    x = rand(4096)
    close(k(x), 2.0 * x.astype(np.float64))
    # A second search continues the first: what is measured is not measured again.
    again = texc.tune(TUNABLE, target="x86-avx2", shapes=sizes, db=db, trials=3, repeat=3, warmup=1)
    assert sum(t["from_db"] for t in again["trials"]) >= 3


def test_tune_errors(tmp_path):
    db = tmp_path / "tuning.jsonl"
    with pytest.raises(TexcError, match="unknown tensor `Z`"):
        texc.tune("kernel t(X: f32[N]) -> Y: f32[N] { Y[i] = Z[i]; }", shapes={"N": 8}, db=db)
    with pytest.raises(ValueError, match="trials=0"):
        texc.tune(TUNABLE, target="x86-avx2", shapes={"N": 64}, db=db, trials=0)
    with pytest.raises(ValueError, match="measures compiled code"):
        texc.tune(TUNABLE, target="interp", shapes={"N": 64}, db=db)
    with pytest.raises(ValueError, match="not both"):
        texc.compile(TUNABLE, target="x86-avx2", shapes={"N": 64}, knobs={"ti": 8}, db=db)
    assert texc.db(tmp_path / "missing.jsonl") == []
    assert str(texc.default_db()).endswith(".jsonl")


# ---------------------------------------------------------------- zero-copy


def test_arrays_in_c_order_are_not_copied():
    k = texc.compile(MATMUL, shapes={"M": 9, "K": 7, "N": 5})
    A, B = rand(9, 7), rand(7, 5)
    A0, B0 = A.copy(), B.copy()
    C1 = k(A, B)
    C2 = k(A, B)
    assert k.copies == 0
    assert C1 is not C2 and not np.shares_memory(C1, C2)
    C1[:] = 0  # outputs are the caller's own arrays
    close(C2, A.astype(np.float64) @ B)
    assert np.array_equal(A, A0) and np.array_equal(B, B0)  # inputs are only read


def test_arrays_not_in_the_kernels_layout_are_copied():
    k = texc.compile(MATMUL, shapes={"M": 9, "K": 7, "N": 5})
    A, B = rand(9, 7), rand(7, 5)
    want = A.astype(np.float64) @ B
    close(k(np.asfortranarray(A), B), want)
    assert k.copies == 1
    big = rand(9, 14)
    close(k(big[:, ::2], B), big[:, ::2].astype(np.float64) @ B)  # a strided view
    assert k.copies == 2
    raw = np.zeros(9 * 7 * 4 + 1, np.uint8)
    unaligned = np.frombuffer(raw.data, np.float32, count=63, offset=1).reshape(9, 7)
    assert unaligned.ctypes.data % 4 != 0
    unaligned[...] = A
    close(k(unaligned, B), want)
    assert k.copies == 3


class DLPackOnly:
    """A tensor that offers only the DLPack protocol (as a PyTorch CPU tensor does)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_dlpack_tensors_are_read_in_place():
    k = texc.compile(MATMUL, shapes={"M": 4, "K": 3, "N": 2})
    A, B = rand(4, 3), rand(3, 2)
    close(k(DLPackOnly(A), DLPackOnly(B)), A.astype(np.float64) @ B)
    assert k.copies == 0
    with pytest.raises(TypeError, match="expected dtype float32"):
        k(DLPackOnly(A.astype(np.float64)), B)


def test_pytorch_module_compiled(tmp_path):
    torch = pytest.importorskip("torch")
    import texc.torch

    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)
    )
    x = torch.randn(2, 3, 6, 6)
    fast = texc.torch.compile(m, (x,))
    y = fast(x)
    assert isinstance(y, torch.Tensor) and y.shape == (2, 10)
    close(y.numpy(), m(x).detach().numpy(), tol=1e-5)
    with pytest.raises(ValueError, match="shape"):
        fast(torch.randn(3, 3, 6, 6))  # compiled for batch 2
    if importlib.util.find_spec("onnxscript"):  # the dynamo-based exporter needs it
        close(texc.torch.compile(m, (x,), dynamo=True)(x).numpy(), m(x).detach().numpy(), tol=1e-5)

    class Unexportable(torch.nn.Module):
        def forward(self, x):
            return torch.fft.fft(x).real

    with pytest.raises(TexcError, match="Unexportable|fft|DFT"):
        texc.torch.compile(Unexportable(), (torch.randn(8),))


# ---------------------------------------------------------------- stages and timing


@pytest.mark.parametrize("target", ["nvptx-sm80", "nvptx-sm90"])
def test_gpu_kernels_in_the_emulation(target):
    k = texc.compile(MATMUL, target=target, shapes={"M": 33, "K": 17, "N": 9}, emulate_gpu=True)
    A, B = rand(33, 17), rand(17, 9)
    close(k(A, B), A.astype(np.float64) @ B)
    assert k.copies == 0  # the emulation is host code: it reads the arrays in place
    assert ".entry" in k.source("ptx")


def test_source_stages():
    k = texc.compile(MATMUL, shapes={"M": 8, "K": 8, "N": 8})
    for stage in ["ast", "tir", "graph", "egraph", "loops", "llvm", "asm"]:
        text = k.source(stage)
        assert isinstance(text, str) and text.strip(), stage
    assert "matmul" in k.source("tir")
    assert "define" in k.source("llvm")
    c = texc.compile(MATMUL, target="cranelift", shapes={"M": 8, "K": 8, "N": 8})
    for stage in ["clif", "asm"]:
        assert c.source(stage).strip()
    assert set(["ast", "tir", "loops", "llvm", "asm"]) <= set(texc.STAGES)


def test_bench():
    k = texc.compile(MATMUL, shapes={"M": 32, "K": 32, "N": 32})
    r = k.bench(repeat=20, warmup=2)
    for key in ["mean_ms", "median_ms", "min_ms", "max_ms", "std_dev_ms", "p90_ms", "p99_ms"]:
        assert r[key] >= 0.0, key
    assert r["min_ms"] <= r["median_ms"] <= r["max_ms"]
    assert r["runs"] == 20 and r["warmup"] == 2
    assert r["flops"] == 2 * 32 * 32 * 32
    r = k.bench(rand(32, 32), rand(32, 32), repeat=3)
    assert r["runs"] == 3


def test_save_writes_a_library_and_its_header(tmp_path):
    import ctypes

    k = texc.compile(MATMUL, shapes={"M": 5, "K": 7, "N": 9})
    lib = tmp_path / "mm.so"
    header = k.save(str(lib))
    assert header == str(tmp_path / "mm.h")
    text = pathlib.Path(header).read_text()
    assert "int texc_matmul_run(const float *A, const float *B, float *C);" in text
    assert "#define TEXC_MATMUL_C_SIZE 45" in text
    # Called from C (through ctypes), the library computes what the kernel does.
    a, b = rand(5, 7), rand(7, 9)
    c = np.zeros((5, 9), np.float32)
    ptr = ctypes.POINTER(ctypes.c_float)
    run = ctypes.CDLL(str(lib)).texc_matmul_run
    run.argtypes = [ptr, ptr, ptr]
    assert run(a.ctypes.data_as(ptr), b.ctypes.data_as(ptr), c.ctypes.data_as(ptr)) == 0
    close(c, a @ b)
    close(c, k(a, b))
    with pytest.raises(ValueError, match=r"\.o or \.so"):
        k.save(str(tmp_path / "mm.dll"))
    with pytest.raises(ValueError, match="compiled target"):
        texc.compile(MATMUL, target="interp", shapes={"M": 2, "K": 2, "N": 2}).save(str(lib))


# ---------------------------------------------------------------- errors


def test_wrong_dtype_names_the_parameter():
    k = texc.compile(MATMUL, shapes={"M": 4, "K": 3, "N": 2})
    with pytest.raises(TypeError, match=r"`B`.*float32.*float64"):
        k(rand(4, 3), rand(3, 2, dtype=np.float64))


def test_wrong_shape_names_the_parameter():
    k = texc.compile(MATMUL, shapes={"M": 4, "K": 3, "N": 2})
    with pytest.raises(ValueError, match=r"`A`.*\(4, 3\).*\(4, 4\)"):
        k(rand(4, 4), rand(3, 2))


def test_bad_arguments():
    k = texc.compile(MATMUL, shapes={"M": 4, "K": 3, "N": 2})
    with pytest.raises(TypeError, match="missing argument `B`"):
        k(rand(4, 3))
    with pytest.raises(TypeError, match="no parameter `Q`"):
        k(rand(4, 3), rand(3, 2), Q=1)
    with pytest.raises(TypeError, match="given twice"):
        k(rand(4, 3), rand(3, 2), A=rand(4, 3))
    with pytest.raises(TypeError, match="takes 2 arguments"):
        k(rand(4, 3), rand(3, 2), rand(1))
    with pytest.raises(TypeError, match=r"`A`.*numpy.ndarray.*list"):
        k([[1.0] * 3] * 4, rand(3, 2))
    s = texc.compile("kernel s(X: f32[N], n: i32) -> Y: f32[N] { Y[i] = X[i] * f32(n); }", shapes={"N": 3})
    with pytest.raises(ValueError, match="`n`"):
        s(rand(3), n=1.5)
    with pytest.raises(TypeError, match="`n`"):
        s(rand(3), n="two")


def test_bad_source_raises_texc_error_with_location():
    with pytest.raises(texc.TexcError) as e:
        texc.compile("kernel k(X: f32[N]) -> Y: f32[N] {\n    Y[n] = X[n] +;\n}\n", shapes={"N": 4})
    assert "<string>:2:" in str(e.value)
    assert "Y[n] = X[n] +;" in str(e.value)  # the source excerpt
    assert isinstance(e.value, Exception)


def test_bad_source_file_names_the_file(tmp_path):
    f = tmp_path / "bad.tex"
    f.write_text("kernel k(X: f32[N]) -> Y: f32[N] {\n    Y[n] = Z[n];\n}\n")
    with pytest.raises(texc.TexcError, match=r"bad\.tex:2:\d+"):
        texc.compile(f, shapes={"N": 4})


def test_missing_file():
    with pytest.raises(texc.TexcError, match="no_such_file.tex"):
        texc.compile("no_such_file.tex")


def test_unknown_knob():
    with pytest.raises(texc.TexcError, match="nonsense"):
        texc.compile(MATMUL, shapes={"M": 4, "K": 4, "N": 4}, knobs={"nonsense": 3})


def test_bad_pipeline_knob_value():
    with pytest.raises(ValueError, match="winograd"):
        texc.compile(MATMUL, shapes={"M": 4, "K": 4, "N": 4}, knobs={"winograd": 9})


def test_unknown_kernel_and_several_kernels():
    with pytest.raises(texc.TexcError, match="nope"):
        texc.compile(EXAMPLES / "norms.tex", kernel="nope")
    with pytest.raises(ValueError, match="several kernels.*kernel="):
        texc.compile(EXAMPLES / "norms.tex")


def test_bad_shapes():
    with pytest.raises(ValueError, match="negative"):
        texc.compile(MATMUL, shapes={"M": -1, "K": 4, "N": 4})
    with pytest.raises(texc.TexcError):
        texc.compile(MATMUL, shapes={"M": 4, "K": 4})  # N has no size
    with pytest.raises(texc.TexcError):
        texc.compile(MATMUL, shapes={"M": 4, "K": 4, "N": 4, "Q": 2})  # no such symbol


def test_misuse_is_value_error():
    with pytest.raises(ValueError, match="target"):
        texc.compile(MATMUL, target="z80", shapes={"M": 4, "K": 4, "N": 4})
    k = texc.compile(MATMUL, shapes={"M": 4, "K": 4, "N": 4})
    with pytest.raises(ValueError, match="stage"):
        k.source("nonsense")
    with pytest.raises(ValueError, match="ptx"):
        k.source("ptx")
    with pytest.raises(ValueError, match="interp"):
        texc.compile(MATMUL, target="interp", shapes={"M": 4, "K": 4, "N": 4}).bench()
    with pytest.raises(TypeError):
        texc.compile(42)


# ---------------------------------------------------------------- memory and threads


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_many_calls_do_not_grow_memory():
    k = texc.compile(MATMUL, shapes={"M": 64, "K": 64, "N": 64})
    A, B = rand(64, 64), rand(64, 64)
    for _ in range(200):  # warm up allocators and the thread pool
        k(A, B)
    before = rss_bytes()
    for _ in range(10_000):
        C = k(A, B)
    grown = rss_bytes() - before
    # Each call moves 48 KiB in and out: a leak of its buffers would be 470 MiB.
    assert grown < 4 * 1024 * 1024, f"RSS grew by {grown / 1e6:.1f} MB over 10 000 calls"
    close(C, A.astype(np.float64) @ B)


def test_thread_count_per_process():
    k = texc.compile(MATMUL, shapes={"M": 256, "K": 64, "N": 256})
    A, B = rand(256, 64), rand(64, 256)
    before = texc.num_threads()
    try:
        for n in [1, 3, 2]:
            texc.set_num_threads(n)
            assert texc.num_threads() == n
            close(k(A, B), A.astype(np.float64) @ B)
        for bad in [0, -1, 1025]:
            with pytest.raises(ValueError, match="thread count from 1 to 1024"):
                texc.set_num_threads(bad)
    finally:
        texc.set_num_threads(before)


def test_thread_count_per_call():
    texc.set_num_threads(2)
    k = texc.compile(MATMUL, shapes={"M": 67, "K": 33, "N": 45})
    A, B = rand(67, 33), rand(33, 45)
    want = A.astype(np.float64) @ B
    with texc.threads(1):
        assert texc.num_threads() == 1
        close(k(A, B), want)
        assert k.bench(A, B, repeat=2, warmup=0)["threads"] == 1
        seen = []
        other = threading.Thread(target=lambda: seen.append(texc.num_threads()))
        other.start()
        other.join()
        assert seen == [2]  # another Python thread keeps the process's count
        with texc.threads(3):
            assert texc.num_threads() == 3
            close(k(A, B), want)
        assert texc.num_threads() == 1
    assert texc.num_threads() == 2
    for bad in [0, -1, 1025, 2.5, True]:
        with pytest.raises(ValueError, match="expected 1 to 1024"):
            with texc.threads(bad):
                pass


def test_the_gil_is_released_while_a_kernel_runs():
    import time

    # The interpreter is slow enough for a call to take a while (~0.1-0.3 s).
    k = texc.compile(MATMUL, target="interp", shapes={"M": 512, "K": 512, "N": 512})
    A = rand(512, 512)
    ticks, done = [], threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    time.sleep(0.01)
    start = time.perf_counter()
    k(A, A)
    end = time.perf_counter()
    done.set()
    t.join()
    # Ticks strictly inside the call (with margins): none if the call held the GIL.
    inside = [x for x in ticks if start + 0.01 < x < end - 0.01]
    assert end - start > 0.05, "the call was too short to tell"
    assert len(inside) >= 5, f"{len(inside)} ticks while a {1e3 * (end - start):.0f} ms call ran"


def test_threads_at_once():
    k = texc.compile(MATMUL, shapes={"M": 48, "K": 40, "N": 56})
    soft = texc.compile(EXAMPLES / "softmax.tex", shapes={"N": 21, "D": 50})
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(40):
                A = r.uniform(-1, 1, (48, 40)).astype(np.float32)
                B = r.uniform(-1, 1, (40, 56)).astype(np.float32)
                close(k(A, B), A.astype(np.float64) @ B)
                X = r.uniform(-3, 3, (21, 50)).astype(np.float32)
                e = np.exp(X.astype(np.float64) - X.max(axis=1, keepdims=True))
                close(soft(X), e / e.sum(axis=1, keepdims=True))
        except Exception as ex:  # noqa: BLE001 (reported below)
            errors.append(ex)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
