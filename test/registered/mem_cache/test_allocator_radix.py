"""Allocator and radix cache: page accounting, prefix matching, locking, LRU eviction, against a simple model."""

import random

import pytest

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")


@pytest.mark.parametrize("page_size", [1, 4])
def test_alloc_fills_last_page_then_new_pages(page_size):
    a = TokenToKVPoolAllocator(64, page_size)
    assert a.available_size() == 64
    s1 = a.alloc(0, 0, 5)
    assert len(s1) == 5 and 0 not in s1 and min(s1) >= page_size
    if page_size > 1:
        # tokens of one request are laid out page by page
        assert [s // page_size for s in s1] == [s1[0] // page_size] * 4 + [s1[4] // page_size]
        assert s1[:4] == list(range(s1[0], s1[0] + 4))
    s2 = a.alloc(5, s1[-1], 3)  # continues in the partly filled page first
    if page_size > 1:
        assert s2 == list(range(s1[-1] + 1, s1[-1] + 4))
    used_pages = len({s // page_size for s in s1 + s2})
    a.check_integrity(used_pages)
    a.free(s1 + s2)
    a.check_integrity(0)
    assert a.available_size() == 64


def test_alloc_refuses_without_side_effects():
    a = TokenToKVPoolAllocator(8, 2)
    assert a.alloc(0, 0, 9) is None
    assert a.available_size() == 8
    s = a.alloc(0, 0, 8)
    assert a.alloc(0, 0, 1) is None
    a.free(s)
    a.check_integrity(0)


def test_double_free_is_caught():
    a = TokenToKVPoolAllocator(8, 1)
    s = a.alloc(0, 0, 2)
    a.free(s)
    a.free(s[:1])
    with pytest.raises(AssertionError):
        a.check_integrity(0)


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_radix_match_insert_evict_against_model(page_size):
    rng = random.Random(page_size)
    a = TokenToKVPoolAllocator(4096, page_size)
    tree = RadixCache(page_size, a.free)
    cached = {}  # model: token tuple (page aligned) -> nothing; we check matches by brute force
    seqs = []
    for _ in range(60):
        if seqs and rng.random() < 0.5:
            base = rng.choice(seqs)
            seq = base[: rng.randint(0, len(base))] + [rng.randint(0, 9) for _ in range(rng.randint(1, 12))]
        else:
            seq = [rng.randint(0, 9) for _ in range(rng.randint(1, 20))]
        slots, node = tree.match_prefix(seq)
        # brute force: longest page-aligned prefix of seq equal to a prefix of some inserted sequence
        best = 0
        for s in seqs:
            n = 0
            while n < min(len(s), len(seq)) and s[n] == seq[n]:
                n += 1
            best = max(best, n // page_size * page_size)
        assert len(slots) == best
        tree.inc_lock_ref(node)
        aligned = len(seq) // page_size * page_size
        last = slots[-1] if slots else 0
        own = a.alloc(len(slots), last, aligned - len(slots))
        n_cached = tree.insert(seq[:aligned], slots + own)
        assert n_cached >= len(slots)
        a.free(own[: n_cached - len(slots)])
        tree.dec_lock_ref(node)
        seqs.append(seq[:aligned])
        tree.check_integrity()
        a.check_integrity(tree.total_size() // page_size)
    total = tree.total_size()
    assert tree.evictable_size() == total and tree.protected_size() == 0
    freed = tree.evict(total)
    assert freed == total and tree.total_size() == 0
    a.check_integrity(0)


def test_locked_prefix_is_not_evicted_and_lru_order():
    a = TokenToKVPoolAllocator(100, 1)
    tree = RadixCache(1, a.free)
    for seq in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        tree.insert(seq, a.alloc(0, 0, 3))
    slots, node = tree.match_prefix([1, 2, 3])  # touch [1,2,3]: most recently used
    tree.inc_lock_ref(node)
    assert tree.protected_size() == 3
    assert tree.evict(3) == 3  # evicts the least recently used leaf: [4,5,6]
    assert len(tree.match_prefix([4, 5, 6])[0]) == 0
    assert len(tree.match_prefix([7, 8, 9])[0]) == 3
    assert tree.evict(100) == 3  # only [7,8,9] is evictable
    assert len(tree.match_prefix([1, 2, 3])[0]) == 3
    tree.dec_lock_ref(node)
    assert tree.evict(100) == 3
    tree.check_integrity()
    a.check_integrity(0)


def test_split_keeps_locks():
    a = TokenToKVPoolAllocator(100, 1)
    tree = RadixCache(1, a.free)
    tree.insert([1, 2, 3, 4], a.alloc(0, 0, 4))
    _, node = tree.match_prefix([1, 2, 3, 4])
    tree.inc_lock_ref(node)
    slots, mid = tree.match_prefix([1, 2, 9])  # splits the edge after [1, 2]
    assert len(slots) == 2
    tree.check_integrity()
    assert tree.protected_size() == 4
    tree.dec_lock_ref(node)
    assert tree.evictable_size() == 4
    tree.check_integrity()


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
