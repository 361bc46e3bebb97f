"""Type stubs of texc's native module (``texc._texc``), re-exported by ``texc``."""

import os
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

__version__: str

STAGES: List[str]
"""Every stage ``Kernel.source`` knows, in pipeline order: ``ast``, ``tir``,
``graph``, ``egraph``, ``loops``, then the backend's text (``llvm`` and
``asm`` on LLVM targets, ``clif`` and ``asm`` on ``cranelift``, ``llvm`` and
``ptx`` on GPU targets), ``mlir`` and ``mlir-linalg`` (only in a build with
the ``mlir`` feature). A stage the kernel's target does not print raises
``ValueError`` naming the targets that do."""

class TexcError(Exception):
    """A problem in what texc was given: the source (``str(e)`` has
    ``file:line:col``, the source line and the reason), an unknown kernel,
    sizes that do not fit, an unknown knob, an error while the interpreter
    runs. Misuse (an unknown target or stage, a negative size, a knob value
    out of range) raises ``ValueError`` instead."""

class Kernel:
    """A kernel compiled for one target at fixed sizes.

    Call it on NumPy arrays, positionally in parameter order or by name;
    scalar parameters take Python numbers and may be left out when they
    have a default. Each array must have the parameter's dtype (``TypeError``
    otherwise; a ``bf16`` parameter takes ``float32``) and exactly its shape
    (``ValueError`` otherwise); any memory layout is accepted (C-order
    arrays and DLPack tensors are read in place, others copied: see
    ``copies``). Returns a new array, or a tuple of arrays when the kernel has
    several outputs (``bf16`` outputs come back as ``float32``). The GIL is
    released while the kernel runs, so threads may call kernels at once.

    A kernel compiled for a GPU target (``nvptx-sm80``, ``nvptx-sm90``)
    also takes CUDA tensors (PyTorch's, or any DLPack tensor on ``cuda:0``),
    every tensor argument on the GPU: they are read where they are, the
    outputs are new PyTorch CUDA tensors (``bf16`` as ``torch.bfloat16``),
    and the launches are queued on PyTorch's current stream without waiting,
    as PyTorch's own operations are. Given NumPy arrays, it copies them to
    the device and back, and waits.
    """

    def __call__(self, *arrays: Any, **named: Any) -> Any:
        """NumPy arrays (or CPU DLPack tensors) in, NumPy arrays out; or, on
        a GPU target, CUDA tensors in and PyTorch CUDA tensors out."""
    def source(self, stage: str) -> str:
        """Stage ``stage`` of this kernel's compilation as text (see ``STAGES``):
        the same text as ``texc emit FILE --stage STAGE`` with this kernel's
        target, sizes and knobs. ``ValueError`` for a stage the target does not have."""
    def save(self, path: Union[str, "os.PathLike[str]"]) -> str:
        """Compile the kernel ahead of time into ``path`` (``.o`` or ``.so`` on
        a CPU target, ``.ptx`` or ``.cubin`` on a GPU target) with its C
        header beside it (``.h``, the entry ``texc_<kernel>_run``), as
        ``texc compile -o`` does; returns the header's path. ``ValueError``
        for another extension or the ``interp`` target."""
    def bench(self, *arrays: Union[np.ndarray, float, int], repeat: int = 100, warmup: int = 10, **named: Union[np.ndarray, float, int]) -> Dict[str, float]:
        """Time the kernel: ``warmup`` untimed calls, then ``repeat`` timed
        calls on the same buffers, on the arrays given or, with none, on
        seeded random inputs (as ``texc bench``). Returns ``mean_ms``,
        ``std_dev_ms``, ``min_ms``, ``median_ms``, ``p90_ms``, ``p99_ms``,
        ``max_ms``, ``runs``, ``warmup``, ``threads``, ``compile_s``,
        ``flops``, ``bytes``, ``gflops`` and ``gbs`` (rates at the median).
        ``ValueError`` on the ``interp`` target."""
    @property
    def name(self) -> str:
        """The kernel's name."""
    @property
    def target(self) -> str:
        """The target it was compiled for, as named to ``compile``."""
    @property
    def sizes(self) -> Dict[str, int]:
        """The sizes it was specialized to, by shape symbol and constant."""
    @property
    def params(self) -> List[Tuple[str, str, Optional[List[int]]]]:
        """The parameters a call takes, in order: ``(name, dtype, shape)``;
        ``shape`` is ``None`` for a scalar. An imported model's weights are
        not parameters: the kernel holds them."""
    @property
    def outputs(self) -> List[Tuple[str, str, List[int]]]:
        """The outputs a call returns, in order: ``(name, dtype, shape)``."""
    @property
    def compile_s(self) -> float:
        """Seconds ``compile`` spent, front end to machine code."""
    @property
    def knobs(self) -> Dict[str, int]:
        """The knobs it was compiled with: ``knobs=``, or the tuning
        database's best record's (``db=``); empty for the schedule's own."""
    @property
    def onnx_names(self) -> List[Tuple[str, str]]:
        """An imported model's inputs and outputs: ``(ONNX name, name in
        params/outputs)``. Calls accept either name as a keyword."""
    @property
    def copies(self) -> int:
        """Array arguments calls have copied so far. Compiled CPU kernels
        read C-order arrays of the parameter's dtype (and DLPack tensors)
        where they are; Fortran-order, strided or unaligned arrays, bf16
        parameters, ``interp`` and NumPy arrays given to a GPU kernel (not
        its emulation) copy. CUDA tensors are read where they are; a
        strided one is made contiguous first (a copy)."""

def compile(
    source_or_path: Union[str, "os.PathLike[str]"],
    kernel: Optional[str] = None,
    target: str = "host",
    shapes: Optional[Mapping[str, int]] = None,
    consts: Optional[Mapping[str, int]] = None,
    knobs: Optional[Mapping[str, int]] = None,
    db: Optional[Union[str, "os.PathLike[str]"]] = None,
    emulate_gpu: bool = False,
) -> Kernel:
    """Compile a kernel and return it, ready to call on NumPy arrays.

    ``source_or_path``: ``.tex`` source text, or the path of a ``.tex`` file
    or an ``.onnx`` model (an ``os.PathLike``, or a one-line string ending
    in ``.tex``/``.onnx`` or naming an existing file). ``kernel``: which
    kernel of a source that defines several. ``target``: ``host`` (this
    machine's widest x86 ISA), ``x86-avx2``, ``x86-avx512``, ``cranelift``,
    ``interp`` (the reference interpreter) or a GPU target where a GPU is
    present. ``shapes`` and ``consts``: sizes by name (``--shape``,
    ``--const``); sizes with defaults in the source may be left out.
    ``knobs``: schedule knobs (``--knob``): a schedule's tunables, or the
    default schedule's (``rows``, ``kslice``, ``cols``, ``pack``, ``par``,
    ``vec``, ``gather``) and the pipeline's (``rewrite``, ``winograd``,
    ``im2col``). ``db``: a tuning database (``tune`` fills it) whose best
    record for this kernel, target and machine sets the knobs
    (``Kernel.knobs`` shows them); without it no database is consulted.
    ``emulate_gpu``: a GPU target's kernels run on this CPU, each launch's
    blocks on the thread pool (as ``texc run --emulate-gpu``): GPU code
    checked without a GPU. Without it a GPU target needs a GPU.

    Raises ``TexcError`` for problems in the source, sizes or knobs, and
    ``ValueError`` for misuse (unknown target, several kernels and no
    ``kernel=``).
    """

def load_onnx(
    path: Union[str, "os.PathLike[str]"],
    target: str = "host",
    dims: Optional[Mapping[str, int]] = None,
    knobs: Optional[Mapping[str, int]] = None,
    emulate_gpu: bool = False,
) -> Kernel:
    """Import an ONNX model and compile it for ``target``. The kernel's
    parameters are the model's inputs (keywords may use their ONNX names,
    ``k(**{"input.1": x})``), its outputs the model's; the weights stay
    inside it. ``dims``: sizes of symbolic dimensions (``{"batch": 8}``).

    Raises ``TexcError`` naming the ONNX node texc cannot import, and
    ``ValueError`` for a path that is not ``.onnx`` or a size below 1.
    """

def tune(
    source_or_path: Union[str, "os.PathLike[str]"],
    kernel: Optional[str] = None,
    target: str = "host",
    shapes: Optional[Mapping[str, int]] = None,
    consts: Optional[Mapping[str, int]] = None,
    db: Optional[Union[str, "os.PathLike[str]"]] = None,
    trials: int = 32,
    time_budget: float = 60.0,
    seed: int = 0,
    repeat: int = 20,
    warmup: int = 3,
    verbose: bool = False,
) -> Dict[str, Any]:
    """Search the knob values of a kernel's schedule (its ``?t`` factors and
    ``tune`` lists, or the default schedule's knobs), as ``texc tune`` does,
    measuring each candidate in this process on random inputs, and record
    every measurement in ``db`` (default: ``default_db()``). A second search
    continues the first. Returns ``kernel``, ``sizes``, ``trials`` (dicts of
    ``knobs`` and ``ms`` or ``error``, and ``from_db``), ``default_ms``,
    ``best_ms``, ``knobs`` (the best, now in force for ``compile(db=...)``),
    ``seconds`` and ``db``. ``verbose`` prints a line per trial on stderr.

    Raises ``TexcError`` for problems in the source and ``ValueError`` for
    misuse (the ``interp`` target, counts out of range).
    """

def db(path: Optional[Union[str, "os.PathLike[str]"]] = None) -> List[Dict[str, Any]]:
    """The records of a tuning database (default: ``default_db()``): dicts of
    ``kernel``, ``target``, ``machine``, ``kernel_hash``, ``knobs``,
    ``time_ms``, ``texc_version`` and ``unix_time``. A missing file has none."""

def default_db() -> "os.PathLike[str]":
    """The database ``tune`` and ``db`` use when given none:
    ``TEXC_TUNING_DB``, else ``$XDG_CACHE_HOME/texc/tuning.jsonl``, else
    ``~/.cache/texc/tuning.jsonl``."""

def _set_call_threads(n: int) -> int: ...

def set_num_threads(n: int) -> None:
    """Run parallel loops on ``n`` threads from now on, in every kernel of
    this process (as ``TEXC_NUM_THREADS`` does at start-up); ``ValueError``
    outside 1 to 1024. More threads than cores share them."""

def num_threads() -> int:
    """The threads parallel loops run on."""
