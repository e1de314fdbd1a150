"""ForwardBatch: what one model forward needs, built by the scheduler, read by the model and attention backend.

Index conventions (shared by the scheduler, the pools and every attention backend):
  * B requests, N new tokens in total (N == B in decode).
  * Request b owns row `req_pool_indices[b]` of `req_to_token_pool.req_to_token`;
    `req_to_token[row, 0:seq_lens[b]]` are the KV slots of its tokens after this forward.
  * EXTEND: request b contributes tokens [extend_prefix_lens[b], seq_lens[b]) of its sequence;
    `extend_seq_lens[b] = seq_lens[b] - extend_prefix_lens[b]`; tokens are concatenated in request order.
  * DECODE: one new token per request, at position seq_lens[b] - 1.
  * `out_cache_loc[i]` is the KV slot the i-th new token is written to (already recorded in req_to_token).
  * Slot 0 of the KV pool is a dummy slot that is never handed out.

Device placement happens in one place: the scheduler builds a ForwardBatch on the host and the model runner calls
`move_to_device(batch, device)` once per step before the forward. This module imports no backend or layer module
(attn_backend is typed by duck: layers/attention/base_attn_backend.AttentionBackend), so
forward_batch_info <- base_attn_backend <- radix_attention has no import cycle.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, List, Optional

import torch

if TYPE_CHECKING:
    from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool


class ForwardMode(enum.IntEnum):
    EXTEND = 1  # prefill, possibly of a chunk, possibly after a cached prefix
    DECODE = 2

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    req_pool_indices: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64, lengths after this forward
    out_cache_loc: torch.Tensor  # [N] int64
    # CPU copies, for backends that plan on the host
    seq_lens_cpu: List[int] = field(default_factory=list)
    req_pool_indices_cpu: List[int] = field(default_factory=list)
    extend_prefix_lens_cpu: List[int] = field(default_factory=list)
    extend_seq_lens_cpu: List[int] = field(default_factory=list)
    extend_prefix_lens: Optional[torch.Tensor] = None  # [B] int64 (EXTEND only)
    extend_seq_lens: Optional[torch.Tensor] = None  # [B] int64 (EXTEND only)
    # which hidden rows the logits are computed for: the last token of each request ([B] int64 into [0, N))
    logits_indices: Optional[torch.Tensor] = None
    # prompt logprobs (EXTEND; layers/prompt_logprobs.py): hidden rows [M] int64 to score, projected
    # prompt_logprob_block_rows at a time; the spec (rank 0 only) in, one RowLogprobs per row out
    prompt_logprob_rows: Optional[torch.Tensor] = None
    prompt_logprob_block_rows: int = 0
    prompt_logprob_spec: Any = None
    prompt_logprob_result: Optional[List[Any]] = None
    prompt_logprob_owners: Any = None  # the scheduler's own: which request each run of rows belongs to

    req_to_token_pool: Optional["ReqToTokenPool"] = None
    token_to_kv_pool: Optional["KVCache"] = None
    attn_backend: Any = None  # an AttentionBackend (layers/attention/base_attn_backend.py)

    # multimodal: per-batch input embeddings overrides (see the multimodal model), opaque here
    mm_inputs: Optional[List[Any]] = None
    # M-RoPE models (EXTEND with a multimodal request): [3, N] int64 (t, h, w) positions; None: `positions` on
    # all three axes (decode positions already include each request's delta)
    mrope_positions: Optional[torch.Tensor] = None
    # an embedding server (--is-embedding): "last" / "mean"; the forward returns pooled hidden rows [B, hidden]
    # float32 instead of logits (layers/pooler.py)
    pooling: Optional[str] = None
    # speculative decoding with a hidden-state draft (EAGLE, EAGLE3, NEXTN): which target features this forward keeps
    # for EVERY input row (before the logits rows are picked) -- None; "last": the final-normed hidden state the
    # lm_head reads, [N, H]; "aux": the residual stream after each of the model's aux_layer_ids, concatenated in that
    # order, [N, len(ids) x H]. The model writes them to captured_hidden (ModelRunner sets the mode per server)
    capture_hidden: Optional[str] = None
    captured_hidden: Optional[torch.Tensor] = None
    # a batch whose logits rows only the sampler's argmax of the raw logits would read (BatchRunner._greedy_only):
    # the LogitsProcessor may return each logits row's greedy token id (int64 [B], extend: a chunk's row too) instead
    # of the logits, and then sets greedy_fused (a packed GGUF lm_head at tp 1: quantization/vocab_method.py)
    greedy_only: bool = False
    greedy_fused: bool = False


def move_to_device(batch: ForwardBatch, device) -> ForwardBatch:
    """Move every tensor field of the batch to `device`, in place (non-blocking from pinned memory; a no-op for
    tensors already there). The host-side lists (`*_cpu`) and `mm_inputs` stay as they are."""
    device = torch.device(device)
    for f in fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor) and value.device != device:
            setattr(batch, f.name, value.to(device, non_blocking=True))
    return batch
