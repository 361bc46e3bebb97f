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

from ._texc import STAGES, Kernel, TexcError, __version__, compile, load_onnx, num_threads, set_num_threads

__all__ = ["compile", "load_onnx", "Kernel", "TexcError", "STAGES", "__version__", "set_num_threads", "num_threads"]
