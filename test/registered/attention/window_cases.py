"""Windowed / sink / capped attention layers run through an attention backend over a pool with a windowed part,
against a brute-force fp64 reference (HF transformers' semantics, written here independently of the backends).
Not a test file (run_suite collects test_*.py only).

FakeWindowedPool keeps the contract of windowed_design (mem_cache/memory_pool.py KVCache): its windowed layers'
K/V live in their own buffer, indexed by a map token-pool slot -> windowed slot that is a random permutation (not
the identity); positions a request no longer needs (below seq_len - W + 1 after a forward) are "freed" by mapping
their slots to a row of NaN, so a backend that reads one position too far back produces NaN. A windowed-only pool
(windowed_only=True, Mistral's shape) has no map: every layer lives in the token pool, and the freed positions'
req_to_token entries are overwritten with the NaN row's slot (stale entries a backend must never read).

    python window_cases.py <backend>    -> one JSON line {case: max abs error} (run under TRITON_INTERPRET=1 for
                                           triton: test_window_attention.py starts it so)
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Dict, List, Sequence

import torch

from sglang.srt.layers.attention.attention_registry import create_attention_backend
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.swa_allocator import SWATokenToKVPoolAllocator, WindowedTokenPoolAllocator
from sglang.srt.mem_cache.swa_pool import SWAKVPool
from sglang.srt.mem_plan.backends import AttentionShape, BackendInputs
from sglang.srt.mem_plan.sizes import req_to_token_row_len
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.server_args import ServerArgs

RESULT_PREFIX = "RESULT_JSON:"
POOL_TOKENS = 512
WINDOW = 5  # the windowed pool's layers' window (what the fake pool frees by)
SWA_WINDOWED_TOKENS = 96  # the real pool's windowed part: 3 requests x (W + a chunk + a page), pages reused

# (window, lives in the windowed pool, sinks, logit cap): gpt-oss's full layer with sinks and its windowed one,
# a capped windowed layer (Gemma 2), a window as long as the context priced full (Ministral: full pool, still masked)
HYBRID_LAYERS = [(0, False, True, 0.0), (WINDOW, True, True, 0.0), (WINDOW, True, False, 1.5), (6, False, False, 0.0)]
WINDOWED_ONLY_LAYERS = [(WINDOW, True, False, 0.0), (WINDOW, True, True, 0.0)]


class FakeWindowedPool(MHATokenToKVPool):
    def __init__(self, page_size: int, dtype, num_kv_heads: int, head_dim: int, windowed_layers: Sequence[int],
                 num_layers: int, windowed_only: bool, seed: int = 0):
        # one extra page past what the allocator hands out holds the NaN row freed positions point at
        super().__init__(POOL_TOKENS + page_size, page_size, dtype, num_kv_heads, head_dim, num_layers)
        self.nan_slot = POOL_TOKENS + page_size
        self.windowed_layer_ids, self.windowed_only = set(windowed_layers), windowed_only
        self.k_buffer[:, self.nan_slot] = float("nan")
        self.v_buffer[:, self.nan_slot] = float("nan")
        rows = self.k_buffer.shape[1]
        if not windowed_only:
            self.wk, self.wv = torch.full_like(self.k_buffer, float("nan")), torch.full_like(self.v_buffer, float("nan"))
            self.wk[:, :page_size] = 0
            self.wv[:, :page_size] = 0
            # page-parallel, as swa_pool.SWAKVPool's: token page p -> windowed page perm[p], offsets kept
            g = torch.Generator().manual_seed(seed)
            pages = rows // page_size
            perm = torch.cat([torch.tensor([0]), torch.randperm(pages - 2, generator=g) + 1, torch.tensor([pages - 1])])
            offs = torch.arange(rows) % page_size
            self.slot_map = (perm[torch.arange(rows) // page_size] * page_size + offs).to(torch.int32)
            assert not torch.equal(self.slot_map, torch.arange(rows, dtype=torch.int32))

    def is_windowed_layer(self, layer_id: int) -> bool:
        return layer_id in self.windowed_layer_ids

    def windowed_slots(self, slots: torch.Tensor) -> torch.Tensor:
        return slots if self.windowed_only else self.slot_map[slots.long()].to(slots.dtype)

    def _own(self, layer_id: int) -> bool:
        return not self.windowed_only and self.is_windowed_layer(layer_id)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.wk[layer_id] if self._own(layer_id) else super().get_key_buffer(layer_id)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.wv[layer_id] if self._own(layer_id) else super().get_value_buffer(layer_id)

    def set_kv_buffer(self, layer_id, loc, k, v) -> None:
        if not self._own(layer_id):
            return super().set_kv_buffer(layer_id, loc, k, v)
        w = self.windowed_slots(loc).long()
        self.wk[layer_id].index_copy_(0, w, k.to(self.dtype))
        self.wv[layer_id].index_copy_(0, w, v.to(self.dtype))

    def gather_kv(self, layer_id, index, dtype, rotated: bool = False):
        index = self.windowed_slots(index).long() if self._own(layer_id) else index
        k, v = self.get_key_buffer(layer_id).index_select(0, index), self.get_value_buffer(layer_id).index_select(0, index)
        return k.to(dtype), v.to(dtype)

    def free_below(self, r2t: ReqToTokenPool, row: int, end: int) -> None:
        """The pages of request row wholly below position `end` no longer hold windowed K/V (as the scheduler frees
        them: a request's position i sits at offset i % page_size of its page)."""
        end = end // self.page_size * self.page_size
        if end <= 0:
            return
        if self.windowed_only:
            r2t.req_to_token[row, :end] = self.nan_slot
        else:
            self.slot_map[r2t.req_to_token[row, :end].long()] = self.nan_slot


def reference(q, hist_k, hist_v, q_pos: int, window: int, scale: float, sinks, cap: float) -> torch.Tensor:
    """fp64 attention of one token's query q [H, D] at position q_pos over its request's keys: positions
    max(0, q_pos - W + 1) .. q_pos (all of 0 .. q_pos without a window); out = sum_j e^{s_j} v_j / (e^{sink} +
    sum_j e^{s_j}) per head, s_j = cap * tanh(q.k_j * scale / cap) with a cap."""
    num_heads, num_kv = q.shape[0], hist_k.shape[1]
    group = num_heads // num_kv
    lo = max(0, q_pos - window + 1) if window > 0 else 0
    k = hist_k[lo : q_pos + 1].double().repeat_interleave(group, 1)  # [L, H, D]
    v = hist_v[lo : q_pos + 1].double().repeat_interleave(group, 1)
    s = (k * q.double()[None]).sum(-1).T * scale  # [H, L]
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    m = s.max(-1).values
    if sinks is not None:
        m = torch.maximum(m, sinks.double())
    w = torch.exp(s - m[:, None])
    den = w.sum(-1) + (torch.exp(sinks.double() - m) if sinks is not None else 0.0)
    return ((w / den[:, None]).T[:, :, None] * v).sum(0)  # [H, Dv]


class WindowScenario:
    """Requests grown step by step through real allocator pages; every step runs the backend and compares each
    layer's output with the reference, then frees what the window left behind."""

    def __init__(self, backend: str, layers, windowed_only: bool, page_size: int, dtype=torch.float32,
                 num_q_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 16, num_reqs: int = 4, seed: int = 0,
                 num_wrappers: int = 1, graph_bs: int = 0, real_pool: bool = False):
        """real_pool: mem_cache/swa_pool.SWAKVPool and its allocators (swa_allocator.py) instead of the fake pool, with
        a windowed pool of SWA_WINDOWED_TOKENS so freed windowed pages are handed out again."""
        self.gen = torch.Generator().manual_seed(seed)
        self.dtype, self.h, self.kv, self.d = dtype, num_q_heads, num_kv_heads, head_dim
        self.r2t = ReqToTokenPool(num_reqs, req_to_token_row_len(256), "cpu")
        windowed = [i for i, (_, in_windowed, _, _) in enumerate(layers) if in_windowed]
        self.real_pool, self.freed = real_pool, {}  # real pool, windowed-only: request row -> positions freed
        if real_pool:
            flags = [i in windowed for i in range(len(layers))]
            w_size = POOL_TOKENS if windowed_only else SWA_WINDOWED_TOKENS
            self.pool = SWAKVPool(flags, POOL_TOKENS, w_size, page_size, dtype, num_kv_heads, head_dim)
            self.allocator = (WindowedTokenPoolAllocator(POOL_TOKENS, page_size, WINDOW) if windowed_only else
                              SWATokenToKVPoolAllocator(POOL_TOKENS, w_size, page_size, WINDOW, self.pool.slot_map))
        else:
            self.pool = FakeWindowedPool(page_size, dtype, num_kv_heads, head_dim, windowed, len(layers), windowed_only)
            self.allocator = TokenToKVPoolAllocator(POOL_TOKENS, page_size)
        shape = AttentionShape(num_q_heads, head_dim, 256, num_kv_heads=num_kv_heads, model_dtype_bytes=dtype.itemsize,
                               kv_dtype_bytes=dtype.itemsize, num_kv_splits=ServerArgs.triton_attention_num_kv_splits,
                               num_wrappers=num_wrappers)
        common = dict(model_config=SimpleNamespace(dtype=dtype), req_to_token_pool=self.r2t, token_to_kv_pool=self.pool,
                      device="cpu")
        self.backend_inputs = BackendInputs(shape, num_reqs, graph_bs)
        inputs = self.backend_inputs if backend != "torch_native" else None
        self.backend = create_attention_backend(backend, inputs=inputs, **common)
        self.layers = [SimpleNamespace(layer_id=i, scaling=head_dim ** -0.5, v_head_dim=head_dim, sliding_window_size=w or -1,
                                       sinks=(torch.randn(num_q_heads, generator=self.gen) * 2 if s else None),
                                       logit_cap=cap) for i, (w, _, s, cap) in enumerate(layers)]
        self.lens: Dict[int, int] = {}
        self.hist: Dict[tuple, List[torch.Tensor]] = {}  # (layer, row) -> [k rows], [v rows] by position

    def new_request(self) -> int:
        row = self.r2t.alloc()
        self.lens[row] = 0
        for i in range(len(self.layers)):
            self.hist[(i, row)] = [[], []]
        return row

    def step(self, rows: Sequence[int], new_lens: Sequence[int]) -> float:
        """One forward; the largest abs error of any layer's output against the reference."""
        prefix = [self.lens[r] for r in rows]
        locs: List[int] = []
        for row, p, n in zip(rows, prefix, new_lens):
            last = int(self.r2t.req_to_token[row, p - 1]) if p else 0
            slots = self.allocator.alloc(p, last, n)
            self.r2t.req_to_token[row, p : p + n] = torch.tensor(slots)
            locs += slots
            self.lens[row] = p + n
        seq = [p + n for p, n in zip(prefix, new_lens)]
        decode = all(n == 1 for n in new_lens) and all(p > 0 for p in prefix)
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND, batch_size=len(rows),
            input_ids=torch.zeros(len(locs), dtype=torch.int64),
            positions=torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq)]),
            req_pool_indices=torch.tensor(list(rows)), seq_lens=torch.tensor(seq), out_cache_loc=torch.tensor(locs),
            seq_lens_cpu=seq, extend_prefix_lens_cpu=[] if decode else prefix,
            extend_seq_lens_cpu=[] if decode else list(new_lens),
            extend_prefix_lens=None if decode else torch.tensor(prefix),
            extend_seq_lens=None if decode else torch.tensor(list(new_lens)),
            req_to_token_pool=self.r2t, token_to_kv_pool=self.pool, attn_backend=self.backend)
        self.backend.init_forward_metadata(fb)
        n_tok, err = len(locs), 0.0
        for layer in self.layers:
            q = (torch.randn(n_tok, self.h, self.d, generator=self.gen) * 3).to(self.dtype)  # scores the cap bites
            k = torch.randn(n_tok, self.kv, self.d, generator=self.gen).to(self.dtype)
            v = torch.randn(n_tok, self.kv, self.d, generator=self.gen).to(self.dtype)
            out = self.backend.forward(q, k, v, layer, fb).view(n_tok, self.h, self.d)
            t = 0
            for row, p, n in zip(rows, prefix, new_lens):
                hk, hv = self.hist[(layer.layer_id, row)]
                hk.extend(k[t : t + n]), hv.extend(v[t : t + n])
                for i in range(n):
                    want = reference(q[t + i], torch.stack(hk), torch.stack(hv), p + i, max(layer.sliding_window_size, 0),
                                     layer.scaling, layer.sinks, layer.logit_cap)
                    err = max(err, float((out[t + i].double() - want).abs().max()))  # NaN: max() keeps it only if first
                    if not bool(torch.isfinite(out[t + i]).all()):
                        err = float("inf")
                t += n
        for row, s in zip(rows, seq):  # the scheduler frees windowed pages below the next forward's window
            self.free_below(row, s - WINDOW + 1)
        return err

    def free_below(self, row: int, end: int) -> None:
        if not self.real_pool:
            return self.pool.free_below(self.r2t, row, end)
        end = end // self.pool.page_size * self.pool.page_size  # whole pages below the window only
        if self.pool.windowed_only:  # the token pool is the windowed pool: its slots go back for others to take
            start = self.freed.get(row, 0)
            if end > start:
                self.allocator.free(self.r2t.req_to_token[row, start:end].tolist())
                self.freed[row] = end
        elif end > 0:
            self.allocator.free_windowed(self.r2t.req_to_token[row, :end].tolist())


def run_scenario(backend: str, layers, windowed_only: bool, page_size: int, **kw) -> float:
    """Prompts 3x the window, chunked prefill across the window edge, a later turn on a cached prefix, decode of a
    mixed batch: the largest error over every step."""
    sc = WindowScenario(backend, layers, windowed_only, page_size, **kw)
    a, b, c = sc.new_request(), sc.new_request(), sc.new_request()
    errs = [sc.step([a, b], [15, 3]),  # no cached prefix; a is 3 windows long
            sc.step([a, b, c], [7, 9, 2]),  # chunked prefill: the chunk starts inside the window of its prefix
            sc.step([c], [13])]
    for _ in range(6):
        errs.append(sc.step([a, b, c], [1, 1, 1]))
    errs.append(sc.step([b, a], [4, 1]))  # a new turn on b's cached prefix beside a's decode token
    return max(errs)


def all_cases(backend: str, **kw) -> Dict[str, float]:
    out = {}
    for page_size in (1, 4):
        out[f"hybrid|page{page_size}"] = run_scenario(backend, HYBRID_LAYERS, False, page_size, **kw)
        out[f"windowed_only|page{page_size}"] = run_scenario(backend, WINDOWED_ONLY_LAYERS, True, page_size, **kw)
    out["swa_pool|hybrid"] = run_scenario(backend, HYBRID_LAYERS, False, 4, real_pool=True, **kw)
    out["swa_pool|windowed_only"] = run_scenario(backend, WINDOWED_ONLY_LAYERS, True, 4, real_pool=True, **kw)
    return out


def make_windowed_flashinfer():
    """The stand-in flashinfer (sglang.test.attention_standins) whose wrappers also honour window_left and sinks, as
    flashinfer documents them: with kv length L and q length n, query i sits at kv index L - n + i and sees kv indices
    j with L - n + i - window_left <= j <= L - n + i; sinks[h] joins each softmax's denominator. Computed in fp64 from
    the page table the backend planned."""
    from sglang.test.attention_standins import make_flashinfer

    fi = make_flashinfer()

    def paged(q, cache, qo_indptr, kv_indptr, kv_indices, last_page_len, sm_scale, window_left, sinks):
        k_cache, v_cache = cache
        page, num_kv = k_cache.shape[1], k_cache.shape[2]
        group = q.shape[1] // num_kv
        out = torch.empty(q.shape[0], q.shape[1], v_cache.shape[3], dtype=q.dtype)
        for b in range(len(kv_indptr) - 1):
            pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
            n_kv = (len(pages) - 1) * page + int(last_page_len[b])
            k = k_cache[pages].reshape(-1, num_kv, k_cache.shape[3])[:n_kv].double().repeat_interleave(group, 1)
            v = v_cache[pages].reshape(-1, num_kv, v_cache.shape[3])[:n_kv].double().repeat_interleave(group, 1)
            q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
            i = torch.arange(n_kv - (q1 - q0), n_kv)[:, None]
            j = torch.arange(n_kv)[None, :]
            seen = (j <= i) & ((j >= i - window_left) if window_left >= 0 else True)
            s = torch.einsum("nhd,lhd->hnl", q[q0:q1].double(), k) * sm_scale
            s = s.masked_fill(~seen[None], float("-inf"))
            if sinks is not None:
                s = torch.cat([s, sinks.double()[:, None, None].expand(-1, q1 - q0, 1)], -1)
            p = s.softmax(-1)[..., :n_kv]
            out[q0:q1] = torch.einsum("hnl,lhd->nhd", p, v).to(q.dtype)
        return out

    class Prefill(fi.BatchPrefillWithPagedKVCacheWrapper):
        def plan(self, *args, window_left=-1, logits_soft_cap=None, **kw):
            assert not logits_soft_cap
            self._window_left = window_left
            return super().plan(*args, window_left=window_left, **kw)

        def run(self, q, paged_kv_cache, *args, sinks=None, **kw):
            super().run(q, paged_kv_cache, *args, **kw)  # the stand-in's checks and call log
            return paged(q, paged_kv_cache, self._qo_indptr, *self._kv, self._sm_scale, self._window_left, sinks)

    class Decode(fi.BatchDecodeWithPagedKVCacheWrapper):
        def plan(self, *args, window_left=-1, logits_soft_cap=None, **kw):
            assert not logits_soft_cap
            self._window_left = window_left
            return super().plan(*args, window_left=window_left, **kw)

        def run(self, q, paged_kv_cache, *args, sinks=None, **kw):
            super().run(q, paged_kv_cache, *args, **kw)
            return paged(q, paged_kv_cache, torch.arange(q.shape[0] + 1), self._paged_kv_indptr_buf,
                         self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf, self._sm_scale,
                         self._window_left, sinks)

    fi.BatchPrefillWithPagedKVCacheWrapper, fi.BatchDecodeWithPagedKVCacheWrapper = Prefill, Decode
    return fi


def windowed_page_id_mismatches() -> int:
    """triton_ops.page_ids over a windowed table (each request from its first page, pages named through a
    page-parallel slot map) against the ids written out here; the count of wrong entries."""
    from sglang.srt.layers.attention.triton_ops.page_ids import page_ids_fwd

    page, rows, width = 4, 3, 64
    g = torch.Generator().manual_seed(1)
    pages = torch.randperm(200, generator=g)[: rows * width // page].view(rows, -1) + 1
    r2t = (pages.repeat_interleave(page, 1) * page + torch.arange(width) % page).to(torch.int64)
    perm = torch.randperm(256, generator=g)
    slot_map = (perm[torch.arange(256 * page) // page] * page + torch.arange(256 * page) % page).to(torch.int32)
    req, first, n = torch.tensor([2, 0, 1]), [3, 0, 7], [5, 2, 9]
    indptr = torch.tensor([0, 5, 7, 16], dtype=torch.int32)
    out = torch.full((16,), -1, dtype=torch.int32)
    page_ids_fwd(r2t, req, indptr, page, out, torch.tensor(first), slot_map)
    want = [int(perm[int(pages[r, f + j])]) for r, f, c in zip(req.tolist(), first, n) for j in range(c)]
    return sum(int(a) != b for a, b in zip(out.tolist(), want))


if __name__ == "__main__":
    if sys.argv[1] == "triton":
        from sglang.srt.layers.attention.triton_ops.interpreter_blas import use_single_threaded_blas

        use_single_threaded_blas()
    result = all_cases(sys.argv[1])
    if sys.argv[1] == "triton":
        result["page_ids_mismatches"] = windowed_page_id_mismatches()
    print(RESULT_PREFIX + json.dumps(result))
