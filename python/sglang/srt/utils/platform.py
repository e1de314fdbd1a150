"""Which accelerator this torch build targets, with upstream's predicate names (`sglang.srt.utils.is_cuda` ...).

Each answers for the installed torch and the visible devices, and imports torch only when called, so importing
`sglang.srt.utils` stays cheap. The runtime's own device choice is configs/resolved.py (--device auto).
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def is_cuda() -> bool:
    """An NVIDIA GPU through a CUDA build of torch."""
    import torch

    return bool(torch.version.cuda) and torch.cuda.is_available()


@functools.lru_cache(maxsize=None)
def is_hip() -> bool:
    """An AMD GPU through a ROCm (HIP) build of torch."""
    import torch

    return bool(getattr(torch.version, "hip", None)) and torch.cuda.is_available()


def is_cuda_alike() -> bool:
    """CUDA or ROCm: the code paths that use torch.cuda."""
    return is_cuda() or is_hip()


@functools.lru_cache(maxsize=None)
def is_npu() -> bool:
    """An Ascend NPU (torch_npu). This runtime has no NPU path, so this is True only where torch_npu says so."""
    import torch

    return hasattr(torch, "npu") and torch.npu.is_available()


@functools.lru_cache(maxsize=None)
def is_xpu() -> bool:
    """An Intel GPU through torch's XPU backend (no XPU path here either)."""
    import torch

    return hasattr(torch, "xpu") and torch.xpu.is_available()


def is_cpu() -> bool:
    """No accelerator this runtime drives: it serves on the CPU."""
    return not (is_cuda_alike() or is_npu() or is_xpu())


def get_device() -> str:
    """'cuda' (also for ROCm, as torch spells it), 'npu', 'xpu' or 'cpu'."""
    if is_cuda_alike():
        return "cuda"
    if is_npu():
        return "npu"
    if is_xpu():
        return "xpu"
    return "cpu"
