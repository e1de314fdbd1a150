"""One BLAS thread for numpy while Triton kernels run in the CPU interpreter.

The interpreter runs each tl.dot as numpy.matmul on one program's tile (e.g. [512, 64] x [64, 256]). numpy's
OpenBLAS splits such a product over every core, which on a busy machine is far slower than one thread: measured on
this 2-core machine at load average 8, 17-20 ms per product on 2 threads against 0.6 ms on one. The kernels' tiles
are too small to gain from threads, so the interpreted backend pins numpy's BLAS to one thread (torch's own thread
pool is not affected). Best effort: threadpoolctl when installed, else the OpenBLAS entry point of the library
numpy loaded; returns whether a limit was applied.
"""

from __future__ import annotations

import ctypes
import logging

logger = logging.getLogger(__name__)

OPENBLAS_SET_THREADS_SYMBOLS = (
    "openblas_set_num_threads",  # a system OpenBLAS
    "scipy_openblas_set_num_threads64_",  # the copy bundled in numpy wheels (64-bit integer build)
    "scipy_openblas_set_num_threads",
)


def _loaded_openblas_paths() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
    except OSError:
        return []


def use_single_threaded_blas() -> bool:
    import numpy  # noqa: F401  (loads its BLAS, so the library is found below)

    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1, user_api="blas")
        return True
    except ImportError:
        pass
    for path in _loaded_openblas_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in OPENBLAS_SET_THREADS_SYMBOLS:
            setter = getattr(lib, symbol, None)
            if setter is not None:
                setter(1)
                return True
    logger.info("Triton interpreter: could not limit numpy's BLAS threads; interpreted tl.dot may be slow")
    return False
