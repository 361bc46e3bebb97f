"""texc for PyTorch modules.

>>> import torch, texc.torch
>>> m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval()
>>> x = torch.randn(4, 16)
>>> fast = texc.torch.compile(m, (x,))
>>> torch.allclose(fast(x), m(x), atol=1e-5)
True

``compile`` exports the module with ``torch.onnx.export`` (the TorchScript
exporter, ``dynamo=False``, or the dynamo-based one with ``dynamo=True``),
imports the ONNX model with texc (``texc.load_onnx``) and returns a
``torch.nn.Module`` that runs texc's code. The compiled module is
specialized to the example inputs' shapes and dtypes, as the ONNX model is;
its weights are a snapshot taken at compile time (compile again after
training). Tensors go in and out through DLPack without copies: CPU
tensors for a CPU target; CUDA tensors for a GPU target (``nvptx-sm80``,
``nvptx-sm90``, the default where the example inputs are on a GPU), whose
kernels are queued on PyTorch's current stream and return CUDA tensors.

PyTorch is not a dependency of the ``texc`` package: this module imports
it when ``compile`` is called.
"""

import functools
import os
import tempfile

from ._texc import TexcError, load_onnx

__all__ = ["compile"]


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised without torch only
        raise ImportError("texc.torch needs PyTorch: pip install torch") from e
    return torch


def _export(torch, module, inputs, path, dynamo, opset):
    """Export ``module`` to ``path``; a failure raises ``TexcError`` naming the module."""
    names = [f"input_{i}" for i in range(len(inputs))]
    try:
        with torch.no_grad():
            torch.onnx.export(
                module,
                tuple(inputs),
                path,
                input_names=names,
                opset_version=opset,
                dynamo=dynamo,
            )
    except Exception as e:  # torch raises many types; the message is what matters
        exporter = "dynamo" if dynamo else "TorchScript"
        raise TexcError(
            f"texc.torch.compile: torch.onnx.export ({exporter} exporter, opset {opset}) could not export "
            f"{type(module).__name__}: {type(e).__name__}: {e}"
        ) from e


@functools.lru_cache(maxsize=None)
def _module_class(torch):
    # Defined on first use, so that importing texc.torch does not import PyTorch.
    class CompiledModule(torch.nn.Module):
        """A module running texc's code for ``module`` at fixed input shapes."""

        def __init__(self, kernel, name):
            super().__init__()
            self.kernel = kernel
            self._name = name
            self._gpu = kernel.target.startswith("nvptx")

        def forward(self, *inputs):
            arrays = []
            where = "cuda" if self._gpu else "cpu"
            for i, t in enumerate(inputs):
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"input {i}: expected a torch.Tensor, got {type(t).__name__}")
                if t.device.type != where:
                    fix = "compile it with CUDA example inputs" if t.device.type == "cuda" else f"use .to('{where}')"
                    raise ValueError(
                        f"input {i}: a tensor on {t.device}; this module runs texc's code for "
                        f"{self.kernel.target} on {where} tensors ({fix})"
                    )
                # A CUDA tensor goes in as it is (texc copies a strided one).
                arrays.append(t.detach() if self._gpu else t.detach().contiguous())
            out = self.kernel(*arrays)
            if self._gpu:
                return out
            if isinstance(out, tuple):
                return tuple(torch.from_numpy(o) for o in out)
            return torch.from_numpy(out)

        def extra_repr(self):
            return f"{self._name} on {self.kernel.target}"

    return CompiledModule


def _gpu_target(torch, device):
    """The texc target for a CUDA device: its compute capability's."""
    major, minor = torch.cuda.get_device_capability(device)
    if major >= 9:
        return "nvptx-sm90"
    if major >= 8:
        return "nvptx-sm80"
    raise TexcError(f"texc.torch.compile: {torch.cuda.get_device_name(device)} is sm_{major}{minor}; texc's GPU "
                    "targets need sm_80 or newer")


def compile(module, example_inputs, target=None, dynamo=False, opset=None, knobs=None):
    """Compile ``module`` (a ``torch.nn.Module``, put in eval mode) for the
    shapes of ``example_inputs`` (a tensor or a tuple of tensors) and return
    a ``torch.nn.Module`` that runs texc's code for ``target``: by default
    ``host`` for CPU inputs, and for CUDA inputs the GPU target of their
    device (``nvptx-sm90`` on Hopper, ``nvptx-sm80`` on Ampere).

    ``dynamo``: export with the dynamo-based exporter (opset 18 by default)
    instead of the TorchScript one (opset 17). ``knobs``: as ``texc.compile``.
    Raises ``TexcError`` naming what could not be exported, or the ONNX node
    texc could not import.
    """
    torch = _torch()
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    if not all(isinstance(t, torch.Tensor) for t in example_inputs):
        raise TypeError("texc.torch.compile: example_inputs must be a tensor or a tuple of tensors")
    if target is None:
        cuda = [t.device for t in example_inputs if t.device.type == "cuda"]
        target = _gpu_target(torch, cuda[0]) if cuda else "host"
    opset = opset if opset is not None else (18 if dynamo else 17)
    module = module.eval()
    with tempfile.TemporaryDirectory(prefix="texc-torch-") as d:
        path = os.path.join(d, "model.onnx")
        _export(torch, module, example_inputs, path, dynamo, opset)
        kernel = load_onnx(path, target=target, knobs=knobs)
    return _module_class(torch)(kernel, type(module).__name__)
