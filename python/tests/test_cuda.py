"""GPU kernels from Python on CUDA tensors (DLPack): results against
PyTorch on the GPU, no copies, PyTorch's stream order, weights kept on the
device, device memory over many calls, and every error path.

The tests that need a GPU skip with the reason where PyTorch sees none or
texc's CUDA driver finds none (CI); the errors a CPU can show run everywhere.
"""

import threading

import numpy as np
import pytest

import texc

EW = """
kernel axpy(X: f32[M, N], Z: f32[M, N], a: f32) -> Y: f32[M, N] {
    Y[i, j] = a * X[i, j] + Z[i, j];
}
"""

GEMM_F16 = """
kernel gemm_f16(A: f16[M, K], B: f16[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]));
}
"""

TWO = """
kernel two(X: bf16[N]) -> (Y: bf16[N], S: f32[]) {
    Y[i] = bf16(f32(X[i]) * 2.0);
    S[] = sum[i](f32(X[i]));
}
"""

SOFTMAX = """
kernel softmax(X: f32[R, D]) -> Y: f32[R, D] {
    m[r] = max[d](X[r, d]);
    e[r, d] = exp(X[r, d] - m[r]);
    s[r] = sum[d](e[r, d]);
    Y[r, d] = e[r, d] / s[r];
}
"""


class FakeCuda:
    """Says it is on cuda:0 (`__dlpack_device__`), has no memory: for the
    errors raised before any memory is read."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("texc read a fake CUDA tensor's memory")


def test_a_cuda_tensor_given_to_a_cpu_kernel_is_refused():
    k = texc.compile(EW, shapes={"M": 3, "N": 4})
    x = np.ones((3, 4), np.float32)
    with pytest.raises(TypeError, match=r"argument `X` is a tensor on a GPU \(cuda:0\).*target `host`.*nvptx"):
        k(FakeCuda(), x, 1.0)
    with pytest.raises(TypeError, match=r"argument `Z` is a tensor on a GPU"):
        k(x, FakeCuda(), 1.0)


def test_a_cuda_tensor_given_to_the_emulation_is_refused():
    k = texc.compile(EW, target="nvptx-sm80", shapes={"M": 3, "N": 4}, emulate_gpu=True)
    with pytest.raises(TypeError, match="CPU emulation"):
        k(FakeCuda(), FakeCuda(), 1.0)


# ---------------------------------------------------------------- on a GPU


def _gpu():
    """(torch, texc target) where PyTorch and texc both see a GPU, else skip."""
    try:
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    major, _ = torch.cuda.get_device_capability(0)
    if major < 8:
        pytest.skip(f"{torch.cuda.get_device_name(0)} is older than sm_80")
    target = "nvptx-sm90" if major >= 9 else "nvptx-sm80"
    return torch, target


@pytest.fixture
def gpu():
    return _gpu()


def relative_error(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    return ((got - want).abs().max() / want.abs().max().clamp(min=1e-30)).item()


def test_elementwise_on_cuda_tensors(gpu):
    torch, target = gpu
    k = texc.compile(EW, target=target, shapes={"M": 37, "N": 129})
    X = torch.randn(37, 129, device="cuda")
    Z = torch.randn(37, 129, device="cuda")
    Y = k(X, Z, 0.5)
    assert isinstance(Y, torch.Tensor) and Y.device.type == "cuda"
    assert Y.dtype == torch.float32 and Y.shape == (37, 129)
    assert relative_error(Y, 0.5 * X + Z) <= 1e-6
    assert k.copies == 0
    # Keywords, and a second call into fresh outputs.
    Y2 = k(Z=Z, X=X, a=-2.0)
    assert Y2.data_ptr() != Y.data_ptr()
    assert relative_error(Y2, -2.0 * X + Z) <= 1e-6


@pytest.mark.parametrize("sizes, tensor_cores", [((256, 128, 192), True), ((128, 64, 64), True), ((100, 40, 72), False)])
def test_f16_products(gpu, sizes, tensor_cores):
    torch, target = gpu
    M, K, N = sizes
    k = texc.compile(GEMM_F16, target=target, shapes={"M": M, "K": K, "N": N})
    # The default GPU schedule puts products its tiles divide on tensor cores.
    assert ("mma" in k.source("ptx")) == tensor_cores
    A = torch.randn(M, K, device="cuda").half()
    B = torch.randn(K, N, device="cuda").half()
    C = k(A, B)
    assert C.dtype == torch.float32 and C.device.type == "cuda"
    assert relative_error(C, A.float() @ B.float()) <= 1e-5
    assert k.copies == 0


def test_bf16_in_and_out_and_several_outputs(gpu):
    torch, target = gpu
    k = texc.compile(TWO, target=target, shapes={"N": 1000})
    X = torch.randn(1000, device="cuda").bfloat16()
    Y, S = k(X)
    assert Y.dtype == torch.bfloat16 and S.dtype == torch.float32 and S.shape == ()
    assert torch.equal(Y, X * 2)  # exact in bf16
    assert relative_error(S, X.float().sum()) <= 1e-5


def test_temporaries_and_rows(gpu):
    torch, target = gpu
    k = texc.compile(SOFTMAX, target=target, shapes={"R": 300, "D": 1000})
    X = torch.randn(300, 1000, device="cuda") * 4
    assert relative_error(k(X), torch.softmax(X, dim=1)) <= 1e-5


@pytest.mark.parametrize("source, shapes", [(GEMM_F16, {"M": 256, "K": 128, "N": 192}), (SOFTMAX, {"R": 300, "D": 1000}),
                                            (TWO, {"N": 1000}), (EW, {"M": 37, "N": 129})])
def test_outputs_are_written_whole_over_stale_memory(gpu, source, shapes):
    # Outputs only stored are not zeroed before a call: each lands in memory
    # that PyTorch's allocator just freed, full of NaN, and must not show it.
    torch, target = gpu
    k = texc.compile(source, target=target, shapes=shapes)
    args = []
    for name, dtype, shape in k.params:
        if shape is None:
            args.append(1.5)
        elif dtype == "float16":
            args.append(torch.randn(*shape, device="cuda").half())
        else:
            args.append(torch.randn(*shape, device="cuda").to(getattr(torch, "bfloat16" if "bf16" in source else dtype)))
    want = k(*args)
    want = want if isinstance(want, tuple) else (want,)
    torch.cuda.synchronize()
    for _ in range(3):
        junk = [torch.full(w.shape, float("nan"), device="cuda").to(w.dtype) for w in want]
        del junk
        got = k(*args)
        got = got if isinstance(got, tuple) else (got,)
        for g, w in zip(got, want):
            assert torch.equal(g, w)


def test_strided_tensors_are_made_contiguous(gpu):
    torch, target = gpu
    k = texc.compile(EW, target=target, shapes={"M": 40, "N": 24})
    X = torch.randn(24, 40, device="cuda").t()  # a transposed view
    Z = torch.randn(40, 24, device="cuda")
    assert not X.is_contiguous()
    assert relative_error(k(X, Z, 3.0), 3.0 * X + Z) <= 1e-6
    assert k.copies == 1


def test_views_at_an_offset_are_copied(gpu):
    # Device code reads buffers that start on 16 bytes: a view 4 bytes in is copied.
    torch, target = gpu
    k = texc.compile(EW, target=target, shapes={"M": 37, "N": 129})
    X = torch.randn(37 * 129 + 1, device="cuda")[1:].view(37, 129)
    Z = torch.randn(37, 129, device="cuda")
    assert X.is_contiguous() and X.data_ptr() % 16 == 4
    assert relative_error(k(X, Z, 2.0), 2.0 * X + Z) <= 1e-6
    assert k.copies == 1


def test_tensors_that_require_grad_are_named(gpu):
    torch, target = gpu
    k = texc.compile(EW, target=target, shapes={"M": 3, "N": 4})
    X = torch.ones(3, 4, device="cuda", requires_grad=True)
    with pytest.raises(TypeError, match=r"argument `X`: .*requires grad: pass x.detach\(\)"):
        k(X, X.detach(), 1.0)
    assert torch.equal(k(X.detach(), X.detach(), 1.0), 2 * X.detach())


def test_tensors_on_another_gpu_are_refused(gpu):
    torch, target = gpu
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU")
    k = texc.compile(EW, target=target, shapes={"M": 3, "N": 4})
    with pytest.raises(ValueError, match="argument `Z` is on cuda:1, but `X` is on cuda:0"):
        k(torch.ones(3, 4, device="cuda:0"), torch.ones(3, 4, device="cuda:1"), 1.0)


def test_ordered_on_pytorchs_current_stream(gpu):
    torch, target = gpu
    n = 4096
    k = texc.compile(EW, target=target, shapes={"M": n, "N": n})
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        # Long work queued on the side stream just before the kernel: were the
        # kernel not on that stream, it would read X and Z before they are made.
        X = torch.ones(n, n, device="cuda")
        for _ in range(20):
            X = X @ torch.eye(n, device="cuda") + 1
        Z = X * 2
        Y = k(X, Z, 1.0)
        W = Y + 1  # and PyTorch's next operation reads what the kernel wrote
    side.synchronize()
    assert torch.equal(Y, torch.full((n, n), 63.0, device="cuda"))
    assert torch.equal(W, torch.full((n, n), 64.0, device="cuda"))


def test_calls_do_not_wait_for_the_gpu(gpu):
    torch, target = gpu
    import time

    k = texc.compile(GEMM_F16, target=target, shapes={"M": 4096, "K": 4096, "N": 4096})
    A = torch.randn(4096, 4096, device="cuda").half()
    B = torch.randn(4096, 4096, device="cuda").half()
    k(A, B)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        C = k(A, B)
    queued = time.perf_counter() - t0
    torch.cuda.synchronize()
    done = time.perf_counter() - t0
    # 20 products of 137 GFLOP each take several ms on any GPU texc targets;
    # queueing them takes far less, as for PyTorch's own operations.
    assert queued < 0.5 * done, (queued, done)
    assert relative_error(C[:64, :64], A[:64].float() @ B[:, :64].float()) <= 1e-5


def test_errors_on_cuda_tensors(gpu):
    torch, target = gpu
    k = texc.compile(EW, target=target, shapes={"M": 3, "N": 4})
    X = torch.ones(3, 4, device="cuda")
    with pytest.raises(TypeError, match=r"argument `Z`: expected a CUDA tensor of float32.*`X` is on the GPU"):
        k(X, np.ones((3, 4), np.float32), 1.0)
    with pytest.raises(TypeError, match=r"argument `Z`: expected a CUDA tensor"):
        k(X, torch.ones(3, 4), 1.0)  # a CPU tensor
    with pytest.raises(TypeError, match="argument `Z`: expected dtype float32, got float16"):
        k(X, X.half(), 1.0)
    with pytest.raises(ValueError, match=r"argument `Z`: expected shape \(3, 4\), got \(4, 3\)"):
        k(X, torch.ones(4, 3, device="cuda"), 1.0)
    with pytest.raises(TypeError, match="argument `a`: expected a number"):
        k(X, X, "one")
    cpu = texc.compile(EW, shapes={"M": 3, "N": 4})
    with pytest.raises(TypeError, match="tensor on a GPU.*nvptx"):
        cpu(X, X, 1.0)


def test_numpy_arrays_still_copy_to_the_device_and_back(gpu):
    torch, target = gpu
    k = texc.compile(EW, target=target, shapes={"M": 5, "N": 7})
    X = np.arange(35, dtype=np.float32).reshape(5, 7)
    Y = k(X, X, 2.0)
    assert isinstance(Y, np.ndarray) and np.array_equal(Y, 3 * X)


def test_many_calls_free_their_device_memory(gpu):
    torch, target = gpu
    k = texc.compile(SOFTMAX, target=target, shapes={"R": 64, "D": 4096})
    X = torch.randn(64, 4096, device="cuda")
    for _ in range(20):
        k(X)
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info()
    allocated = torch.cuda.memory_allocated()
    for _ in range(2000):
        Y = k(X)
    del Y
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info()
    assert torch.cuda.memory_allocated() == allocated
    # 2000 calls with 1 MiB of outputs and temporaries each: nothing kept.
    assert free_before - free_after < 64 << 20, (free_before, free_after)


def test_threads_call_at_once(gpu):
    torch, target = gpu
    k = texc.compile(EW, target=target, shapes={"M": 256, "N": 256})
    errors = []

    def work(seed):
        try:
            g = torch.Generator(device="cuda").manual_seed(seed)
            for _ in range(50):
                X = torch.randn(256, 256, device="cuda", generator=g)
                Y = k(X, X, float(seed))
                assert relative_error(Y, (seed + 1.0) * X) <= 1e-6
        except Exception as e:  # reported below, with the thread's seed
            errors.append((seed, e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_pytorch_module_on_the_gpu(gpu):
    torch, target = gpu
    import texc.torch

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)).cuda()
    x = torch.randn(16, 64, device="cuda")
    fast = texc.torch.compile(m, (x,))
    assert fast.kernel.target == target  # the GPU target of the inputs' device
    y = fast(x)
    assert y.device.type == "cuda" and y.shape == (16, 32)
    assert relative_error(y, m(x).detach()) <= 1e-5
    # The weights were copied to the device once: later calls read them there.
    y2 = fast(x + 1)
    assert relative_error(y2, m(x + 1).detach()) <= 1e-5
    with pytest.raises(ValueError, match="on cpu tensors|on cuda tensors"):
        fast(x.cpu())
    with pytest.raises(ValueError, match="nvptx-sm70"):
        texc.torch.compile(m, (x,), target="nvptx-sm70")
