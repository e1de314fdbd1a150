"""A tiny driver that runs a model over a paged KV pool without the scheduler, for tests and benchmarks.

Slots are handed out linearly (no allocator, no freeing); each request keeps its req_to_token row.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from sglang.srt.layers.attention.attention_registry import create_attention_backend
from sglang.srt.layers.quantization.linear_method import quant_forward_rule
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.quantized_kv_pool import create_kv_pool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


def kv_format_of(model_config) -> str:
    """The KV format name of a ModelConfig (or of a stand-in config with only a torch kv_cache_dtype)."""
    from sglang.srt.mem_plan.dtypes import canonical_dtype

    name = getattr(model_config, "kv_cache_dtype_name", None)
    return name if isinstance(name, str) else canonical_dtype(str(model_config.kv_cache_dtype))


class PagedForwardDriver:
    def __init__(self, model, model_config, max_reqs: int = 8, max_tokens: int = 4096, backend: str = "torch_native", device: str = "cpu", page_size: int = 1,
                 kv_format: Optional[str] = None):
        self.model = model
        self.device = device
        self.req_to_token_pool = ReqToTokenPool(max_reqs, model_config.context_len, device=device)
        self.kv_pool = create_kv_pool(
            kv_format or kv_format_of(model_config), max_tokens, page_size, model_config.kv_cache_dtype,
            model_config.num_key_value_heads, model_config.head_dim, model_config.num_hidden_layers, device=device,
            window_rows=max_reqs + 1,  # a format's recent window (int4) as a server has it: a ring per request row
        )
        if getattr(self.kv_pool, "window", None) is not None:
            self.req_to_token_pool.on_alloc.append(self.kv_pool.window.forget)
        self.attn_backend = create_attention_backend(
            backend, model_config=model_config, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.kv_pool, device=device,
        )
        self.next_slot = page_size  # slots [0, page_size) are the dummy page
        self.seq_lens: dict = {}  # req row -> tokens stored

    def new_request(self) -> int:
        row = self.req_to_token_pool.alloc()
        self.seq_lens[row] = 0
        return row

    def _alloc(self, row: int, n: int) -> torch.Tensor:
        start = self.seq_lens[row]
        loc = torch.arange(self.next_slot, self.next_slot + n, dtype=torch.int64, device=self.device)
        self.next_slot += n
        self.req_to_token_pool.req_to_token[row, start : start + n] = loc
        self.seq_lens[row] = start + n
        return loc

    def extend(self, rows: Sequence[int], token_lists: Sequence[List[int]], logits_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Append token_lists[b] to request rows[b]; returns float32 logits [B, V] of each request's last token
        (or of the rows `logits_indices` of the N new tokens). One new token per request -> a DECODE batch."""
        prefix = [self.seq_lens[r] for r in rows]
        ext = [len(t) for t in token_lists]
        locs = torch.cat([self._alloc(r, n) for r, n in zip(rows, ext)])
        seq = [p + e for p, e in zip(prefix, ext)]
        positions = torch.cat([torch.arange(p, s, dtype=torch.int64) for p, s in zip(prefix, seq)])
        input_ids = torch.tensor([t for ts in token_lists for t in ts], dtype=torch.int64)
        mode = ForwardMode.EXTEND
        if all(e == 1 for e in ext) and all(p > 0 for p in prefix):
            mode = ForwardMode.DECODE
        fb = ForwardBatch(
            forward_mode=mode,
            batch_size=len(rows),
            input_ids=input_ids.to(self.device),
            positions=positions.to(self.device),
            req_pool_indices=torch.tensor(list(rows), dtype=torch.int64, device=self.device),
            seq_lens=torch.tensor(seq, dtype=torch.int64, device=self.device),
            out_cache_loc=locs,
            seq_lens_cpu=seq,
            extend_prefix_lens_cpu=prefix if mode.is_extend() else [],
            extend_seq_lens_cpu=ext if mode.is_extend() else [],
            extend_prefix_lens=torch.tensor(prefix, device=self.device) if mode.is_extend() else None,
            extend_seq_lens=torch.tensor(ext, device=self.device) if mode.is_extend() else None,
            logits_indices=logits_indices,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.kv_pool,
            attn_backend=self.attn_backend,
        )
        self.attn_backend.init_forward_metadata(fb)
        # an extend forward, under the model runner's kernel rule for it (the quantized GEMMs' dense AMX path from 256
        # rows), so these runs match what an Engine computes for the same prompt
        with torch.inference_mode(), quant_forward_rule(decode=False):
            return self.model(fb.input_ids, fb.positions, fb)

    def greedy(self, prompt: List[int], max_new_tokens: int) -> List[int]:
        row = self.new_request()
        logits = self.extend([row], [prompt])
        out = [int(logits[0].argmax())]
        for _ in range(max_new_tokens - 1):
            logits = self.extend([row], [[out[-1]]])
            out.append(int(logits[0].argmax()))
        return out
