"""The brute-force page-level reference of the SWA radix cache (test_swa_radix_cache.py) and the harness that drives
the cache, the reference and the real allocator (behind a logging wrapper) through the same operations.

The reference keeps one record per cached page, keyed by the whole token prefix up to that page: its slots, whether it
holds windowed K/V, its two lock counts and its last touch (event, position). Matching, locking, insertion and eviction
are written over pages with no tree, no splitting and no nodes, straight from the rules in swa_radix_cache.py's
docstring.
"""

from typing import Dict, List, Set, Tuple

import torch

from sglang.srt.mem_cache.swa_allocator import SWATokenToKVPoolAllocator, WindowedTokenPoolAllocator
from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache

Event = Tuple[str, int]  # ("full" | "win", token-pool page)


class LoggingAllocator:
    """The real allocator (swa_allocator.py), with its own record of which pages each pool holds: every page freed
    from each pool is logged, and a page freed that this record does not hold is a double free."""

    def __init__(self, page_size: int, window: int, windowed_only: bool, num_pages: int = 2048):
        size = num_pages * page_size
        if windowed_only:
            self.inner = WindowedTokenPoolAllocator(size, page_size, window)
        else:
            slot_map = torch.zeros((num_pages + 1) * page_size, dtype=torch.int32)
            self.inner = SWATokenToKVPoolAllocator(size, size, page_size, window, slot_map)
        self.ps, self.windowed_only = page_size, windowed_only
        self.full_used: Set[int] = set()
        self.win_used: Set[int] = set()
        self.log: Set[Event] = set()

    def alloc(self, cur_len: int, last_slot: int, num_new: int) -> List[int]:
        slots = self.inner.alloc(cur_len, last_slot, num_new)
        pages = {s // self.ps for s in slots}
        self.full_used |= pages
        self.win_used |= pages
        return slots

    def free(self, slots: List[int]) -> None:
        for p in {s // self.ps for s in slots}:
            assert p in self.full_used, f"page {p} freed twice (token pool)"
            self.full_used.remove(p)
            self.log.add(("full", p))
            if p in self.win_used:
                self.win_used.remove(p)
                self.log.add(("win", p))
        self.inner.free(slots)

    def free_windowed(self, slots: List[int]) -> None:
        if self.windowed_only:
            return self.free(slots)
        for p in {s // self.ps for s in slots}:
            assert p in self.win_used, f"page {p} freed twice (windowed pool)"
            self.win_used.remove(p)
            self.log.add(("win", p))
        self.inner.free_windowed(slots)

    def take_log(self) -> Set[Event]:
        out, self.log = self.log, set()
        return out

    def check(self) -> None:
        if self.windowed_only:
            self.inner.check_integrity(len(self.full_used))
        else:
            self.inner.check_integrity(len(self.full_used), len(self.win_used))
            assert {p for p in self.full_used if self.inner.page_map[p] != 0} == self.win_used


class Page:
    def __init__(self, slots: List[int], windowed: bool):
        self.slots, self.windowed = slots, windowed
        self.lock = self.wlock = 0
        self.touched = (0, 0)


class Reference:
    def __init__(self, page_size: int, window: int, windowed_only: bool):
        self.ps, self.w, self.wo = page_size, window, windowed_only
        self.pages: Dict[Tuple[int, ...], Page] = {}
        self.events = 0
        self.freed: Set[Event] = set()

    # helpers ---------------------------------------------------------------
    def _is_leaf(self, k: Tuple[int, ...]) -> bool:
        return not any(len(o) == len(k) + self.ps and o[: len(k)] == k for o in self.pages)

    def _pool_events(self, page: Page, windowed: bool) -> Set[Event]:
        """Events of freeing page's slots from the token pool (free), given whether they still hold windowed K/V."""
        p = page.slots[0] // self.ps
        if self.wo:
            return {("full", p), ("win", p)} if windowed else set()
        return {("full", p), ("win", p)} if windowed else {("full", p)}

    def _delete(self, k: Tuple[int, ...]) -> Tuple[int, int]:
        page = self.pages.pop(k)
        self.freed |= self._pool_events(page, page.windowed)
        full = self.ps if (page.windowed or not self.wo) else 0
        return full, self.ps if page.windowed else 0

    def _cleanup(self) -> int:
        """Delete unlocked tombstone leaves until none is left; token-pool tokens freed."""
        freed = 0
        while True:
            dead = [k for k, p in self.pages.items() if not p.windowed and p.lock == 0 and self._is_leaf(k)]
            if not dead:
                return freed
            for k in dead:
                freed += self._delete(k)[0]

    def _window_pages(self, length: int) -> range:
        return range(max(0, length - self.w) // self.ps, length // self.ps)

    # operations -------------------------------------------------------------
    def match(self, key: List[int]) -> Tuple[int, List[int]]:
        ps, m = self.ps, 0
        while (m + 1) * ps <= len(key) and tuple(key[: (m + 1) * ps]) in self.pages:
            m += 1
        ks = [tuple(key[: (j + 1) * ps]) for j in range(m)]
        best = 0
        for j in range(1, m + 1):
            if all(self.pages[ks[i]].windowed for i in self._window_pages(j * ps)):
                best = j
        self.events += 1
        slots: List[int] = []
        for j in range(best):
            self.pages[ks[j]].touched = (self.events, j * ps)
            slots += self.pages[ks[j]].slots
        return best * ps, slots

    def lock(self, key: List[int], length: int) -> None:
        for j in range(length // self.ps):
            self.pages[tuple(key[: (j + 1) * self.ps])].lock += 1
        for j in self._window_pages(length):
            page = self.pages[tuple(key[: (j + 1) * self.ps])]
            assert page.windowed
            page.wlock += 1

    def release_window(self, key: List[int], length: int) -> None:
        for j in self._window_pages(length):
            self.pages[tuple(key[: (j + 1) * self.ps])].wlock -= 1

    def unlock(self, key: List[int], length: int, window_released: bool) -> None:
        if not window_released:
            self.release_window(key, length)
        for j in range(length // self.ps):
            self.pages[tuple(key[: (j + 1) * self.ps])].lock -= 1
        self._cleanup()

    def insert(self, key: List[int], value: List[int], windowed_from: int, borrowed: int) -> None:
        ps = self.ps
        self.events += 1
        for j in range(len(key) // ps):
            k, pos = tuple(key[: (j + 1) * ps]), j * ps
            incoming, live = value[pos : pos + ps], pos >= windowed_from
            page = self.pages.get(k)
            if pos < borrowed:
                assert page is not None
            elif page is None:
                page = self.pages[k] = Page(incoming if live or not self.wo else [0] * ps, live)
            elif live and not page.windowed and (self.wo or page.lock == 0):
                if not self.wo:
                    self.freed |= self._pool_events(page, False)
                page.slots, page.windowed = incoming, True
            else:
                self.freed |= self._pool_events(Page(incoming, live), live)
            page.touched = (self.events, pos)
        self._cleanup()

    def evict_step(self) -> Tuple[int, int]:
        """One step of full eviction: (token-pool tokens, windowed tokens) freed; (0, 0) if nothing can go."""
        cands = [k for k, p in self.pages.items() if p.lock == 0 and self._is_leaf(k)]
        if not cands:
            return 0, 0
        full, win = self._delete(min(cands, key=lambda k: self.pages[k].touched))
        return full + self._cleanup(), win

    def evict_windowed_step(self) -> Tuple[int, int]:
        cands = [k for k, p in self.pages.items() if p.windowed and p.wlock == 0]
        if not cands:
            return 0, 0
        k = min(cands, key=lambda k: self.pages[k].touched)
        page = self.pages[k]
        if page.lock == 0 and self._is_leaf(k):
            full, win = self._delete(k)
            return full + self._cleanup(), win
        self.freed |= self._pool_events(page, True) if self.wo else {("win", page.slots[0] // self.ps)}
        page.windowed = False
        if self.wo:
            page.slots = [0] * self.ps
        return (self.ps if self.wo else 0), self.ps

    def take_freed(self) -> Set[Event]:
        out, self.freed = self.freed, set()
        return out

    # observations -----------------------------------------------------------
    def sizes(self) -> Dict[str, int]:
        ps, pages = self.ps, self.pages.values()
        win_total = sum(ps for p in pages if p.windowed)
        win_prot = sum(ps for p in pages if p.wlock)
        full_total = win_total if self.wo else ps * len(self.pages)
        full_prot = win_prot if self.wo else sum(ps for p in pages if p.lock)
        return dict(total=full_total, protected=full_prot, evictable=full_total - full_prot, win_total=win_total,
                    win_protected=win_prot, win_evictable=win_total - win_prot)


def tree_pages(tree: SWARadixCache) -> Dict[Tuple[int, ...], Tuple]:
    """The tree flattened to the reference's page records."""
    out = {}
    for n in tree._iter_nodes():
        prefix, x = [], n
        while x.parent is not None:
            prefix = x.key + prefix
            x = x.parent
        base = len(prefix) - len(n.key)
        for j in range(0, len(n.key), tree.page_size):
            out[tuple(prefix[: base + j + tree.page_size])] = (
                n.value[j : j + tree.page_size], n.windowed, n.lock_ref, n.window_lock_ref)
    return out


def tree_sizes(tree: SWARadixCache) -> Dict[str, int]:
    return dict(total=tree.total_size(), protected=tree.protected_size(), evictable=tree.evictable_size(),
                win_total=tree.windowed_total_size(), win_protected=tree.windowed_protected_size(),
                win_evictable=tree.windowed_evictable_size())


class Harness:
    """One tree + its reference + the allocator; every operation is done on both and compared."""

    def __init__(self, page_size: int, window: int, windowed_only: bool):
        self.alloc = LoggingAllocator(page_size, window, windowed_only)
        self.tree = SWARadixCache(page_size, self.alloc, window)
        self.ref = Reference(page_size, window, windowed_only)
        self.ps, self.w, self.wo = page_size, window, windowed_only
        self.running: List[dict] = []

    def request(self, key: List[int], windowed_pages_freed: int = 0) -> dict:
        """Match + lock key; own pages for the rest; the first windowed_pages_freed of them freed on their own
        (what the scheduler does once the window has moved past them: at most those wholly below len - W + 1)."""
        ps = self.ps
        key = key[: len(key) // ps * ps]
        slots, node = self.tree.match_prefix(key)
        length, want = self.ref.match(key)
        assert (len(slots), slots) == (length, want), "match disagrees with the reference"
        self.tree.inc_lock_ref(node)
        self.ref.lock(key, length)
        own = self.alloc.alloc(length, slots[-1] if slots else 0, len(key) - length) if len(key) > length else []
        wf = length + ps * windowed_pages_freed
        assert wf <= max(length, (len(key) - self.w + 1) // ps * ps), "freed windowed pages the window still reads"
        self.alloc.free_windowed(own[: wf - length])
        self.alloc.take_log()
        r = dict(key=key, slots=slots + own, borrowed=length, wf=wf, node=node, released=False)
        self.running.append(r)
        self.compare()
        return r

    def match(self, key: List[int]) -> int:
        """A lookup that borrows nothing (touches the LRU order as a request's would)."""
        slots, _ = self.tree.match_prefix(key)
        assert (len(slots), slots) == self.ref.match(key), "match disagrees with the reference"
        return len(slots)

    def max_windowed_pages_freed(self, key: List[int]) -> int:
        length = len(self.ref_peek(key))
        aligned = len(key) // self.ps * self.ps
        return max(0, ((aligned - self.w + 1) // self.ps * self.ps - length) // self.ps)

    def ref_peek(self, key: List[int]) -> List[int]:
        """The reference's match of key without touching anything."""
        ps, m = self.ps, 0
        while (m + 1) * ps <= len(key) and tuple(key[: (m + 1) * ps]) in self.ref.pages:
            m += 1
        best = max([j for j in range(m + 1) if all(
            self.ref.pages[tuple(key[: (i + 1) * ps])].windowed for i in self.ref._window_pages(j * ps))])
        return key[: best * ps]

    def finish(self, r: dict) -> None:
        self.running.remove(r)
        self.tree.insert(r["key"], r["slots"], windowed_from=r["wf"], borrowed_len=r["borrowed"])
        self.ref.insert(r["key"], r["slots"], r["wf"], r["borrowed"])
        self.tree.dec_lock_ref(r["node"], window_released=r["released"])
        self.ref.unlock(r["key"], r["borrowed"], r["released"])
        assert self.alloc.take_log() == self.ref.take_freed(), "insert / unlock freed other pages than the reference"
        self.compare()

    def release(self, r: dict) -> None:
        self.tree.release_window(r["node"])
        self.ref.release_window(r["key"], r["borrowed"])
        r["released"] = True
        self.compare()

    def evict(self, n: int, windowed: bool) -> int:
        got = self.tree.evict_windowed(n) if windowed else self.tree.evict(n)
        impl = self.alloc.take_log()
        by_window = windowed or self.wo
        step = self.ref.evict_windowed_step if by_window else self.ref.evict_step
        want = 0
        # the tree evicts whole nodes, the reference page by page in the same LRU order: the tree's freed
        # pages must be exactly the reference's first k steps, and k must free >= n unless nothing is left
        while self.ref.freed != impl:
            assert self.ref.freed < impl, f"evicted {impl - self.ref.freed} ahead of the reference order"
            full, win = step()
            assert (full, win) != (0, 0), f"the tree freed pages the reference cannot: {impl - self.ref.freed}"
            want += win if by_window else full
        assert got == want
        self.ref.take_freed()
        if got < n:
            assert step() == (0, 0), "the tree stopped while the reference could still evict"
        self.compare()
        return got

    def compare(self) -> None:
        tree, ref, ps = self.tree, self.ref, self.ps
        tree.check_integrity()
        want = {k: (p.slots, p.windowed, p.lock, p.wlock) for k, p in ref.pages.items()}
        assert tree_pages(tree) == want
        assert tree_sizes(tree) == ref.sizes()
        full = {p.slots[0] // ps for p in ref.pages.values() if p.windowed or not ref.wo}
        win = {p.slots[0] // ps for p in ref.pages.values() if p.windowed}
        for r in self.running:
            own = r["slots"][r["borrowed"] :]
            live = own[r["wf"] - r["borrowed"] :]
            full |= {s // ps for s in (live if ref.wo else own)}
            win |= {s // ps for s in live}
        assert self.alloc.full_used == full
        assert self.alloc.win_used == (full if ref.wo else win)
        self.alloc.check()
