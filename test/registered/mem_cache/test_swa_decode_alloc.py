"""A decode step's allocation with a windowed pool (ReqMemory.alloc_decode: the page maps written once, through
SWATokenToKVPoolAllocator.deferred_maps) leaves every map, free list, request row and cached prefix exactly as
allocating request by request with the maps written at once does -- including a step where the windowed pool runs
short in the middle of the batch (the requests before it have their slots, the rest none) and steps that evict cached
prefixes (whole, or windowed pages only) in the middle of the batch."""

import random

import pytest
import torch

from sglang.srt.managers.req_memory import ReqMemory
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.mem_cache.swa_allocator import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.swa_pool import SWAKVPool
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=6, suite="cpu")

ROWS, MAX_LEN = 10, 96


def _memory(ps, size, wsize, window) -> ReqMemory:
    pool = SWAKVPool((False, True), size, wsize, ps, torch.float32, head_num=1, head_dim=2)
    alloc = SWATokenToKVPoolAllocator(size, wsize, ps, window, pool.slot_map)
    return ReqMemory(ReqToTokenPool(ROWS, MAX_LEN), alloc, RadixCache(ps, alloc.free), ps)  # the windowed cache


def _one_at_a_time(mem, reqs) -> bool:
    """The reference: ReqMemory.alloc per request (each page map written as it is allocated), stopping at the first
    that does not fit, as alloc_decode does."""
    return all(mem.alloc(r, 1) is not None for r in reqs)


def _snapshot(mem, reqs):
    a, ps = mem.allocator, mem.page_size
    # brute force: every token page's slot_map row names its windowed page's slots (0: none)
    expect = a.page_map[:, None] * ps + torch.arange(ps)
    expect[a.page_map == 0] = 0
    assert torch.equal(a.slot_map.view(-1, ps)[: a.num_pages + 1].long(), expect)
    rows = [(r.rid, r.alloc_len, mem.req_to_token_pool.read(r.req_pool_idx, 0, r.alloc_len)) for r in reqs]
    tree = mem.tree_cache
    return (a.page_map.tolist(), a.slot_map.tolist(), list(a.full.free_pages), list(a.windowed.free_pages), rows,
            tree.total_size(), tree.windowed_total_size(), sorted(tree.all_slots()))


def _run(seed, ps, step_fn):
    """A seeded schedule: prompts over shared prefixes, decode steps through step_fn, the window moving, finished
    requests cached, requests left without a slot cached and dropped. Returns each step's state and what the steps
    did (requests served before a short pool stopped the batch; steps that evicted cached pages)."""
    rng = random.Random(seed)
    window = rng.randint(2, 4) * ps
    size, wsize = rng.randint(20, 40) * ps, rng.randint(8, 20) * ps
    mem = _memory(ps, size, wsize, window)
    prefixes = [[rng.randint(1, 50) for _ in range(rng.randint(ps, 4 * ps))] for _ in range(3)]
    running, trace, next_id = [], [], 0
    events = dict.fromkeys(("windowed_short_mid_batch", "token_pool_short_mid_batch", "evicted",
                            "evicted_windowed_only"), 0)
    for _ in range(60):
        while len(running) < ROWS - 1 and rng.random() < 0.5:  # admit a prompt (prefill)
            r = Req(str(next_id), rng.choice(prefixes) + [rng.randint(1, 50) for _ in range(rng.randint(1, 6))],
                    SamplingParams(temperature=0.0, max_new_tokens=rng.randint(1, 20)))
            next_id += 1
            mem.admit(r, *mem.match_prefix(r))
            if mem.alloc(r, r.fill_len - r.kv_len) is None:
                mem.release(r, cache=False)
                break
            r.kv_len = r.fill_len
            r.append_token_id(rng.randint(1, 50))
            running.append(r)
        if not running:
            continue
        tree = mem.tree_cache
        before = (tree.total_size(), tree.windowed_total_size())
        ok = step_fn(mem, running)
        served = [r for r in running if r.alloc_len > r.kv_len]
        if not ok and 0 < len(served) < len(running):  # which pool stopped the batch
            a = mem.allocator
            events["windowed_short_mid_batch" if a.windowed.num_free_pages() < a.full.num_free_pages()
                   else "token_pool_short_mid_batch"] += 1
        events["evicted"] += tree.total_size() < before[0]
        events["evicted_windowed_only"] += tree.total_size() == before[0] and tree.windowed_total_size() < before[1]
        trace.append((ok, _snapshot(mem, running)))
        for r in running[len(served):]:  # no slot this step: back to the cache (what a retraction does)
            mem.release(r, cache=True)
        for r in served:  # the forward: the step's token has its KV, the next one is sampled
            r.kv_len = r.alloc_len
            r.append_token_id(rng.randint(1, 50))
        mem.free_out_of_window(served)
        for r in served:
            if r.finished():
                mem.release(r, cache=True)
        running = [r for r in served if not r.finished()]
        mem.check_integrity(running)
    return trace, events


@pytest.mark.parametrize("ps", [1, 4])
def test_batched_decode_alloc_equals_one_at_a_time(ps):
    totals = {}
    for seed in range(12):
        batched, events = _run(seed, ps, ReqMemory.alloc_decode)
        reference, _ = _run(seed, ps, _one_at_a_time)
        assert batched == reference, f"seed {seed}"
        for k, v in events.items():
            totals[k] = totals.get(k, 0) + v
    # the schedules reach the cases named in the module docstring
    assert all(v > 0 for v in totals.values()), totals


def test_readers_see_deferred_maps():
    """Inside deferred_maps, a free of a page allocated there frees its windowed page (free reads page_map)."""
    mem = _memory(1, 16, 8, 4)
    a = mem.allocator
    with a.deferred_maps():
        s = a.alloc(0, 0, 3)
        a.free_windowed(s[:1])
        assert a.windowed_available_size() == 6
        a.check_integrity(3, 2)
        a.free(s)
    assert a.windowed_available_size() == 8 and a.available_size() == 16
    assert not a.page_map.any() and not a.slot_map.any()
