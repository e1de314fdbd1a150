"""Slots of speculative proposals (managers/req_memory.py): alloc_if_free takes free pages only -- the most that fit,
never evicting the prefix cache -- and truncate gives back exactly the pages wholly past the kept tokens (page-aware:
the page holding the last kept token stays), leaving alloc_len at the kept length; the pool's integrity invariant
(free + owned + cached == total) holds after every call, checked against a count made here from the slots."""

import pytest

from sglang.srt.managers.req_memory import ReqMemory
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="cpu")


def setup(page_size, pool_tokens, cache=False):
    alloc = TokenToKVPoolAllocator(pool_tokens, page_size)
    tree = RadixCache(page_size, alloc.free) if cache else None
    mem = ReqMemory(ReqToTokenPool(4, 64), alloc, tree, page_size)
    req = Req("r", list(range(1, 11)), SamplingParams.from_dict({"max_new_tokens": 8}))
    mem.admit(req, [], None)
    return mem, req


def owned_pages(mem, req):
    slots = mem.req_to_token_pool.read(req.req_pool_idx, 0, req.alloc_len)
    return {s // mem.page_size for s in slots}


@pytest.mark.parametrize("page_size", [1, 4])
def test_truncate_frees_whole_pages_past_the_kept_tokens(page_size):
    mem, req = setup(page_size, 64)
    assert mem.alloc(req, 10) is not None
    req.kv_len = 9  # decode slot at position 9
    assert mem.alloc_if_free(req, 7) == 7  # proposals at 10..16
    assert req.alloc_len == 17
    free_before = mem.allocator.available_size()
    for kept in (13, 12, 10):  # kv_len after committing 4, 3, 1 tokens
        req.kv_len = kept
        before = owned_pages(mem, req)
        mem.truncate(req)
        assert req.alloc_len == kept
        after = owned_pages(mem, req)
        assert after == {s // page_size for s in mem.req_to_token_pool.read(req.req_pool_idx, 0, kept)}
        assert mem.allocator.available_size() == free_before + (len(before) - len(after)) * page_size
        free_before = mem.allocator.available_size()
        mem.check_integrity([req])


@pytest.mark.parametrize("page_size", [1, 4])
def test_alloc_if_free_takes_what_fits_and_never_evicts(page_size):
    mem, req = setup(page_size, 16, cache=True)
    other = Req("o", [50 + i for i in range(8)], SamplingParams.from_dict({"max_new_tokens": 1}))
    mem.admit(other, [], None)
    assert mem.alloc(other, 8) is not None
    other.kv_len = 8
    mem.release(other, cache=True)  # 8 tokens now sit in the prefix cache, evictable
    assert mem.tree_cache.total_size() == 8
    assert mem.alloc(req, 4) is not None
    req.kv_len = 3
    got = mem.alloc_if_free(req, 7)  # 4 tokens are free (16 - 8 cached - 4): only they are taken
    assert got == 4 and req.alloc_len == 8
    assert mem.tree_cache.total_size() == 8  # nothing evicted
    assert mem.alloc_if_free(req, 3) == 0 and req.alloc_len == 8
    mem.check_integrity([req])
    req.kv_len = 4
    mem.truncate(req)
    assert req.alloc_len == 4 and mem.allocator.available_size() == 4
    mem.check_integrity([req])
