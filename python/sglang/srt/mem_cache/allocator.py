"""Page-granular allocator of KV-pool slots.

The pool has `num_pages = size // page_size` real pages, numbered 1..num_pages; page p covers slots
[p * page_size, (p + 1) * page_size). Page 0 is the dummy page (see memory_pool.py) and is never handed out.
A request's tokens fill its pages in order, so token i of a request lives in page
`req_pages[i // page_size]` at offset `i % page_size`; only the request's last page can be partly filled.
Freeing takes whole pages: the caller passes slots whose pages it owns outright.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager, List, Optional, Sequence

import torch


class TokenToKVPoolAllocator:
    window_tokens = 0  # W of a windowed model's pool (swa_allocator.py); 0: every layer keeps every token

    def __init__(self, size: int, page_size: int = 1):
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.page_size = page_size
        self.num_pages = size // page_size
        if self.num_pages <= 0:
            raise ValueError(f"KV pool of {size} tokens holds no page of {page_size} tokens.")
        self.size = self.num_pages * page_size
        self.clear()

    def clear(self) -> None:
        # pop() from the end hands out low page numbers first
        self.free_pages: List[int] = list(range(self.num_pages, 0, -1))

    def available_size(self) -> int:
        """Free tokens (whole free pages only)."""
        return len(self.free_pages) * self.page_size

    def num_free_pages(self) -> int:
        return len(self.free_pages)

    def num_allocatable_pages(self) -> int:
        """Fresh pages a request can get now (swa_allocator.py: the smaller of its two pools)."""
        return len(self.free_pages)

    def pages_needed(self, cur_len: int, num_new: int) -> int:
        """Fresh pages needed to grow a request from cur_len to cur_len + num_new tokens."""
        ps = self.page_size
        have = -(-cur_len // ps)
        need = -(-(cur_len + num_new) // ps)
        return need - have

    def alloc(self, cur_len: int, last_slot: int, num_new: int) -> Optional[List[int]]:
        """Slots for tokens [cur_len, cur_len + num_new) of a request whose token cur_len-1 sits at last_slot.

        Returns None (allocating nothing) if there are not enough free pages.
        """
        ps = self.page_size
        if ps == 1:
            if num_new > len(self.free_pages):
                return None
            out = self.free_pages[-num_new:] if num_new else []
            del self.free_pages[len(self.free_pages) - num_new:]
            out.reverse()
            return out
        n_pages = self.pages_needed(cur_len, num_new)
        if n_pages > len(self.free_pages):
            return None
        slots: List[int] = []
        room = (ps - cur_len % ps) % ps  # free slots left in the last partly filled page
        take = min(room, num_new)
        if take:
            slots.extend(range(last_slot + 1, last_slot + 1 + take))
        remaining = num_new - take
        for _ in range(n_pages):
            page = self.free_pages.pop()
            n = min(ps, remaining)
            slots.extend(range(page * ps, page * ps + n))
            remaining -= n
        assert remaining == 0
        return slots

    def deferred_maps(self) -> ContextManager[None]:
        """Allocations inside may batch their bookkeeping (swa_allocator.py's page maps); one pool has none."""
        return nullcontext()

    def free(self, slots: Sequence[int] | torch.Tensor) -> None:
        """Return the pages holding `slots` to the free list (each page once)."""
        if isinstance(slots, torch.Tensor):
            slots = slots.tolist()
        if not len(slots):
            return
        if self.page_size == 1:
            self.free_pages.extend(slots)
            return
        ps = self.page_size
        pages = sorted({s // ps for s in slots}, reverse=True)
        self.free_pages.extend(pages)

    def check_integrity(self, num_pages_in_use: int) -> None:
        """Invariant: free + in use (held by requests or cached) == total, with no page free twice."""
        free = self.free_pages
        assert len(set(free)) == len(free), "a KV page is on the free list twice"
        assert all(1 <= p <= self.num_pages for p in free), "a free KV page is out of range"
        assert len(free) + num_pages_in_use == self.num_pages, (
            f"KV pages leak: free {len(free)} + in use {num_pages_in_use} != total {self.num_pages}"
        )

    def rebuild_free_lists(self, used_pages: set) -> None:
        """Repair after a fault: every page not in used_pages is free."""
        self.free_pages = [p for p in range(self.num_pages, 0, -1) if p not in used_pages]
