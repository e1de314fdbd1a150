"""TorchNativeAttnBackend: attention over the paged KV pool with torch's scaled_dot_product_attention.

Runs on CPU and GPU. Per forward, `init_forward_metadata` gathers each request's KV slots from req_to_token into
one padded index tensor [B, max_seq_len] and builds the masks; each layer then writes its new K/V to the pool,
gathers K/V for the whole batch with one index op, and runs a single batched SDPA call.

Query layouts:
  decode   q [B, H, D] is viewed as [B, KV, G, D] (G = H / KV query heads per KV head); the G heads of a group
           act as G queries against that group's keys, so no KV expansion is needed.
  extend   q [N, H, D] is scattered into [B, max_extend_len, H, D] (no copy when B == 1); query i of request b
           sits at position prefix_len[b] + i and attends to keys j <= prefix_len[b] + i.
  A single request without a cached prefix takes SDPA's is_causal path on the new K/V directly.

On a CPU with AVX-512 BF16 and a bf16 pool, decode instead calls one fused kernel per layer
(jit_kernel/csrc/cpu/decode_attention.h) that writes the new K/V and reads each request's keys and values in place
through req_to_token: no gathered copy, no padding, no mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional

import torch
import torch.nn.functional as F

from sglang.jit_kernel.cpu_ops import get_cpu_ops
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


# Upper bound on K/V tokens gathered at once by one decode layer (rows x padded length); the backend's declared
# workspace is this many tokens of one layer's K and V (see mem_plan/backends.py).
DECODE_GATHER_TOKENS = 64 * 1024


@dataclass
class TorchNativeMetadata:
    kv_indices: Optional[torch.Tensor]  # [B, max_seq_len] KV slots; rows past seq_len are masked out
    attn_mask: Optional[torch.Tensor]  # bool, True = attend; decode [B, 1, 1, Lk], extend [B, 1, Lq, Lk]
    is_causal: bool = False  # extend of one request with no cached prefix: plain causal SDPA on the new K/V
    q_batch_idx: Optional[torch.Tensor] = None  # [N] request of each new token (extend, B > 1)
    q_pos_idx: Optional[torch.Tensor] = None  # [N] index of each new token within its request's extend
    max_extend_len: int = 0
    fused_decode: bool = False  # decode through the CPU kernel; kv_indices and attn_mask are not built


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.forward_metadata: Optional[TorchNativeMetadata] = None
        pool = self.token_to_kv_pool
        self.cpu_decode_ops = None
        if (
            str(self.device).startswith("cpu")
            and getattr(self.model_config, "dtype", None) == torch.bfloat16
            and pool.dtype == torch.bfloat16
            and getattr(pool, "store_dtype", pool.dtype) == torch.bfloat16
            and getattr(pool, "head_dim", 0) % 32 == 0
            and getattr(pool, "v_head_dim", None) == getattr(pool, "head_dim", None)
        ):
            self.cpu_decode_ops = get_cpu_ops()

    # ------------------------------------------------------------------ metadata (once per forward)
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        fb = forward_batch
        seq_lens_cpu: List[int] = fb.seq_lens_cpu or fb.seq_lens.tolist()
        bs = fb.batch_size
        device = fb.seq_lens.device
        if fb.forward_mode.is_extend():
            extend_lens = fb.extend_seq_lens_cpu or (fb.extend_seq_lens.tolist() if fb.extend_seq_lens is not None else None)
            prefix_lens = fb.extend_prefix_lens_cpu or (
                fb.extend_prefix_lens.tolist() if fb.extend_prefix_lens is not None else None
            )
            if prefix_lens is None:
                prefix_lens = [s - e for s, e in zip(seq_lens_cpu, extend_lens)]
            if extend_lens is None:
                extend_lens = [s - p for s, p in zip(seq_lens_cpu, prefix_lens)]
            if bs == 1 and prefix_lens[0] == 0:
                self.forward_metadata = TorchNativeMetadata(None, None, is_causal=True, max_extend_len=extend_lens[0])
                return
            self.forward_metadata = self._extend_metadata(fb, seq_lens_cpu, prefix_lens, extend_lens, device)
            return

        if self.cpu_decode_ops is not None:
            self.forward_metadata = TorchNativeMetadata(None, None, fused_decode=True)
            return
        max_len = max(seq_lens_cpu)
        kv_indices = self.req_to_token_pool.req_to_token[fb.req_pool_indices, :max_len]  # [B, max_len]
        mask = None
        if min(seq_lens_cpu) != max_len:
            key_pos = torch.arange(max_len, device=device)
            valid = key_pos[None, :] < fb.seq_lens[:, None]  # [B, max_len]
            kv_indices = kv_indices.masked_fill(~valid, 0)  # req_to_token past seq_len is uninitialised
            mask = valid.view(bs, 1, 1, max_len)
        self.forward_metadata = TorchNativeMetadata(kv_indices, mask)

    def _extend_metadata(self, fb, seq_lens_cpu, prefix_lens, extend_lens, device) -> TorchNativeMetadata:
        bs = fb.batch_size
        max_len = max(seq_lens_cpu)
        max_q = max(extend_lens)
        seq_lens = torch.tensor(seq_lens_cpu, dtype=torch.int64, device=device)
        prefix = torch.tensor(prefix_lens, dtype=torch.int64, device=device)
        key_pos = torch.arange(max_len, device=device)  # [Lk]
        q_pos = prefix[:, None] + torch.arange(max_q, device=device)[None, :]  # [B, Lq] sequence position of query i
        valid = key_pos[None, :] < seq_lens[:, None]  # [B, Lk]
        mask = (key_pos[None, None, :] <= q_pos[:, :, None]) & valid[:, None, :]  # [B, Lq, Lk]
        # req_to_token past seq_len is uninitialised: point those keys at the dummy slot 0
        kv_indices = self.req_to_token_pool.req_to_token[fb.req_pool_indices, :max_len].masked_fill(~valid, 0)
        q_batch_idx = q_pos_idx = None
        if bs > 1:
            lens = torch.tensor(extend_lens, dtype=torch.int64, device=device)
            q_batch_idx = torch.repeat_interleave(torch.arange(bs, device=device), lens)  # [N]
            starts = torch.cumsum(lens, 0) - lens
            q_pos_idx = torch.arange(int(sum(extend_lens)), device=device) - starts[q_batch_idx]  # [N]
        return TorchNativeMetadata(
            kv_indices=kv_indices,
            attn_mask=mask.unsqueeze(1),  # [B, 1, Lq, Lk]
            q_batch_idx=q_batch_idx,
            q_pos_idx=q_pos_idx,
            max_extend_len=max_q,
        )

    # ------------------------------------------------------------------ per layer
    def _gather_kv(self, layer: "RadixAttention", kv_indices: torch.Tensor, dtype: torch.dtype):
        """kv_indices: [B, Lk] -> k, v: [B, KV, Lk, D] (transposed views of one contiguous gather each)."""
        pool = self.token_to_kv_pool
        bs, max_len = kv_indices.shape
        flat = kv_indices.reshape(-1)
        # index_select is ~3x faster than advanced indexing on CPU for these shapes
        k = pool.get_key_buffer(layer.layer_id).index_select(0, flat)  # [B * Lk, KV, D]
        v = pool.get_value_buffer(layer.layer_id).index_select(0, flat)
        if k.dtype != dtype:
            k, v = k.to(dtype), v.to(dtype)
        k = k.view(bs, max_len, k.shape[1], k.shape[2]).transpose(1, 2)
        v = v.view(bs, max_len, v.shape[1], v.shape[2]).transpose(1, 2)
        return k, v

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        # q: [N, H, D], k/v: [N, KV, D] -> [N, H * Dv]
        if save_kv_cache:
            self.token_to_kv_pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        md = self.forward_metadata
        n, num_heads = q.shape[0], q.shape[1]
        if md.is_causal:
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1).unsqueeze(0),  # [1, H, N, D]
                k.transpose(0, 1).unsqueeze(0),  # [1, KV, N, D]
                v.transpose(0, 1).unsqueeze(0),
                is_causal=True,
                scale=layer.scaling,
                enable_gqa=True,
            )  # [1, H, N, Dv]
            return out[0].transpose(0, 1).reshape(n, num_heads * layer.v_head_dim)

        k_all, v_all = self._gather_kv(layer, md.kv_indices, q.dtype)
        bs = forward_batch.batch_size
        if bs == 1:
            q_pad = q.unsqueeze(0)  # [1, N, H, D]
        else:
            q_pad = q.new_zeros((bs, md.max_extend_len, num_heads, q.shape[2]))
            q_pad[md.q_batch_idx, md.q_pos_idx] = q
        out = F.scaled_dot_product_attention(
            q_pad.transpose(1, 2), k_all, v_all, attn_mask=md.attn_mask, scale=layer.scaling, enable_gqa=True
        ).transpose(1, 2)  # [B, Lq, H, Dv]
        out = out[0] if bs == 1 else out[md.q_batch_idx, md.q_pos_idx]  # [N, H, Dv]
        return out.reshape(n, num_heads * layer.v_head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        # q: [B, H, D], k/v: [B, KV, D] -> [B, H * Dv]
        md = self.forward_metadata
        if md.fused_decode:
            if not save_kv_cache:
                raise NotImplementedError("torch_native CPU decode always writes the new K/V (save_kv_cache=True).")
            pool = self.token_to_kv_pool
            return self.cpu_decode_ops.decode_attention(
                q, k, v, pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id),
                self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens,
                forward_batch.out_cache_loc, layer.scaling,
            )
        if save_kv_cache:
            self.token_to_kv_pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        bs, num_heads, head_dim = q.shape
        max_len = md.kv_indices.shape[1]
        # Rows are processed in groups of at most DECODE_GATHER_TOKENS gathered tokens, so the per-layer gathered
        # K/V never exceeds the workspace declared for this backend, whatever the batch size and context.
        rows = max(1, DECODE_GATHER_TOKENS // max_len)
        if rows >= bs:
            return self._decode_rows(q, layer, md.kv_indices, md.attn_mask)
        outs = [
            self._decode_rows(q[s : s + rows], layer, md.kv_indices[s : s + rows],
                              None if md.attn_mask is None else md.attn_mask[s : s + rows])
            for s in range(0, bs, rows)
        ]
        return torch.cat(outs)

    def _decode_rows(self, q, layer, kv_indices, attn_mask) -> torch.Tensor:
        k_all, v_all = self._gather_kv(layer, kv_indices, q.dtype)  # [B, KV, Lk, D]
        bs, num_heads, head_dim = q.shape
        num_kv_heads = k_all.shape[1]
        q_grouped = q.view(bs, num_kv_heads, num_heads // num_kv_heads, head_dim)  # [B, KV, G, D]
        out = F.scaled_dot_product_attention(q_grouped, k_all, v_all, attn_mask=attn_mask, scale=layer.scaling)
        return out.reshape(bs, num_heads * layer.v_head_dim)  # [B, KV, G, Dv] -> [B, H * Dv]
