"""texc from Python: compile ``.tex`` kernels (or ONNX models) and run them on NumPy arrays.

>>> import numpy as np, texc
>>> k = texc.compile('''
... kernel matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {
...     C[i, j] = sum[k](A[i, k] * B[k, j]);
... }''', shapes={"M": 3, "K": 5, "N": 2})
>>> A = np.ones((3, 5), np.float32); B = np.ones((5, 2), np.float32)
>>> k(A, B)
array([[5., 5.],
       [5., 5.],
       [5., 5.]], dtype=float32)

``compile`` runs texc's whole pipeline (parse, check, specialize to the
sizes given, rewrite, schedule, generate machine code) once; the ``Kernel``
it returns checks its arguments' dtypes and shapes, copies them in, runs
with the GIL released, and returns new arrays. ``Kernel.source(stage)``
prints any stage of the compilation and ``Kernel.bench()`` times it.
Problems in the source raise ``TexcError`` with texc's diagnostic
(``file:line:col``, the source line, the reason).

See docs/python.md in texc's repository for a walkthrough.
"""

import contextlib as _contextlib

from ._texc import _set_call_threads
from ._texc import (
    STAGES,
    Kernel,
    TexcError,
    __version__,
    compile,
    db,
    default_db,
    load_onnx,
    num_threads,
    set_num_threads,
    tune,
)


@_contextlib.contextmanager
def threads(n):
    """Run the kernels this Python thread calls inside the ``with`` block on
    ``n`` threads, whatever the process's count (``set_num_threads``): a
    thread count per call. Other Python threads keep theirs. ``ValueError``
    outside 1 to 1024.

    >>> with texc.threads(1):
    ...     y = k(x)
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1024:
        raise ValueError(f"threads({n!r}): expected 1 to 1024")
    previous = _set_call_threads(n)
    try:
        yield
    finally:
        _set_call_threads(previous)


__all__ = [
    "compile",
    "load_onnx",
    "Kernel",
    "TexcError",
    "tune",
    "db",
    "default_db",
    "set_num_threads",
    "num_threads",
    "threads",
    "STAGES",
    "__version__",
]
