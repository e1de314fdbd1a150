"""MultiModalEmbeddingCache: projected image embeddings keyed by content hash, LRU within a byte budget.

The budget (--mm-embedding-cache-mb) is a declared term of the memory plan, so the cache never holds more than
the plan charged for. An entry larger than the whole budget is not cached. Single-threaded (scheduler process).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import torch


class MultiModalEmbeddingCache:
    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self._entries: "OrderedDict[str, torch.Tensor]" = OrderedDict()
        self._used_bytes = 0
        self.hits = 0
        self.misses = 0

    @staticmethod
    def entry_bytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    def get(self, key: str) -> Optional[torch.Tensor]:
        t = self._entries.get(key)
        if t is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return t

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def put(self, key: str, t: torch.Tensor) -> bool:
        """Insert (evicting least recently used entries); False when t alone exceeds the budget."""
        size = self.entry_bytes(t)
        if size > self.capacity_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self._used_bytes -= self.entry_bytes(old)
        while self._used_bytes + size > self.capacity_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._used_bytes -= self.entry_bytes(evicted)
        self._entries[key] = t
        self._used_bytes += size
        return True

    def clear(self) -> None:
        self._entries.clear()
        self._used_bytes = 0

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    def __len__(self) -> int:
        return len(self._entries)

    def check_integrity(self) -> None:
        assert self._used_bytes == sum(self.entry_bytes(t) for t in self._entries.values())
        assert 0 <= self._used_bytes <= self.capacity_bytes, (self._used_bytes, self.capacity_bytes)
