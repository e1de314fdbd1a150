"""Which mode the kernels run in: compiled for the GPU, or the CPU interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

import triton


def interpreted() -> bool:
    from triton import knobs

    return bool(knobs.runtime.interpret)


class lazy_jit:  # noqa: N801 (used as a decorator, like triton.jit)
    """`triton.jit`, applied at the first launch in each mode (GPU compile or CPU interpreter) rather than at import.

    triton.jit fixes the mode when it runs; deferring it means importing these kernels never fixes the mode for the
    process (a test suite may import them before or after setting TRITON_INTERPRET). Launch as `kernel[grid](...)`.
    """

    def __init__(self, fn):
        self.fn = fn
        self._by_mode = {}

    def __getitem__(self, grid):
        mode = interpreted()
        kernel = self._by_mode.get(mode)
        if kernel is None:
            kernel = self._by_mode[mode] = triton.jit(self.fn)
        return kernel[grid]
