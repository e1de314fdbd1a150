"""Allocators of a model with windowed layers (swa_pool.py): token-pool slots, with windowed pages alongside.

Full + windowed layers: every token-pool page a request gets comes with a windowed page (page-parallel: token slot
p*P + o <-> windowed slot q*P + o), recorded in page_map (host, token page -> windowed page, 0: none) and in the
pool's slot_map (device, per slot, what the kernels read). A request's windowed pages are freed on their own once
the window has moved past them (free_windowed: the token pages stay, their positions map to the windowed dummy page
0); free() gives back the token pages and whatever windowed pages they still hold.
Windowed layers only: the windowed pool is the token pool, so there is one page list; free_windowed is free, and the
freed positions' req_to_token entries are stale (never read: the backends read from the window start on).

Invariant (check_integrity): every windowed page is free or mapped from exactly one held token page.
Inside deferred_maps() (a decode step's allocations) the fresh pages' mappings are queued and written to page_map and
slot_map with one indexed write each when it ends; every method that reads the maps writes the queue first, so none
sees them lag behind the free lists.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List, Optional, Sequence

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator


def _list(slots) -> List[int]:
    return slots.tolist() if isinstance(slots, torch.Tensor) else list(slots)


class WindowedTokenPoolAllocator(TokenToKVPoolAllocator):
    """Windowed layers only: the token pool is the windowed pool."""

    windowed_only = True

    def __init__(self, size: int, page_size: int, window_tokens: int):
        super().__init__(size, page_size)
        self.window_tokens = window_tokens
        self.max_windowed_pages_in_use = 0  # the most held at once (right after an allocation), for /server_info

    def alloc(self, cur_len: int, last_slot: int, num_new: int) -> Optional[List[int]]:
        slots = super().alloc(cur_len, last_slot, num_new)
        self.max_windowed_pages_in_use = max(self.max_windowed_pages_in_use, self.num_windowed_pages_in_use())
        return slots

    @property
    def windowed_size(self) -> int:
        return self.size

    def windowed_available_size(self) -> int:
        return self.available_size()

    def num_windowed_pages_in_use(self) -> int:
        return self.num_pages - self.num_free_pages()

    def free_windowed(self, slots: Sequence[int] | torch.Tensor) -> None:
        self.free(slots)


class SWATokenToKVPoolAllocator:
    """Full + windowed layers: token-pool pages (self.full) and windowed pages (self.windowed), mapped page to page."""

    windowed_only = False

    def __init__(self, size: int, windowed_size: int, page_size: int, window_tokens: int, slot_map: torch.Tensor):
        self.full = TokenToKVPoolAllocator(size, page_size)
        self.windowed = TokenToKVPoolAllocator(windowed_size, page_size)
        self.page_size, self.window_tokens = page_size, window_tokens
        self.size, self.num_pages = self.full.size, self.full.num_pages
        self.windowed_size = self.windowed.size
        if slot_map.numel() < (self.num_pages + 1) * page_size:
            raise ValueError(f"slot_map of {slot_map.numel()} entries cannot map {self.num_pages} pages of {page_size}")
        self.slot_map = slot_map
        self.page_map = torch.zeros(self.num_pages + 1, dtype=torch.int64)  # host: token page -> windowed page
        self._offsets = torch.arange(page_size, dtype=slot_map.dtype, device=slot_map.device)
        # mappings not yet in page_map / slot_map (token pages, their windowed pages): see deferred_maps
        self._pending_token_pages: List[int] = []
        self._pending_windowed_pages: List[int] = []
        self._deferring = False
        self.max_windowed_pages_in_use = 0  # the most held at once (right after an allocation), for /server_info

    # ------------------------------------------------------------------ sizes
    def available_size(self) -> int:
        """Free token-pool tokens: what admission weighs a prompt against (its windowed pages are freed as the window
        moves, so a request never holds more than a window of them)."""
        return self.full.available_size()

    def num_free_pages(self) -> int:
        return self.full.num_free_pages()

    def num_allocatable_pages(self) -> int:
        """Fresh pages a request can get now: it needs one of each pool per page."""
        return min(self.full.num_free_pages(), self.windowed.num_free_pages())

    def windowed_available_size(self) -> int:
        return self.windowed.available_size()

    def num_windowed_pages_in_use(self) -> int:
        return self.windowed.num_pages - self.windowed.num_free_pages()

    def pages_needed(self, cur_len: int, num_new: int) -> int:
        return self.full.pages_needed(cur_len, num_new)

    @property
    def free_pages(self) -> List[int]:
        return self.full.free_pages

    # ------------------------------------------------------------------ alloc / free
    def clear(self) -> None:
        self._pending_token_pages.clear()  # mappings of pages the clear frees: nothing to write
        self._pending_windowed_pages.clear()
        self.full.clear()
        self.windowed.clear()
        self.page_map.zero_()
        self.slot_map.zero_()

    @contextmanager
    def deferred_maps(self) -> Iterator[None]:
        """Queue the mappings of the pages allocated inside and write them once at the end: a decode step's
        per-request allocations cost one pair of indexed writes instead of one per request (each is a few small
        tensors, ~35 us)."""
        assert not self._deferring, "deferred_maps does not nest"
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            self._write_maps()

    def _set_map(self, token_pages: List[int], windowed_pages: List[int]) -> None:
        self._pending_token_pages.extend(token_pages)
        self._pending_windowed_pages.extend(windowed_pages)
        if not self._deferring:
            self._write_maps()

    def _write_maps(self) -> None:
        """Write the queued mappings into page_map and slot_map (every reader of the maps calls this first)."""
        if not self._pending_token_pages:
            return
        tp = torch.tensor(self._pending_token_pages, dtype=torch.int64)
        wp = torch.tensor(self._pending_windowed_pages, dtype=torch.int64)
        self._pending_token_pages.clear()
        self._pending_windowed_pages.clear()
        self.page_map[tp] = wp
        ps = self.page_size
        rows = self.slot_map.view(-1, ps)
        start = (wp * ps).to(device=self.slot_map.device, dtype=self.slot_map.dtype)
        rows[tp.to(self.slot_map.device)] = start[:, None] + self._offsets if ps > 1 else start[:, None]

    def alloc(self, cur_len: int, last_slot: int, num_new: int) -> Optional[List[int]]:
        """Token-pool slots for tokens [cur_len, cur_len + num_new) (allocator.py), each fresh page with its windowed
        page; None, allocating nothing, if either pool is short."""
        n_pages = self.full.pages_needed(cur_len, num_new)
        if n_pages > self.windowed.num_free_pages():
            return None
        slots = self.full.alloc(cur_len, last_slot, num_new)
        if slots is None:
            return None
        if n_pages:
            ps = self.page_size
            fresh = sorted({s // ps for s in slots} - ({last_slot // ps} if cur_len % ps else set()))
            assert len(fresh) == n_pages, (fresh, n_pages)
            wpages = self.windowed.free_pages[-n_pages:][::-1]
            del self.windowed.free_pages[len(self.windowed.free_pages) - n_pages:]
            self._set_map(fresh, wpages)
            self.max_windowed_pages_in_use = max(self.max_windowed_pages_in_use, self.num_windowed_pages_in_use())
        return slots

    def _release_windowed(self, token_pages: List[int]) -> None:
        self._write_maps()
        tp = torch.tensor(token_pages, dtype=torch.int64)
        held = self.page_map[tp]
        mapped = tp[held != 0]
        if not len(mapped):
            return
        self.windowed.free_pages.extend(sorted(held[held != 0].tolist(), reverse=True))
        self.page_map[mapped] = 0
        self.slot_map.view(-1, self.page_size)[mapped.to(self.slot_map.device)] = 0

    def free(self, slots: Sequence[int] | torch.Tensor) -> None:
        """Free the token pages holding `slots`, and the windowed pages they still map."""
        slots = _list(slots)
        if not slots:
            return
        pages = sorted({s // self.page_size for s in slots})
        self._release_windowed(pages)
        self.full.free_pages.extend(reversed(pages))

    def free_windowed(self, slots: Sequence[int] | torch.Tensor) -> None:
        """Free only the windowed pages of the token pages holding `slots` (those still mapped); they map to 0 now."""
        slots = _list(slots)
        if slots:
            self._release_windowed(sorted({s // self.page_size for s in slots}))

    # ------------------------------------------------------------------ invariants / repair
    def check_integrity(self, num_pages_in_use: int, num_windowed_pages_in_use: Optional[int] = None) -> None:
        """The token pool as allocator.py checks it; every windowed page free or mapped from one held token page
        (and, given, as many mapped as the holders say)."""
        self._write_maps()
        self.full.check_integrity(num_pages_in_use)
        mapped = self.page_map[self.page_map != 0].tolist()
        assert len(set(mapped)) == len(mapped), "a windowed page is mapped from two token pages"
        assert not set(mapped) & set(self.windowed.free_pages), "a mapped windowed page is on the free list"
        assert not (self.page_map[torch.tensor(self.full.free_pages, dtype=torch.int64)] != 0).any(), (
            "a free token page still maps a windowed page")
        self.windowed.check_integrity(len(mapped))
        if num_windowed_pages_in_use is not None:
            assert len(mapped) == num_windowed_pages_in_use, (
                f"windowed pages leak: mapped {len(mapped)} != held by requests and the cache "
                f"{num_windowed_pages_in_use}")

    def rebuild_free_lists(self, used_token_pages: set) -> None:
        """Repair: token pages not used are free; windowed pages are held only through used token pages' map."""
        self._write_maps()
        self.full.free_pages = [p for p in range(self.num_pages, 0, -1) if p not in used_token_pages]
        unused = [p for p in range(1, self.num_pages + 1) if p not in used_token_pages and self.page_map[p] != 0]
        if unused:
            self._release_windowed(unused)
        held = set(self.page_map[self.page_map != 0].tolist())
        self.windowed.free_pages = [q for q in range(self.windowed.num_pages, 0, -1) if q not in held]
