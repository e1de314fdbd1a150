"""KV memory of requests: prefix matching, slot allocation, release, and the integrity invariant.

Every KV page is in exactly one of three places:
    the allocator's free list | owned by an unfinished request (slots [prefix_len, alloc_len) of its row) |
    the radix cache (locked by requests that borrow it, or evictable)
check_integrity() asserts free + owned + cached == total for KV pages, and free + held == total for request slots.
A model with windowed layers (mem_cache/swa_allocator.py) has windowed pages too: a request owns the windowed pages of
its own positions [max(prefix_len, windowed_freed_len), alloc_len) -- free_out_of_window frees those the window has
moved past after every forward -- and the invariant covers them the same way. Without full layers the windowed pool
is the token pool, so those are also the only token pages a request still owns.
Rows are read and written through the pool's host copy (ReqToTokenPool.read / write): nothing here waits for a device.
repair() runs after a fault: if the invariant fails it recomputes both free lists from the holders and the cache.
"""

from __future__ import annotations

import logging
from typing import Iterable, List, Optional, Tuple

from sglang.srt.managers.fault_confinement import SchedulerStateCorrupt
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache

logger = logging.getLogger(__name__)


class ReqMemory:
    def __init__(self, req_to_token_pool, allocator, tree_cache: Optional[RadixCache], page_size: int):
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.page_size = page_size
        self.num_memory_repairs = 0  # faults whose cleanup left the free lists wrong (a bug to fix; should stay 0)
        self.window_tokens = allocator.window_tokens  # W of the windowed layers; 0: every layer keeps every token
        if self.window_tokens and tree_cache is not None and not isinstance(tree_cache, SWARadixCache):
            # the plain radix cache knows token pages only: the windowed one also tracks each node's windowed pages
            self.tree_cache = SWARadixCache(page_size, allocator, self.window_tokens)
        self.windowed_cache = isinstance(self.tree_cache, SWARadixCache)
        # a hidden-state draft head (EAGLE / EAGLE3 / NEXTN) computed its KV at position i from token i + 1, so the
        # last position of a cached prefix holds head KV made for the continuation of whoever wrote it: with one, a
        # prefix hit stops a page short and the request recomputes that page (SpecDecoder sets it)
        self.trim_prefix_page = False

    # ------------------------------------------------------------------ sizes
    def evictable_tokens(self) -> int:
        return self.tree_cache.evictable_size() if self.tree_cache is not None else 0

    def used_tokens(self) -> int:
        """Tokens held by requests (free and evictable cache excluded)."""
        return self.allocator.size - self.allocator.available_size() - self.evictable_tokens()

    # ------------------------------------------------------------------ admission
    def match_prefix(self, req: Req) -> Tuple[List[int], object]:
        if self.tree_cache is None:
            return [], None
        # keep at least one token to compute: the logits of the last prompt token are needed; a request still
        # collecting prompt logprobs computes the rows it needs (managers/prompt_logprob_state.py)
        end = req.fill_len - 1
        if req.prompt_logprobs is not None and req.prompt_logprobs.prefix_limit() is not None:
            end = min(end, req.prompt_logprobs.prefix_limit())
        slots, node = self.tree_cache.match_prefix(req.fill_ids[:end], req.cache_salt)
        if self.trim_prefix_page and slots:
            slots, node = self.tree_cache.match_prefix(req.fill_ids[:len(slots) - self.page_size], req.cache_salt)
        return slots, node

    def admit(self, req: Req, prefix_slots: List[int], node) -> None:
        """Give the request a row, borrowing (and locking) the cached prefix."""
        req.prefix_len = len(prefix_slots)
        req.last_node = node
        if node is not None:
            self.tree_cache.inc_lock_ref(node)
        req.req_pool_idx = self.req_to_token_pool.alloc()
        if prefix_slots:
            self.req_to_token_pool.write(req.req_pool_idx, 0, prefix_slots)
        req.kv_len = req.alloc_len = len(prefix_slots)

    def _last_slot(self, req: Req) -> int:
        """The slot of the request's last allocated token: it matters only when its last page may have room
        (page_size > 1); 0 otherwise."""
        cur = req.alloc_len
        return self.req_to_token_pool.read(req.req_pool_idx, cur - 1, cur)[0] if self.page_size > 1 and cur else 0

    def alloc(self, req: Req, num_new: int) -> Optional[List[int]]:
        """Slots for tokens [alloc_len, alloc_len + num_new), recorded in the request's row (evicting cached
        prefixes if needed); None, allocating nothing, if they do not fit."""
        cur = req.alloc_len
        last = self._last_slot(req)
        slots = self.allocator.alloc(cur, last, num_new)
        if slots is None and self.tree_cache is not None:
            self.evict_for(self.allocator.pages_needed(cur, num_new) * self.page_size)
            slots = self.allocator.alloc(cur, last, num_new)
        if slots is None:
            return None
        self.req_to_token_pool.write(req.req_pool_idx, cur, slots)
        req.alloc_len = cur + num_new
        return slots

    def alloc_if_free(self, req: Req, num_new: int) -> int:
        """Slots for up to num_new more tokens from free pages only (never evicting): speculative proposals take
        what is free and nothing else. Returns how many it got (the most that fit, possibly 0)."""
        cur = req.alloc_len
        last = self._last_slot(req)
        while num_new > 0:
            slots = self.allocator.alloc(cur, last, num_new)
            if slots is not None:
                self.req_to_token_pool.write(req.req_pool_idx, cur, slots)
                req.alloc_len = cur + num_new
                return num_new
            num_new = min(num_new - 1, self.allocator.available_size())
        return 0

    def truncate(self, req: Req, keep_len: Optional[int] = None) -> None:
        """Give back the slots of positions [keep_len, alloc_len) (default keep_len = kv_len: rejected proposals):
        page-aware, only pages wholly at or past ceil(keep_len / page) * page go back; then alloc_len == keep_len."""
        keep_len = req.kv_len if keep_len is None else keep_len
        ps = self.page_size
        keep = -(-keep_len // ps) * ps
        if req.alloc_len > keep:
            self.allocator.free(self.req_to_token_pool.read(req.req_pool_idx, keep, req.alloc_len))
        req.alloc_len = min(req.alloc_len, keep_len)

    def evict_for(self, num_tokens: int) -> None:
        """Evict cached prefixes until num_tokens are free in the token pool and, with a separate windowed pool, in
        that one too (windowed-only eviction first tombstones cached nodes, freeing their windowed pages alone)."""
        if self.tree_cache is None:
            return
        short = num_tokens - self.allocator.available_size()
        if short > 0:
            self.tree_cache.evict(short)
        if self.windowed_cache and not self.allocator.windowed_only:
            short = num_tokens - self.allocator.windowed_available_size()
            if short > 0:
                self.tree_cache.evict_windowed(short)

    def alloc_decode(self, reqs: List[Req]) -> bool:
        """A slot for the next token of each request (a decode step), recorded with one table write (and one page
        map write); False if one did not fit (the requests before it have theirs, the rest none)."""
        pool, ps = self.req_to_token_pool, self.page_size
        cur = [r.alloc_len for r in reqs]
        rows = [r.req_pool_idx for r in reqs]
        # the slot of a request's last token matters only when its last page may have room (page_size > 1)
        last = pool.read_cells(rows, [c - 1 for c in cur]) if ps > 1 else [0] * len(reqs)
        slots: List[int] = []
        with self.allocator.deferred_maps():  # the step's windowed page maps written once (swa_allocator.py)
            for r, c, lst in zip(reqs, cur, last):
                got = self.allocator.alloc(c, lst, 1)
                if got is None and self.tree_cache is not None:
                    self.evict_for(self.allocator.pages_needed(c, 1) * ps)
                    got = self.allocator.alloc(c, lst, 1)
                if got is None:
                    break
                slots.append(got[0])
                r.alloc_len = c + 1
        n = len(slots)
        if n:
            pool.write_cells(rows[:n], cur[:n], slots)
        return n == len(reqs)

    # ------------------------------------------------------------------ release
    def release(self, req: Req, cache: bool) -> None:
        """Give back a request's KV slots and row; with cache=True its computed tokens enter the prefix cache.
        Slots allocated for tokens never computed (kv_len..alloc_len) are always freed."""
        if req.req_pool_idx is None:
            return
        ps = self.page_size
        slots = self.req_to_token_pool.read(req.req_pool_idx, 0, req.alloc_len)
        if cache and self.windowed_cache:
            # the windowed cache takes every slot of ours it is given, keeping or freeing it (swa_radix_cache.py)
            aligned = req.kv_len // ps * ps
            self.tree_cache.insert(req.fill_ids[:aligned], slots[:aligned], req.cache_salt,
                                   windowed_from=min(max(req.prefix_len, req.windowed_freed_len), aligned),
                                   borrowed_len=req.prefix_len)
            self.allocator.free(slots[aligned:])  # the partly filled last page and uncomputed slots
        elif cache and self.tree_cache is not None:
            aligned = req.kv_len // ps * ps
            n_cached = self.tree_cache.insert(req.fill_ids[:aligned], slots[:aligned], req.cache_salt)
            self.allocator.free(slots[req.prefix_len : n_cached])  # our duplicates of already cached pages
            self.allocator.free(slots[aligned:])  # the partly filled last page and uncomputed slots
        else:
            self.allocator.free(slots[self._first_owned(req):])
        if req.last_node is not None and self.windowed_cache:
            self.tree_cache.dec_lock_ref(req.last_node, window_released=req.window_released)
        elif req.last_node is not None:
            self.tree_cache.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.reset_memory_state()

    def _first_owned(self, req: Req) -> int:
        """The first position whose token page the request still holds: without full layers the pages the window
        left were given back whole (their req_to_token entries are stale)."""
        if self.window_tokens and self.allocator.windowed_only:
            return max(req.prefix_len, req.windowed_freed_len)
        return req.prefix_len

    def free_out_of_window(self, reqs: Iterable[Req]) -> None:
        """After a forward: free each request's own windowed pages that lie wholly below kv_len - W + 1. The next
        forward's first new token is at kv_len and reads keys from kv_len - W + 1 on (the guarantee the attention
        backends rely on: layers/attention/window_metadata.py)."""
        if not self.window_tokens:
            return
        ps, pool = self.page_size, self.req_to_token_pool
        for r in reqs:
            if r.req_pool_idx is None:
                continue
            start = max(r.prefix_len, r.windowed_freed_len)
            end = (r.kv_len - self.window_tokens + 1) // ps * ps
            if end > start:
                self.allocator.free_windowed(pool.read(r.req_pool_idx, start, end)[::ps])  # one slot a page
                r.windowed_freed_len = end
            # the borrowed prefix's window is read no more once the request's own tokens cover its window
            if (self.windowed_cache and r.last_node is not None and not r.window_released
                    and r.kv_len - self.window_tokens + 1 >= r.prefix_len):
                self.tree_cache.release_window(r.last_node)
                r.window_released = True

    def flush(self) -> None:
        if self.tree_cache is not None:
            self.tree_cache.reset()
        self.allocator.clear()
        self.req_to_token_pool.clear()

    # ------------------------------------------------------------------ invariants
    def _owned_pages(self, req: Req, first: Optional[int] = None) -> int:
        ps = self.page_size
        first = self._first_owned(req) if first is None else first
        return max(-(-req.alloc_len // ps) - first // ps, 0)

    def check_integrity(self, holders: List[Req]) -> None:
        """free + held by requests + cached == total, for KV pages, for windowed pages and for request slots
        (AssertionError if not)."""
        in_use = sum(self._owned_pages(r) for r in holders)
        windowed = sum(self._owned_pages(r, max(r.prefix_len, r.windowed_freed_len)) for r in holders)
        if self.tree_cache is not None:
            self.tree_cache.check_integrity()
            in_use += self.tree_cache.total_size() // self.page_size
            if self.window_tokens:
                windowed += self.tree_cache.windowed_total_size() // self.page_size
        if self.window_tokens and not self.allocator.windowed_only:
            self.allocator.check_integrity(in_use, windowed)
        else:
            self.allocator.check_integrity(in_use)
        self.req_to_token_pool.check_integrity(len(holders))

    def rebuild_free_lists(self, holders: Iterable[Req]) -> None:
        """Repair: every page neither owned by a holder nor cached is free; every row not held is free."""
        ps = self.page_size
        used_pages = set()
        rows = set()
        pool = self.req_to_token_pool
        for r in holders:
            rows.add(r.req_pool_idx)
            used_pages.update(s // ps for s in pool.read(r.req_pool_idx, self._first_owned(r), r.alloc_len))
        if self.tree_cache is not None:
            used_pages.update(s // ps for s in self.tree_cache.all_slots())
        self.allocator.rebuild_free_lists(used_pages)
        pool.free_all_but(rows)

    def repair(self, holders: List[Req]) -> None:
        """After a fault: check the invariants; rebuild the free lists if they do not hold; raise
        SchedulerStateCorrupt if even that does not restore them."""
        try:
            self.check_integrity(holders)
            return
        except AssertionError as e:
            logger.error("Memory integrity violated after a fault (%s); rebuilding the free lists", e)
        self.num_memory_repairs += 1
        try:
            self.rebuild_free_lists(holders)
            self.check_integrity(holders)
        except AssertionError as e:
            raise SchedulerStateCorrupt(f"memory bookkeeping could not be repaired after a fault: {e}") from e
        logger.warning("Free lists rebuilt; memory integrity restored")
