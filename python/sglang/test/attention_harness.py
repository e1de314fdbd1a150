"""A layer-level harness that runs one attention backend and torch_native over the same paged pools (CPU tests).

Requests grow through real allocator pages (so page_size > 1 gives scattered, partly filled pages), and every step runs
`init_forward_metadata` + one forward per layer on both backends with the same q/k/v; the K/V each writes are identical,
so sharing the pools is safe. A quantized format with a recent window (int4, int2_hadamard, fp8) gets its ring as a
server's pool has it (window=False: none); both backends claim and write ring entries, so `compare` runs the backend,
keeps the ring it left, puts back the ring from before and runs torch_native: both see the same ring, and what the
backend wrote can be compared with what torch_native wrote (ring_diffs).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import List, Sequence

import torch

from sglang.srt.layers.attention.attention_registry import create_attention_backend
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.quantized_kv_pool import create_kv_pool
from sglang.srt.mem_plan.backends import AttentionShape, BackendInputs
from sglang.srt.mem_plan.kv_quant import rotated_parts
from sglang.srt.mem_plan.sizes import req_to_token_row_len
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, move_to_device
from sglang.srt.server_args import ServerArgs


class BackendHarness:
    def __init__(self, backend: str, *, page_size: int = 1, num_q_heads: int = 6, num_kv_heads: int = 2,
                 head_dim: int = 32, dtype=torch.bfloat16, num_reqs: int = 4, context_len: int = 512,
                 graph_bs: int = 0, num_layers: int = 2, pool_tokens: int = 2048, seed: int = 0,
                 device: str = "cpu", kv_format: str = "", window: bool = True):
        self.gen = torch.Generator().manual_seed(seed)
        self.dtype, self.num_layers, self.device = dtype, num_layers, device
        self.num_q_heads, self.num_kv_heads, self.head_dim = num_q_heads, num_kv_heads, head_dim
        self.r2t = ReqToTokenPool(num_reqs, req_to_token_row_len(context_len), device)
        if kv_format:  # a quantized pool (mem_cache/quantized_kv_pool.py): both backends read its codes
            self.pool = create_kv_pool(kv_format, pool_tokens, page_size, dtype, num_kv_heads, head_dim, num_layers,
                                       device, window_rows=self.r2t.req_to_token.shape[0] if window else 0)
            if getattr(self.pool, "window", None) is not None:
                self.r2t.on_alloc.append(self.pool.window.forget)
        else:
            self.pool = MHATokenToKVPool(pool_tokens, page_size, dtype, num_kv_heads, head_dim, num_layers, device)
        self.allocator = TokenToKVPoolAllocator(pool_tokens, page_size)
        shape = AttentionShape(num_q_heads, head_dim, context_len, num_kv_heads=num_kv_heads,
                               model_dtype_bytes=dtype.itemsize, kv_dtype_bytes=dtype.itemsize,
                               num_kv_splits=ServerArgs.triton_attention_num_kv_splits,
                               kv_rotated_parts=len(rotated_parts(kv_format)))
        self.inputs = BackendInputs(shape, num_reqs, graph_bs)
        model_config = SimpleNamespace(dtype=dtype)
        common = dict(model_config=model_config, req_to_token_pool=self.r2t, token_to_kv_pool=self.pool, device=device)
        self.backend = create_attention_backend(backend, inputs=self.inputs, **common)
        self.reference = create_attention_backend("torch_native", **common)
        self.layers = [SimpleNamespace(layer_id=i, scaling=head_dim ** -0.5, v_head_dim=head_dim)
                       for i in range(num_layers)]
        self.lens: dict = {}  # request row -> tokens stored
        self.ring_diffs: List[float] = []  # per compare: the backend's ring vs torch_native's (inf: other slots)

    def new_request(self) -> int:
        row = self.r2t.alloc()
        self.lens[row] = 0
        return row

    def batch(self, rows: Sequence[int], new_lens: Sequence[int]) -> ForwardBatch:
        """Allocate slots for new_lens[b] more tokens of request rows[b] and describe that step."""
        prefix = [self.lens[r] for r in rows]
        locs: List[int] = []
        for row, p, n in zip(rows, prefix, new_lens):
            last = int(self.r2t.req_to_token[row, p - 1]) if p else 0
            slots = self.allocator.alloc(p, last, n)
            assert slots is not None, "harness pool too small"
            self.r2t.req_to_token[row, p : p + n] = torch.tensor(slots)
            locs += slots
            self.lens[row] = p + n
        seq = [p + n for p, n in zip(prefix, new_lens)]
        decode = all(n == 1 for n in new_lens) and all(p > 0 for p in prefix)
        mode = ForwardMode.DECODE if decode else ForwardMode.EXTEND
        fb = ForwardBatch(
            forward_mode=mode, batch_size=len(rows), input_ids=torch.zeros(len(locs), dtype=torch.int64),
            positions=torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq)]),
            req_pool_indices=torch.tensor(list(rows)), seq_lens=torch.tensor(seq), out_cache_loc=torch.tensor(locs),
            seq_lens_cpu=seq,
            extend_prefix_lens_cpu=[] if decode else prefix, extend_seq_lens_cpu=[] if decode else list(new_lens),
            extend_prefix_lens=None if decode else torch.tensor(prefix),
            extend_seq_lens=None if decode else torch.tensor(list(new_lens)),
            req_to_token_pool=self.r2t, token_to_kv_pool=self.pool,
        )
        return move_to_device(fb, self.device)

    def qkv(self, num_tokens: int):
        def rand(heads):
            return torch.randn(num_tokens, heads, self.head_dim, generator=self.gen).to(self.device, self.dtype)

        return [(rand(self.num_q_heads), rand(self.num_kv_heads), rand(self.num_kv_heads)) for _ in self.layers]

    def run(self, backend, fb: ForwardBatch, qkv) -> List[torch.Tensor]:
        fb.attn_backend = backend
        backend.init_forward_metadata(fb)
        return [backend.forward(q, k, v, layer, fb) for layer, (q, k, v) in zip(self.layers, qkv)]

    def step(self, rows: Sequence[int], new_lens: Sequence[int]):
        """(backend outputs, torch_native outputs) per layer, [N, H * D] each."""
        fb = self.batch(rows, new_lens)
        qkv = self.qkv(sum(new_lens))
        return self.compare(fb, qkv, lambda: self.run(self.backend, fb, qkv))

    def window_state(self):
        w = getattr(self.pool, "window", None)
        return None if w is None else [t.clone() for t in (w.k, w.v, w.loc)]

    def compare(self, fb: ForwardBatch, qkv, run_backend):
        """run_backend() (the backend's outputs), then torch_native's over the ring as it was before."""
        before = self.window_state()
        got = run_backend()
        if before is not None:
            w, after = self.pool.window, self.window_state()
            for t, saved in zip((w.k, w.v, w.loc), before):
                t.copy_(saved)
        want = self.run(self.reference, fb, qkv)
        if before is not None:
            k, v, loc = self.window_state()
            same = torch.equal(loc, after[2])
            self.ring_diffs.append(max(float((k.float() - after[0].float()).abs().max()),
                                       float((v.float() - after[1].float()).abs().max())) if same else float("inf"))
        return got, want


def max_abs_diff(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    return max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want))
