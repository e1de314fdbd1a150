"""An MLA attention backend on the latent pool (mem_cache/mla_pool.py) against the EXPANDED form in float64 (tests).

MLAHarness drives one attention backend (torch_native, triton, ...) through real request slots and allocator pages
(page_size > 1: scattered, partly filled pages) over MLATokenToKVPool, in the absorbed form the model calls it with
(models/deepseek_v2.py; docs: the issue-42 design):
    q = [ q_nope @ W_UK | q_pe ]  [N, H, L]     k = [ c_kv | k_pe ]  [N, 1, L]     v = k[..., :kv_lora]
    out [N, H * kv_lora] -> per head o_h @ W_UV^T -> [N, H, v_head_dim]
and computes what the model means, independently, in float64: every head's K and V decompressed from each token's
latent with random W_UK [H, nope, kv_lora] / W_UV [H, v_head_dim, kv_lora], K_h = [W_UK_h c | k_pe], Q_h = [q_nope_h |
q_pe_h], causal softmax over the request's whole history (kept here, not read from the pool) -> [N, H, v_head_dim].
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Dict, List, Sequence

import torch

from sglang.srt.layers.attention.attention_registry import create_attention_backend
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.mla_pool import MLATokenToKVPool
from sglang.srt.mem_plan.backends import AttentionShape, BackendInputs
from sglang.srt.mem_plan.sizes import req_to_token_row_len
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.server_args import ServerArgs
from sglang.test.attention_harness import BackendHarness


class MLAHarness:
    def __init__(self, backend: str, *, page_size: int = 1, num_heads: int = 4, kv_lora_rank: int = 64,
                 qk_rope_head_dim: int = 16, qk_nope_head_dim: int = 32, v_head_dim: int = 24,
                 dtype=torch.float32, num_reqs: int = 4, context_len: int = 512, num_layers: int = 2,
                 pool_tokens: int = 1024, seed: int = 0, device: str = "cpu"):
        self.gen = torch.Generator().manual_seed(seed)
        self.H, self.R, self.P, self.N, self.V = num_heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim
        self.L, self.dtype, self.device = kv_lora_rank + qk_rope_head_dim, dtype, device
        self.r2t = ReqToTokenPool(num_reqs, req_to_token_row_len(context_len), device)
        self.pool = MLATokenToKVPool(pool_tokens, page_size, dtype, kv_lora_rank, qk_rope_head_dim, num_layers, device)
        self.allocator = TokenToKVPoolAllocator(pool_tokens, page_size)
        random.Random(seed).shuffle(self.allocator.free_pages)  # requests get scattered, non-adjacent pages
        shape = AttentionShape(num_heads, self.L, context_len, v_head_dim=kv_lora_rank, is_mla=True, num_kv_heads=1,
                               model_dtype_bytes=dtype.itemsize, kv_dtype_bytes=dtype.itemsize,
                               num_kv_splits=ServerArgs.triton_attention_num_kv_splits)
        self.backend = create_attention_backend(backend, model_config=SimpleNamespace(dtype=dtype),
                                                req_to_token_pool=self.r2t, token_to_kv_pool=self.pool, device=device,
                                                inputs=BackendInputs(shape, num_reqs, 0))
        scale = (qk_nope_head_dim + qk_rope_head_dim) ** -0.5
        self.layers = [SimpleNamespace(layer_id=i, scaling=scale, head_dim=self.L, qk_head_dim=self.L,
                                       v_head_dim=kv_lora_rank, tp_q_head_num=num_heads, tp_k_head_num=1,
                                       tp_v_head_num=1, sliding_window_size=-1, sinks=None, logit_cap=0.0)
                       for i in range(num_layers)]
        # kv_b_proj's two halves per layer, float64 (the reference's; the backend sees them cast to dtype)
        self.w_uk = [self.rand(num_heads, qk_nope_head_dim, kv_lora_rank) / kv_lora_rank ** 0.5 for _ in self.layers]
        self.w_uv = [self.rand(num_heads, v_head_dim, kv_lora_rank) / kv_lora_rank ** 0.5 for _ in self.layers]
        self.lens: Dict[int, int] = {}  # request row -> tokens stored (BackendHarness.batch keeps it)
        self.history: Dict[int, List[torch.Tensor]] = {}  # request row -> per layer its tokens' latent rows [n, L] fp64

    def rand(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, dtype=torch.float64)

    def new_request(self) -> int:
        row = self.r2t.alloc()
        self.lens[row] = 0
        self.history[row] = [torch.zeros(0, self.L, dtype=torch.float64) for _ in self.layers]
        return row

    def batch(self, rows: Sequence[int], new_lens: Sequence[int]) -> ForwardBatch:
        """Allocate slots for new_lens[b] more tokens of request rows[b] and describe that step (BackendHarness's
        batch over these pools, allocator and counts)."""
        fb = BackendHarness.batch(self, rows, new_lens)
        fb.attn_backend = self.backend
        return fb

    def step(self, rows: Sequence[int], new_lens: Sequence[int]):
        """One forward of new_lens[b] tokens per request through every layer: (backend, fp64 expanded reference) per
        layer, [N, H, v_head_dim] each (the backend's output taken through W_UV in float64)."""
        fb = self.batch(rows, new_lens)
        self.backend.init_forward_metadata(fb)
        n, got, want = sum(new_lens), [], []
        for li, layer in enumerate(self.layers):
            latent, q_nope, q_pe = self.rand(n, self.L), self.rand(n, self.H, self.N), self.rand(n, self.H, self.P)
            q = torch.cat([torch.einsum("nhd,hdr->nhr", q_nope, self.w_uk[li]), q_pe], dim=-1)
            out = self.backend.forward(q.to(self.dtype).to(self.device), latent[:, None].to(self.dtype).to(self.device),
                                       latent[:, None, : self.R].to(self.dtype).to(self.device), layer, fb)
            got.append(torch.einsum("nhr,hvr->nhv", out.double().cpu().view(n, self.H, self.R), self.w_uv[li]))
            want.append(self._expanded(li, rows, new_lens, latent, q_nope, q_pe, layer.scaling))
        return got, want

    def _expanded(self, li, rows, new_lens, latent, q_nope, q_pe, scale) -> torch.Tensor:
        outs, start = [], 0
        for row, n in zip(rows, new_lens):
            hist = self.history[row][li] = torch.cat([self.history[row][li], latent[start : start + n]])
            c, pe = hist[:, : self.R], hist[:, self.R :]  # [S, R], [S, P]
            k = torch.cat([torch.einsum("hdr,sr->hsd", self.w_uk[li], c), pe.expand(self.H, -1, -1)], -1)  # [H, S, N+P]
            v = torch.einsum("hvr,sr->hsv", self.w_uv[li], c)  # [H, S, V]
            q = torch.cat([q_nope[start : start + n], q_pe[start : start + n]], -1).transpose(0, 1)  # [H, n, N+P]
            s_len = hist.shape[0]
            pos = torch.arange(s_len - n, s_len)
            scores = (q @ k.transpose(1, 2)) * scale  # [H, n, S]
            scores = scores.masked_fill(torch.arange(s_len)[None, :] > pos[:, None], float("-inf"))
            outs.append((scores.softmax(-1) @ v).transpose(0, 1))  # [n, H, V]
            start += n
        return torch.cat(outs)


def max_abs_diff(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """The largest |got - want| over every pair; a NaN anywhere (an output never written) counts as infinite, since
    Python's max() would otherwise keep whichever came first."""
    diffs = [(g - w).abs() for g, w in zip(got, want)]
    return max(float("inf") if bool(d.isnan().any()) else float(d.max()) for d in diffs)
