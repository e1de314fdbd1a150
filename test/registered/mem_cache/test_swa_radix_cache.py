"""SWA radix cache (mem_cache/swa_radix_cache.py) against a brute-force reference.

The reference keeps one record per cached page, keyed by the whole token prefix up to that page: its slots,
whether it holds windowed K/V, its two lock counts and its last touch (event, position). Matching, locking,
insertion and eviction are written over pages with no tree, no splitting and no nodes. Random sequences of
requests (match + lock + own pages + windowed pages freed as the window moves), finishes (insert + unlock),
early window releases and evictions must agree with it on every match (length and slots), every freed page of
each pool, every page's state and every size. The allocator is a fake that logs each page freed from each pool
and refuses a double free.
"""

from typing import Dict, List, Set, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")

Event = Tuple[str, int]  # ("full" | "win", token-pool page)


class FakeAllocator:
    """Token pool + a page-parallel windowed pool (windowed_only: one pool). Logs every page freed per pool."""

    def __init__(self, page_size: int, windowed_only: bool, num_pages: int = 4096):
        self.ps, self.windowed_only = page_size, windowed_only
        self.inner = TokenToKVPoolAllocator(num_pages * page_size, page_size)
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

    def take_log(self) -> Set[Event]:
        out, self.log = self.log, set()
        return out


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


def compare(tree, ref, alloc, running) -> None:
    tree.check_integrity()
    want = {k: (p.slots, p.windowed, p.lock, p.wlock) for k, p in ref.pages.items()}
    assert tree_pages(tree) == want
    assert tree_sizes(tree) == ref.sizes()
    ps = ref.ps
    full = {p.slots[0] // ps for p in ref.pages.values() if p.windowed or not ref.wo}
    win = {p.slots[0] // ps for p in ref.pages.values() if p.windowed}
    for r in running:
        own = r["slots"][r["borrowed"] :]
        full |= {s // ps for s in (own[r["wf"] - r["borrowed"] :] if ref.wo else own)}
        win |= {s // ps for s in own[r["wf"] - r["borrowed"] :]}
    assert alloc.full_used == full
    assert alloc.win_used == (full if ref.wo else win)


def run_ops(data, page_size: int, window: int, windowed_only: bool, num_ops: int) -> None:
    alloc = FakeAllocator(page_size, windowed_only)
    tree = SWARadixCache(page_size, alloc, window, windowed_only)
    ref = Reference(page_size, window, windowed_only)
    keys: List[List[int]] = []
    running: List[dict] = []
    ps = page_size
    for _ in range(num_ops):
        op = data.draw(st.sampled_from(["request", "request", "finish", "finish", "release", "evict", "evict_win"]))
        if op == "request":
            if keys and data.draw(st.booleans()):
                base = data.draw(st.sampled_from(keys))
                key = base[: data.draw(st.integers(0, len(base)))]
            else:
                key = []
            key = key + data.draw(st.lists(st.integers(0, 1), min_size=1, max_size=3 * window + 2 * ps))
            aligned = len(key) // ps * ps
            key = key[:aligned]
            slots, node = tree.match_prefix(key)
            length, want = ref.match(key)
            assert (len(slots), slots) == (length, want), "match disagrees with the reference"
            tree.inc_lock_ref(node)
            ref.lock(key, length)
            own = alloc.alloc(length, slots[-1] if slots else 0, aligned - length) if aligned > length else []
            # the scheduler frees the request's own windowed pages wholly below seq_len - W + 1
            top = max(length, (aligned - window + 1) // ps * ps)
            wf = length + ps * data.draw(st.integers(0, (top - length) // ps))
            alloc.free_windowed(own[: wf - length])
            alloc.take_log()
            keys.append(key)
            running.append(dict(key=key, slots=slots + own, borrowed=length, wf=wf, node=node, released=False))
        elif op == "finish" and running:
            r = running.pop(data.draw(st.integers(0, len(running) - 1)))
            tree.insert(r["key"], r["slots"], windowed_from=r["wf"], borrowed_len=r["borrowed"])
            ref.insert(r["key"], r["slots"], r["wf"], r["borrowed"])
            tree.dec_lock_ref(r["node"], window_released=r["released"])
            ref.unlock(r["key"], r["borrowed"], r["released"])
            assert alloc.take_log() == ref.take_freed(), "insert / unlock freed other pages than the reference"
        elif op == "release":
            live = [r for r in running if not r["released"]]
            if live:
                r = data.draw(st.sampled_from(live))
                tree.release_window(r["node"])
                ref.release_window(r["key"], r["borrowed"])
                r["released"] = True
        elif op in ("evict", "evict_win"):
            n = data.draw(st.integers(0, 4 * window))
            got = tree.evict(n) if op == "evict" else tree.evict_windowed(n)
            impl = alloc.take_log()
            step = ref.evict_windowed_step if (op == "evict_win" or windowed_only) else ref.evict_step
            want_n = 0
            # the tree evicts whole nodes, the reference page by page in the same LRU order: the tree's freed
            # pages must be exactly the reference's first k steps, and k must free >= n unless nothing is left
            while ref.freed != impl:
                assert ref.freed < impl, f"evicted {impl - ref.freed} ahead of the reference order"
                full, win = step()
                assert (full, win) != (0, 0), f"the tree freed pages the reference cannot: {impl - ref.freed}"
                want_n += win if (op == "evict_win" or windowed_only) else full
            assert got == want_n
            ref.take_freed()
            if got < n:
                assert step() == (0, 0), "the tree stopped while the reference could still evict"
        compare(tree, ref, alloc, running)


CASES = [(1, 3, False), (2, 5, False), (4, 8, False), (4, 3, False), (1, 4, True), (4, 8, True), (2, 6, True)]


@pytest.mark.parametrize("page_size,window,windowed_only", CASES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_swa_radix_agrees_with_page_reference(page_size, window, windowed_only, data):
    run_ops(data, page_size, window, windowed_only, num_ops=40)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
