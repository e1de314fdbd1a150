"""torch_native attention of a multi-head latent attention (MLA) layer over the latent pool (mem_cache/mla_pool.py).

The model calls every MLA layer in the absorbed form (models/deepseek_v2.py): H query heads of width L = kv_lora_rank
+ qk_rope_head_dim ([q_nope @ W_UK | q_pe]) against ONE key head, the latent row [c_kv | k_pe], and values that are
the row's first kv_lora_rank columns; the output [N, H * kv_lora_rank] goes through W_UV in the model. So the layer is
MQA with v_head_dim = kv_lora_rank != head_dim = L, and nothing per head is ever made from the cache.

  write    only the K row (the pool stores V as a view of it)
  extend   per request, as TorchNativeAttnBackend does: no cached prefix -> causal SDPA over the new rows as computed;
           a prefix -> the request's rows gathered from the pool (one [seq_len, L] copy) and the [q_len, seq_len] mask
  decode   row groups of at most the backend's decode_gather_tokens padded tokens: a padded slot table, one gather,
           one SDPA call with the H heads as H queries of the single key head (no expansion)

SDPA is called with V = the whole row (v is k) and the output's first kv_lora_rank columns kept: torch's CPU flash
kernel needs equal q/k/v widths, and only it keeps the scores tiled. With V as the kv_lora_rank-wide view SDPA falls
back to its math path, which holds [H, q_len, seq_len] scores: at H 16, L 576, 1,024 new tokens over 4,096, bf16, the
peak was 961 MiB against 43 MiB with v = k, and against the 209 MiB the plan declares (backends.extend_attention).

The metadata is the backend's own (TorchNativeMetadata: extend_reqs; max_len / ragged / seq_lens_host): an MLA pool
has no fused kernel there (its v_head_dim != head_dim), so _init_metadata always takes the torch path's branch.
`kernel_attention` is the one place a compiled CPU MLA kernel plugs in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers.attention.cpu_kernel_ops import mla_cpu_ops, mla_decode, mla_extend

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def is_mla_layer(layer, pool) -> bool:
    """An absorbed MLA layer on a latent pool: V is read from the K rows' first v_head_dim columns."""
    return getattr(pool, "is_mla", False) and layer.v_head_dim != layer.head_dim


class MLATorchAttention:
    def __init__(self, backend):
        self.backend = backend
        self.pool = backend.token_to_kv_pool
        self.kv_lora_rank = self.pool.kv_lora_rank
        self.cpu_ops = mla_cpu_ops(backend.device, getattr(backend.model_config, "dtype", None), self.pool.dtype,
                                   self.pool.store_dtype, self.pool.head_dim, self.kv_lora_rank)

    def kernel_attention(self, q: torch.Tensor, k: torch.Tensor, layer, fb: "ForwardBatch",
                         save_kv_cache: bool) -> Optional[torch.Tensor]:
        """The compiled CPU MLA kernel's output [N, H * kv_lora_rank] (it writes the K rows itself), or None: the
        torch path below (no kernel at this CPU level or dtype, or save_kv_cache=False: the kernel reads the pool)."""
        if self.cpu_ops is None or not save_kv_cache:
            return None
        table, rows = self.backend.req_to_token_pool.req_to_token, self.pool.get_key_buffer(layer.layer_id)
        if not fb.forward_mode.is_extend():
            return mla_decode(self.cpu_ops, q, k, rows, self.kv_lora_rank, table, fb.req_pool_indices, fb.seq_lens,
                              fb.out_cache_loc, layer.scaling)
        ext = fb.extend_seq_lens if fb.extend_seq_lens is not None else torch.tensor(fb.extend_seq_lens_cpu)
        pre = fb.extend_prefix_lens if fb.extend_prefix_lens is not None else fb.seq_lens - ext
        return mla_extend(self.cpu_ops, q, rows, self.kv_lora_rank, table, fb.req_pool_indices, pre, ext,
                          layer.scaling, k, fb.out_cache_loc)

    def forward(self, q: torch.Tensor, k: torch.Tensor, layer, fb: "ForwardBatch", save_kv_cache: bool) -> torch.Tensor:
        # q [N, H, L], k [N, 1, L] -> [N, H * kv_lora_rank]
        out = self.kernel_attention(q, k, layer, fb, save_kv_cache)
        if out is not None:
            return out
        if save_kv_cache:
            self.pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, None)
        return self._extend(q, k, layer) if fb.forward_mode.is_extend() else self._decode(q, layer, fb)

    def _rows(self, layer, kv_indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """kv_indices [B, Lk] -> the latent rows [B, 1, Lk, L], one gather (they are K, and V is their first columns)."""
        bs, n = kv_indices.shape
        k, _ = self.pool.gather_kv(layer.layer_id, kv_indices.reshape(-1), dtype)  # [B * Lk, 1, L]
        return k.view(bs, n, 1, k.shape[-1]).transpose(1, 2)

    def _extend(self, q: torch.Tensor, k: torch.Tensor, layer) -> torch.Tensor:
        md, num_heads, dv = self.backend.forward_metadata, q.shape[1], self.kv_lora_rank
        outs = []
        for req in md.extend_reqs:
            rows = slice(req.q_start, req.q_start + req.q_len)
            q_b = q[rows].transpose(0, 1).unsqueeze(0)  # [1, H, q_len, L]
            if req.kv_indices is None:  # no cached prefix: the new rows as computed, causal
                k_b = k[rows].transpose(0, 1).unsqueeze(0).to(q.dtype)  # [1, 1, q_len, L]
                out = F.scaled_dot_product_attention(q_b, k_b, k_b, is_causal=True, scale=layer.scaling,
                                                     enable_gqa=True)
            else:
                k_b = self._rows(layer, req.kv_indices, q.dtype)  # [1, 1, seq_len, L]
                out = F.scaled_dot_product_attention(q_b, k_b, k_b, attn_mask=req.attn_mask, scale=layer.scaling,
                                                     enable_gqa=True)
            # [1, H, q, L] -> the values' columns [q, H * dv]
            outs.append(out[0, ..., :dv].transpose(0, 1).reshape(req.q_len, num_heads * dv))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _decode(self, q: torch.Tensor, layer, fb: "ForwardBatch") -> torch.Tensor:
        md, bs = self.backend.forward_metadata, q.shape[0]
        # each row group's slot table, mask and gathered rows stay within the declared decode_gather transient
        step = max(1, self.backend.decode_gather_tokens // md.max_len)
        outs = [self._decode_rows(q[s : s + step], layer, fb.req_pool_indices[s : s + step],
                                  fb.seq_lens[s : s + step], md.max_len, md.ragged)
                for s in range(0, bs, step)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _decode_rows(self, q, layer, req_rows, seq_lens, max_len: int, ragged: bool) -> torch.Tensor:
        kv_indices = self.backend.req_to_token_pool.req_to_token[req_rows, :max_len]  # [b, max_len], a copy
        attn_mask = None
        if ragged:
            valid = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None]  # [b, max_len]
            kv_indices.masked_fill_(~valid, 0)  # req_to_token past seq_len is uninitialised: the dummy page instead
            attn_mask = valid.view(-1, 1, 1, max_len)
        bs, num_heads, _ = q.shape
        k = self._rows(layer, kv_indices, q.dtype)  # [b, 1, max_len, L]
        out = F.scaled_dot_product_attention(q.unsqueeze(1), k, k, attn_mask=attn_mask, scale=layer.scaling)
        return out[..., : self.kv_lora_rank].reshape(bs, num_heads * self.kv_lora_rank)  # [b, 1, H, L] -> [b, H * dv]
