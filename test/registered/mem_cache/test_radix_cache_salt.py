"""cache_salt namespaces of the radix cache: a prefix is shared only within one salt (None is its own namespace), and
matching, locking, splitting and LRU eviction keep the accounting exact across namespaces (checked against a brute
force model of what each namespace has cached)."""

import random

import pytest

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")

SALTS = [None, "a", "b", ""]  # "" is a salt like any other (the API refuses it; the cache need not care)


def _common_aligned(a, b, page_size):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n // page_size * page_size


@pytest.mark.parametrize("page_size", [1, 4])
def test_salted_match_insert_evict_against_model(page_size):
    rng = random.Random(7 + page_size)
    a = TokenToKVPoolAllocator(8192, page_size)
    tree = RadixCache(page_size, a.free)
    seqs = {s: [] for s in SALTS}  # the model: what each namespace has cached
    for step in range(120):
        salt = rng.choice(SALTS)
        pool = [q for qs in seqs.values() for q in qs]
        if pool and rng.random() < 0.6:  # often reuse another namespace's prefix: it must not match across salts
            base = rng.choice(pool)
            seq = base[: rng.randint(0, len(base))] + [rng.randint(0, 5) for _ in range(rng.randint(1, 10))]
        else:
            seq = [rng.randint(0, 5) for _ in range(rng.randint(1, 24))]
        slots, node = tree.match_prefix(seq, salt)
        best = max([_common_aligned(s, seq, page_size) for s in seqs[salt]], default=0)
        assert len(slots) == best, (step, salt)
        tree.inc_lock_ref(node)
        aligned = len(seq) // page_size * page_size
        own = a.alloc(len(slots), slots[-1] if slots else 0, aligned - len(slots))
        n_cached = tree.insert(seq[:aligned], slots + own, salt)
        a.free(own[: n_cached - len(slots)])
        tree.dec_lock_ref(node)
        if aligned:
            seqs[salt].append(seq[:aligned])
        tree.check_integrity()
        a.check_integrity(tree.total_size() // page_size)
        if step % 40 == 39:  # evict part of the cache: leaves go, so each cached sequence keeps a prefix
            tree.evict(tree.total_size() // 2)
            tree.check_integrity()
            a.check_integrity(tree.total_size() // page_size)
            for s in SALTS:
                seqs[s] = [q[: len(tree.match_prefix(q, s)[0])] for q in seqs[s]]
            assert sum(len(q) for qs in seqs.values() for q in qs) >= tree.total_size()
    total = tree.total_size()
    assert tree.evictable_size() == total and tree.protected_size() == 0
    assert tree.evict(total) == total and tree.total_size() == 0
    assert tree.salt_roots == {}  # an emptied namespace is dropped
    a.check_integrity(0)


def test_same_tokens_different_salts_are_separate_entries():
    a = TokenToKVPoolAllocator(100, 1)
    tree = RadixCache(1, a.free)
    key = [1, 2, 3, 4]
    v_none, v_a = a.alloc(0, 0, 4), a.alloc(0, 0, 4)
    assert tree.insert(key, v_none) == 0
    assert tree.insert(key, v_a, "a") == 0  # nothing of it counts as cached: the caller keeps all of v_a in the tree
    assert tree.total_size() == 8
    assert tree.match_prefix(key)[0] == v_none
    assert tree.match_prefix(key, "a")[0] == v_a
    slots, node = tree.match_prefix(key, "b")
    assert slots == [] and node is tree.root
    # a lock inside a namespace protects exactly that namespace's path
    slots, node = tree.match_prefix(key, "a")
    tree.inc_lock_ref(node)
    assert tree.protected_size() == 4 and tree.evictable_size() == 4
    assert tree.evict(100) == 4  # only the unsalted copy goes
    assert tree.match_prefix(key)[0] == [] and tree.match_prefix(key, "a")[0] == v_a
    tree.dec_lock_ref(node)
    assert tree.evict(100) == 4 and tree.salt_roots == {}
    tree.check_integrity()
    a.check_integrity(0)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
