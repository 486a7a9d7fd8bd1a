"""Pinning numpy's BLAS to one thread before the engine runs.

The engine's matrices are small and the split reader's lanes need the other core: on this
2-core VM, with OpenBLAS running 2 threads that spin while waiting, the same forward pass ran
8x slower than with one. So `run` pins BLAS first, in its own process (the harness starts a
fresh one per arm). Environment variables (OPENBLAS_NUM_THREADS ...) would have to be set
before numpy is imported; the library's own call works at any time.
"""

from __future__ import annotations

import ctypes
import glob
import os

# The wheels' bundled OpenBLAS (scipy-openblas, 64-bit ints or not) and a system OpenBLAS.
_SET_THREADS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads_64_", "openblas_set_num_threads")


def pin_blas_threads(n: int = 1) -> bool:
    """Pin numpy's OpenBLAS to n threads (best effort); True if applied."""
    import numpy as np

    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "libscipy_openblas*.so*"))
    for lib in libs:
        try:
            so = ctypes.CDLL(lib)
        except OSError:
            continue
        for sym in _SET_THREADS:
            fn = getattr(so, sym, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                return True
    return False
