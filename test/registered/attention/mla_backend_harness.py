"""A layer-level harness for an attention backend over the MLA latent pool (mem_cache/mla_pool.py), checked against
the EXPANDED multi-head form in float64 (triton_mla_cases.MLAWeights). Not a test file (run_suite collects
test_*.py only).

Requests grow through real allocator pages (page_size > 1: scattered, partly filled pages). Each step builds one
ForwardBatch (EXTEND, or DECODE when every request adds one token to a cached prefix), calls the backend's
init_forward_metadata once and forward() per layer with the absorbed query [q_nope @ W_UK | q_pe] and the new latent
rows k [N, 1, lora + rope], v = k[..., :lora], as the model calls RadixAttention. The reference keeps its own copy of
every request's rows (never the pool's) and attends in the expanded form; the backend's latent output goes through
W_UV before the comparison.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import List, Sequence

import torch
from triton_mla_cases import MLAWeights, worst

from sglang.srt.layers.attention.attention_registry import create_attention_backend
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.mla_pool import MLATokenToKVPool
from sglang.srt.mem_plan.backends import AttentionShape, BackendInputs
from sglang.srt.mem_plan.sizes import req_to_token_row_len
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.server_args import ServerArgs


class MLAHarness:
    def __init__(self, backend: str, *, page_size: int = 1, num_heads: int = 8, lora: int = 64, rope: int = 32,
                 nope: int = 48, v_head: int = 40, dtype=torch.float32, num_reqs: int = 4, context_len: int = 512,
                 graph_bs: int = 0, num_layers: int = 2, pool_tokens: int = 1024, seed: int = 0):
        self.gen = torch.Generator().manual_seed(seed)
        self.dtype, self.lora, self.rope, self.num_heads = dtype, lora, rope, num_heads
        self.r2t = ReqToTokenPool(num_reqs, req_to_token_row_len(context_len), "cpu")
        self.pool = MLATokenToKVPool(pool_tokens, page_size, dtype, lora, rope, num_layers, "cpu")
        self.allocator = TokenToKVPoolAllocator(pool_tokens, page_size)
        # the plan's MLA shape (model_shapes.attention_shape): one KV head of width lora + rope, values lora wide
        shape = AttentionShape(num_heads, lora + rope, context_len, v_head_dim=lora, is_mla=True, num_kv_heads=1,
                               model_dtype_bytes=dtype.itemsize, kv_dtype_bytes=dtype.itemsize,
                               num_kv_splits=ServerArgs.triton_attention_num_kv_splits)
        self.inputs = BackendInputs(shape, num_reqs, graph_bs, page_size=page_size)
        self.weights = [MLAWeights(num_heads, lora, rope, nope, v_head, self.gen) for _ in range(num_layers)]
        self.layers = [SimpleNamespace(layer_id=i, scaling=w.scale, v_head_dim=lora, head_dim=lora + rope)
                       for i, w in enumerate(self.weights)]
        self.backend = create_attention_backend(backend, inputs=self.inputs, model_config=SimpleNamespace(dtype=dtype),
                                                req_to_token_pool=self.r2t, token_to_kv_pool=self.pool, device="cpu")
        self.history: dict = {}  # request row -> per layer: its latent rows so far [T, lora + rope] (KV dtype)

    def new_request(self) -> int:
        row = self.r2t.alloc()
        self.history[row] = [torch.zeros(0, self.lora + self.rope, dtype=self.dtype) for _ in self.layers]
        return row

    def batch(self, rows: Sequence[int], new_lens: Sequence[int]) -> ForwardBatch:
        prefix = [self.history[r][0].shape[0] for r in rows]
        locs: List[int] = []
        for row, p, n in zip(rows, prefix, new_lens):
            last = int(self.r2t.req_to_token[row, p - 1]) if p else 0
            slots = self.allocator.alloc(p, last, n)
            assert slots is not None, "harness pool too small"
            self.r2t.req_to_token[row, p : p + n] = torch.tensor(slots)
            locs += slots
        seq = [p + n for p, n in zip(prefix, new_lens)]
        decode = all(n == 1 for n in new_lens) and all(p > 0 for p in prefix)
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND, batch_size=len(rows),
            input_ids=torch.zeros(len(locs), dtype=torch.int64),
            positions=torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq)]),
            req_pool_indices=torch.tensor(list(rows)), seq_lens=torch.tensor(seq), out_cache_loc=torch.tensor(locs),
            seq_lens_cpu=seq, req_pool_indices_cpu=list(rows),
            extend_prefix_lens_cpu=[] if decode else prefix, extend_seq_lens_cpu=[] if decode else list(new_lens),
            extend_prefix_lens=None if decode else torch.tensor(prefix),
            extend_seq_lens=None if decode else torch.tensor(list(new_lens)),
            req_to_token_pool=self.r2t, token_to_kv_pool=self.pool,
        )

    def step(self, rows: Sequence[int], new_lens: Sequence[int], recorder=None, graph: bool = False) -> float:
        """One forward of every layer; the max abs error of the backend's output (through W_UV) against the expanded
        form over each request's whole sequence. recorder: a context entered around each backend call only (an
        AllocationRecorder: what the backend allocates, not the reference). graph: a decode step set up by the
        backend's CUDA-graph capture hook (its graph workspace and full grid) instead of init_forward_metadata."""
        around = recorder if recorder is not None else contextlib.nullcontext()
        fb = self.batch(rows, new_lens)
        fb.attn_backend = self.backend
        with around:
            if graph:
                assert fb.forward_mode.is_decode()
                self.backend.init_forward_metadata_capture_cuda_graph(len(rows), fb.req_pool_indices, fb.seq_lens_cpu)
            else:
                self.backend.init_forward_metadata(fb)
        total, err = sum(new_lens), 0.0
        for layer, w in zip(self.layers, self.weights):
            q_nope, q_pe, q = w.queries(total, self.dtype)
            k = torch.randn(total, 1, self.lora + self.rope, generator=self.gen).to(self.dtype)
            with around:
                out = self.backend.forward(q, k, k[..., : self.lora], layer, fb)
            assert out.shape == (total, self.num_heads * self.lora), tuple(out.shape)
            got, start = w.up(out), 0
            for row, n in zip(rows, new_lens):
                hist = self.history[row]
                hist[layer.layer_id] = torch.cat([hist[layer.layer_id], k[start : start + n, 0]])
                seq = hist[layer.layer_id].shape[0]
                ref = w.expanded(q_nope[start : start + n], q_pe[start : start + n], hist[layer.layer_id],
                                 list(range(seq - n, seq)))
                err = worst(err, got[start : start + n] - ref)
                start += n
        return err


# prefill of three requests, an extend over their cached prefixes (one of a single token), two decode steps, then a
# fourth request joining while the others hold long prefixes
MLA_STEPS = [("abc", [5, 17, 9]), ("abc", [3, 1, 8]), ("abc", [1, 1, 1]), ("abc", [1, 1, 1]),
             ("abcd", [2, 1, 4, 11])]


def run_mla_steps(h: MLAHarness, graph_decode: bool = False) -> List[float]:
    """The MLA_STEPS through h (graph_decode: the decode steps through the CUDA-graph hooks); the max abs error of
    each."""
    rows = {}
    errors = []
    for names, lens in MLA_STEPS:
        for name in names:
            if name not in rows:
                rows[name] = h.new_request()
        decode = all(n == 1 for n in lens) and len(errors) > 0
        errors.append(h.step([rows[n] for n in names], lens, graph=graph_decode and decode))
    return errors
