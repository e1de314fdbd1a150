"""Measure: the only module in mem_plan that reads a device. Every device import is lazy.

CPU: peak RSS is reset by writing "5" to /proc/self/clear_refs and read back as VmHWM from /proc/self/status
(Linux); current RSS is VmRSS; available memory comes from psutil.
CUDA/HIP: torch.cuda.mem_get_info / reset_peak_memory_stats / max_memory_allocated; a device index of None is the
current device (each TP rank sets its own).
Distributed: min_across_ranks() so every rank plans from the tightest device (over the TP group's gloo group).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator, Optional

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
_RESET_PEAK_RSS = "5"  # clear_refs value that resets VmHWM to the current RSS


def _status_kib(field: str) -> int:
    with open(_STATUS) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])  # "VmHWM:   123456 kB"
    raise RuntimeError(f"{field} not found in {_STATUS}")


def cpu_current_rss_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def cpu_peak_rss_bytes() -> int:
    return _status_kib("VmHWM") * 1024


def reset_cpu_peak_rss() -> bool:
    """Reset VmHWM to the current RSS. Returns False where the kernel does not allow it."""
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write(_RESET_PEAK_RSS)
        return True
    except OSError:
        return False


def trim_cpu_heap() -> None:
    """glibc malloc_trim(0): return the heap's free memory to the OS, so the next RSS reading (and a peak measured
    from it) does not depend on what earlier, freed temporaries left behind. A no-op where libc is not glibc."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def cpu_available_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def cuda_free_and_total_bytes(device: Optional[int] = None) -> tuple[int, int]:
    import torch

    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def cuda_reset_peak(device: Optional[int] = None) -> None:
    import torch

    torch.cuda.reset_peak_memory_stats(device)


def cuda_peak_allocated_bytes(device: Optional[int] = None) -> int:
    import torch

    return int(torch.cuda.max_memory_allocated(device))


def cuda_allocated_bytes(device: Optional[int] = None) -> int:
    import torch

    return int(torch.cuda.memory_allocated(device))


def min_across_ranks(value: int) -> int:
    """MIN of an integer over the TP ranks once their group exists; the value itself before (and at tp == 1).

    The reduction is communication_op's, on the TP group's gloo cpu_group: the value is a host integer, and the
    default group is NCCL on CUDA, which cannot reduce a CPU tensor.
    """
    import sys

    # no TP group can exist before parallel_state is imported; the lazy import keeps mem_plan free of torch and
    # of srt.distributed at import time
    if "sglang.srt.distributed.parallel_state" not in sys.modules:
        return value
    from sglang.srt.distributed.communication_op import tp_min_int

    return tp_min_int(value)


@dataclass
class PeakMeasurement:
    """Result of measure_peak(): bytes above the baseline at the peak of the block."""

    device: str
    baseline_bytes: int = 0
    peak_bytes: int = 0

    @property
    def increase_bytes(self) -> int:
        return max(self.peak_bytes - self.baseline_bytes, 0)


@contextlib.contextmanager
def measure_peak(device: str = "cpu", device_index: Optional[int] = None) -> Iterator[PeakMeasurement]:
    """Measure the peak memory of a block (e.g. the profile forward at chunked_prefill_size).

    CPU: peak RSS (VmHWM after a reset) minus the RSS at entry. CUDA/HIP: peak allocated minus allocated at entry.
    """
    m = PeakMeasurement(device)
    if device == "cpu":
        trim_cpu_heap()
        reset_cpu_peak_rss()
        m.baseline_bytes = cpu_current_rss_bytes()
        yield m
        m.peak_bytes = cpu_peak_rss_bytes()
    else:
        cuda_reset_peak(device_index)
        m.baseline_bytes = cuda_allocated_bytes(device_index)
        yield m
        m.peak_bytes = cuda_peak_allocated_bytes(device_index)


def pre_load_free_bytes(device: str = "cpu", device_index: Optional[int] = None,
                        cap_bytes: Optional[int] = None) -> int:
    """Free memory before weights load, MIN over ranks. CPU: psutil available memory."""
    if device == "cpu":
        free = cpu_available_bytes()
    else:
        free = cuda_free_and_total_bytes(device_index)[0]
    if cap_bytes is not None:
        free = min(free, cap_bytes)
    return min_across_ranks(free)


def peak_rss_supported() -> bool:
    return os.path.exists(_CLEAR_REFS) and os.path.exists(_STATUS)
