"""LiveTensorPeak: the peak bytes of tensors that ops create and that are still alive, on any device -- an exact
count of what a module's forward holds at once (its inputs and weights, created before, are not counted), used to
check the encoder formulas in mem_plan/encoder_towers.py against HF transformers' reference towers on a CPU.
Storages are tracked by data pointer with a reference count of the tensors that use them; a storage is freed when
its last tensor is. Memory an op allocates and frees inside itself (a fused kernel's scratch) is not seen."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LiveTensorPeak(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self._live: dict = {}  # storage data_ptr -> [bytes, tensors using it]
        self.current_bytes = 0
        self.peak_bytes = 0

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if key == 0 or size == 0:
            return
        if key not in self._live:
            self._live[key] = [size, 0]
            self.current_bytes += size
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        self._live[key][1] += 1
        weakref.finalize(t, self._drop, key)

    def _drop(self, key: int) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current_bytes -= entry[0]
            del self._live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out
