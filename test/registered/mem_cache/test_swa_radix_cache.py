"""SWA radix cache (mem_cache/swa_radix_cache.py) against a brute-force reference.

The reference (swa_radix_reference.py) keeps one record per cached page, keyed by the whole token prefix up to that
page, with no tree, no splitting and no nodes. Random sequences of requests (match + lock + own pages + windowed
pages freed as the window moves), finishes (insert + unlock), early window releases and evictions must agree with
it on every match (length and slots), every freed page of each pool, every page's state and every size. The
allocator is the real one (swa_allocator.py) behind a wrapper that logs each page freed from each pool and refuses a
double free; its own integrity check runs after every step.
Scenario tests drive the same harness through the cases random sequences rarely reach.
"""

from typing import List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from swa_radix_reference import Harness, LoggingAllocator

from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="cpu")


def run_ops(data, page_size: int, window: int, windowed_only: bool, num_ops: int) -> None:
    h = Harness(page_size, window, windowed_only)
    keys: List[List[int]] = []
    for _ in range(num_ops):
        op = data.draw(st.sampled_from(["request", "request", "finish", "finish", "release", "evict", "evict_win"]))
        if op == "request":
            if keys and data.draw(st.booleans()):
                base = data.draw(st.sampled_from(keys))
                key = base[: data.draw(st.integers(0, len(base)))]
            else:
                key = []
            tail = st.lists(st.integers(0, 1), min_size=0 if key else 1, max_size=3 * window + 2 * page_size)
            key = key + data.draw(tail)
            if len(key) < page_size:
                continue
            wf_pages = data.draw(st.integers(0, h.max_windowed_pages_freed(key)))
            keys.append(key)
            h.request(key, wf_pages)
        elif op == "finish" and h.running:
            h.finish(data.draw(st.sampled_from(h.running)))
        elif op == "release":
            live = [r for r in h.running if not r["released"]]
            if live:
                h.release(data.draw(st.sampled_from(live)))
        elif op in ("evict", "evict_win"):
            h.evict(data.draw(st.integers(0, 4 * window)), windowed=op == "evict_win")


CASES = [(1, 3, False), (2, 5, False), (4, 8, False), (4, 3, False), (1, 4, True), (4, 8, True), (2, 6, True)]


@pytest.mark.parametrize("page_size,window,windowed_only", CASES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_swa_radix_agrees_with_page_reference(page_size, window, windowed_only, data):
    run_ops(data, page_size, window, windowed_only, num_ops=40)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])


def _key(n: int, seed: int) -> List[int]:
    return [(i * 7 + seed) % 5 for i in range(n)]


@pytest.mark.parametrize("windowed_only", [False, True])
def test_hit_needs_the_window_and_tombstones_revive(windowed_only):
    h = Harness(page_size=2, window=4, windowed_only=windowed_only)
    shared, x, y = _key(8, 0), [9] * 6, [8] * 6
    h.finish(h.request(shared + x))
    h.finish(h.request(shared + y))
    # two running requests borrow both paths: each window-locks only its last 4 tokens
    rx, ry = h.request(shared + x + [7, 7]), h.request(shared + y + [7, 7])
    assert (rx["borrowed"], ry["borrowed"]) == (14, 14) and h.tree.windowed_protected_size() == 8
    # oldest unpinned first: x's head [8, 10) (rx matched before ry), then the shared part, ancestors first
    assert h.evict(8, windowed=True) == 10
    assert h.tree.windowed_total_size() == 10 and h.tree.total_size() == (10 if windowed_only else 20)
    # the live run after the tombstone holds the window (6 >= 4): a hit of all 14; 2 live tokens are not enough
    assert len(h.tree.match_prefix(shared + x)[0]) == 14
    assert len(h.tree.match_prefix(shared + x[:2])[0]) == 0
    r2 = h.request(shared)  # no hit: computes the shared part itself, with its windowed K/V
    assert r2["borrowed"] == 0
    h.finish(r2)
    # windowed-only: a tombstone holds nothing, so it takes the request's pages whoever borrows the path;
    # full + windowed: rx and ry borrow the tombstone's token-pool slots, so they stay and r2's copy is freed
    assert len(h.tree.match_prefix(shared)[0]) == (8 if windowed_only else 0)
    h.finish(rx)
    h.finish(ry)
    if not windowed_only:
        h.finish(h.request(shared))  # unlocked now: revived with the new request's pages
        assert len(h.tree.match_prefix(shared)[0]) == 8


@pytest.mark.parametrize("windowed_only", [False, True])
def test_released_window_tombstones_a_locked_leaf_until_unlock(windowed_only):
    h = Harness(page_size=2, window=4, windowed_only=windowed_only)
    key = _key(12, 1)
    h.finish(h.request(key))
    r = h.request(key)  # a full hit: the leaf is locked, its last 4 tokens window-locked
    assert r["borrowed"] == 12 and h.tree.windowed_protected_size() == 4
    assert h.evict(100, windowed=True) == 8  # everything but the window
    h.release(r)  # the request's own tokens moved past the borrowed window
    assert h.evict(100, windowed=True) == 4  # the locked leaf becomes a tombstone
    assert h.tree.windowed_total_size() == 0 and h.tree.protected_size() == (0 if windowed_only else 12)
    h.finish(r)  # unlocked: a tombstone leaf can never end a hit, so it goes
    assert h.tree.total_size() == 0 and not h.tree.root.children


def test_windowed_eviction_takes_the_root_side_first():
    h = Harness(page_size=2, window=4, windowed_only=False)
    key = _key(16, 3)
    h.finish(h.request(key[:8]))
    h.finish(h.request(key))  # nodes [0, 4) [4, 8) [8, 16): the borrowed window split the first one at 4
    assert h.match(key) == 16  # one touch of the whole path: the ancestor is the older
    assert h.evict(2, windowed=True) == 4  # [0, 4) becomes a tombstone; the leaf stays
    assert h.match(key) == 16 and h.match(key[:8]) == 8 and h.match(key[:6]) == 0  # [4, 8) holds W = 4


def test_long_borrowed_prefix_pins_only_its_window():
    h = Harness(page_size=2, window=5, windowed_only=False)
    key = _key(32, 2)
    h.finish(h.request(key))
    r = h.request(key + [9, 9])
    # positions [32 - 5, 32) rounded down to a page: [26, 32)
    assert h.tree.windowed_protected_size() == 6 and h.tree.protected_size() == 32
    assert h.evict(100, windowed=True) == 26
    assert len(h.tree.match_prefix(key)[0]) == 32  # the window is still there: a hit
    assert len(h.tree.match_prefix(key[:30])[0]) == 0  # [25, 30) reaches into the tombstone
    h.finish(r)


def test_salts_do_not_share():
    alloc = LoggingAllocator(page_size=1, window=2, windowed_only=False)
    tree = SWARadixCache(1, alloc, 2)
    tree.insert([1, 2, 3], alloc.alloc(0, 0, 3), salt="a", windowed_from=0, borrowed_len=0)
    assert tree.match_prefix([1, 2, 3])[0] == [] and len(tree.match_prefix([1, 2, 3], salt="a")[0]) == 3
    assert tree.evict_windowed(3) == 3 and not tree.salt_roots
    tree.check_integrity()
