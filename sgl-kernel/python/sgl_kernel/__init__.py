"""sgl_kernel: the CPU kernels (csrc/cpu/) compiled ahead of time by `pip install --no-build-isolation ./sgl-kernel`.

`load()` returns the compiled module and the digest of the sources it was built from. The runtime does not import
this package directly: `sglang.jit_kernel.cpu_ops.get_cpu_ops()` takes this build when its digest matches the
checkout's sources, and otherwise compiles them on first use (or falls back to torch, with the reason logged).
"""

from types import ModuleType
from typing import Tuple


def load() -> Tuple[ModuleType, str]:
    import torch  # noqa: F401  (loads libc10 / libtorch, which the extension links against)

    from sgl_kernel import _cpu_ops
    from sgl_kernel._build_info import SOURCE_DIGEST

    return _cpu_ops, SOURCE_DIGEST
