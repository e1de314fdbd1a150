"""Windowed KV pool and its allocator (mem_cache/swa_pool.py, swa_allocator.py) against a brute-force model of which
pages each request holds, and against the values written: a windowed page shared by two live positions would show
as a read-back mismatch."""

import random

import pytest
import torch

from sglang.srt.mem_cache.swa_allocator import SWATokenToKVPoolAllocator, WindowedTokenPoolAllocator
from sglang.srt.mem_cache.swa_pool import SWAKVPool
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="cpu")

LAYERS = (False, True, True, False, True)  # full, windowed, windowed, full, windowed


class Ref:
    """A request as the reference sees it: its slots by position and which of its pages still hold windowed K/V."""

    def __init__(self):
        self.slots, self.freed_pages = [], set()  # freed_pages: page indices (position // P) freed on their own


def _make(size, wsize, ps, window):
    pool = SWAKVPool(LAYERS, size, wsize, ps, torch.float32, head_num=1, head_dim=2)
    alloc = SWATokenToKVPoolAllocator(size, wsize, ps, window, pool.slot_map)
    return pool, alloc


def _value(rid, pos, layer):
    return float(rid * 10000 + pos * 10 + layer)


def _write(pool, rid, positions, slots):
    loc = torch.tensor(slots, dtype=torch.int64)
    for layer in range(len(LAYERS)):
        k = torch.tensor([[[_value(rid, p, layer)] * 2] for p in positions])
        pool.set_kv_buffer(layer, loc, k, -k)


def _check(pool, alloc, reqs, ps):
    held_w = 0
    for rid, r in reqs.items():
        n_pages = -(-len(r.slots) // ps)
        held_w += n_pages - len(r.freed_pages)
        live = [p for p in range(len(r.slots)) if p // ps not in r.freed_pages]
        for layer in range(len(LAYERS)):
            k, v = pool.gather_kv(layer, torch.tensor(r.slots, dtype=torch.int64), torch.float32)
            # every full layer keeps every position; a windowed layer the positions whose page was not freed
            keep = range(len(r.slots)) if not LAYERS[layer] else live
            for p in keep:
                assert k[p, 0, 0].item() == _value(rid, p, layer) and v[p, 0, 1].item() == -_value(rid, p, layer)
            if LAYERS[layer]:
                freed = [p for p in range(len(r.slots)) if p // ps in r.freed_pages]
                assert all(m == 0 for m in pool.windowed_slots(torch.tensor(r.slots)[freed]).tolist())
                assert (k[freed] == 0).all()  # the dummy page
    assert alloc.num_windowed_pages_in_use() == held_w
    alloc.check_integrity(sum(-(-len(r.slots) // ps) for r in reqs.values()), held_w)


@pytest.mark.parametrize("ps", [1, 4])
def test_random_requests_against_reference(ps):
    rng = random.Random(ps)
    window = 6
    size, wsize = 40 * ps, 12 * ps
    pool, alloc = _make(size, wsize, ps, window)
    reqs, next_id, refused = {}, 1, 0
    for step in range(400):
        op = rng.random()
        if op < 0.25 and len(reqs) < 6:
            rid, r = next_id, Ref()
            n = rng.randint(1, 3 * window)
            reqs[rid] = r
            next_id += 1
        elif reqs:
            rid = rng.choice(list(reqs))
            r = reqs[rid]
            if op > 0.9:  # finish
                alloc.free(r.slots)
                del reqs[rid]
                _check(pool, alloc, reqs, ps)
                continue
            n = rng.randint(1, 2 * window)
        else:
            continue
        cur = len(r.slots)
        need = -(-(cur + n) // ps) - -(-cur // ps)
        free_full = alloc.num_pages - sum(-(-len(x.slots) // ps) for x in reqs.values())
        free_win = wsize // ps - sum(-(-len(x.slots) // ps) - len(x.freed_pages) for x in reqs.values())
        got = alloc.alloc(cur, r.slots[-1] if r.slots else 0, n)
        if need > min(free_full, free_win):
            assert got is None
            refused += 1
            if not r.slots:
                del reqs[rid]
            _check(pool, alloc, reqs, ps)
            continue
        assert got is not None and len(got) == n
        _write(pool, rid, range(cur, cur + n), got)
        r.slots.extend(got)
        # the window moves: pages wholly below len - W + 1 lose their windowed page
        end_page = (len(r.slots) - window + 1) // ps
        gone = [q for q in range(max(end_page, 0)) if q not in r.freed_pages]
        if gone:
            alloc.free_windowed([r.slots[q * ps] for q in gone])
            r.freed_pages.update(gone)
        _check(pool, alloc, reqs, ps)
    assert refused > 0  # the small windowed pool did refuse some allocations
    for r in reqs.values():
        alloc.free(r.slots)
    _check(pool, alloc, {}, ps)
    assert alloc.available_size() == size and alloc.windowed_available_size() == wsize


def test_windowed_pool_short_allocates_nothing():
    pool, alloc = _make(32, 4, 2, 3)
    a = alloc.alloc(0, 0, 4)  # two pages of each pool
    assert alloc.alloc(0, 0, 6) is None  # three pages: the windowed pool has two left
    assert alloc.available_size() == 28 and alloc.windowed_available_size() == 0
    alloc.free_windowed(a[:1])
    assert alloc.windowed_available_size() == 2 and alloc.num_allocatable_pages() == 1
    assert alloc.alloc(4, a[-1], 2) is not None


def test_repair_rebuilds_both_free_lists():
    pool, alloc = _make(32, 16, 2, 3)
    a, b = alloc.alloc(0, 0, 4), alloc.alloc(0, 0, 3)
    alloc.free_windowed(a[:2])
    alloc.full.free_pages.append(a[0] // 2)  # a bookkeeping fault: a held page put on the free list twice
    with pytest.raises(AssertionError):
        alloc.check_integrity(4)
    alloc.rebuild_free_lists({s // 2 for s in a + b})
    alloc.check_integrity(4, 3)
    alloc.rebuild_free_lists({s // 2 for s in a})  # b was dropped: its windowed pages come back too
    alloc.check_integrity(2, 1)


def test_windowed_only_pool_is_the_token_pool():
    pool = SWAKVPool((True, True), 16, 16, 2, torch.float32, head_num=1, head_dim=2)
    assert pool.slot_map is None and pool.full_pool is None and pool.mem_usage_bytes() == 0
    alloc = WindowedTokenPoolAllocator(16, 2, window_tokens=4)
    s = alloc.alloc(0, 0, 5)
    loc = torch.tensor(s)
    assert torch.equal(pool.windowed_slots(loc), loc)
    k = torch.arange(5 * 2, dtype=torch.float32).view(5, 1, 2)
    pool.set_kv_buffer(1, loc, k, k)
    assert torch.equal(pool.gather_kv(1, loc, torch.float32)[0], k)
    alloc.free_windowed(s[:2])
    assert alloc.num_windowed_pages_in_use() == 2 and alloc.windowed_available_size() == 12
    with pytest.raises(ValueError, match="token pool"):
        SWAKVPool((True,), 16, 8, 2, torch.float32, 1, 2)


@pytest.mark.parametrize("kv_format", ["int4", "fp8_e4m3"])
def test_quantized_kv_with_windowed_layers_is_refused(kv_format):
    """The windowed pool keeps plain K/V: a quantized --kv-cache-dtype is refused at start, naming the flag and what
    to use instead."""
    from types import SimpleNamespace

    from sglang.srt.mem_plan.layer_pools import LayerPools
    from sglang.srt.model_executor.windowed_kv import windowed_kv_pool

    runner = SimpleNamespace(model_config=SimpleNamespace(kv_cache_dtype_name=kv_format))
    pools = LayerPools(full_layers=1, sliding_layers=3, window_tokens=16, windowed_cell_bytes=64)
    with pytest.raises(ValueError, match=f"--kv-cache-dtype {kv_format} .*1 full, 3 sliding.*--kv-cache-dtype auto"):
        windowed_kv_pool(runner, pools, 64, 32, cell=None)
