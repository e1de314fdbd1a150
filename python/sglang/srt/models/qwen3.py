"""Qwen3: Llama with per-head RMSNorm on q and k (before rope) and no qkv bias; head_dim is explicit."""

from __future__ import annotations

import torch

from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


class Qwen3Attention(LlamaAttention):
    def __init__(self, config, layer_id: int):
        super().__init__(config, layer_id)
        self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        n = hidden_states.shape[0]
        qkv = self.qkv_proj(hidden_states)  # [N, (H + 2KV) * D]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # per-head norms over [N x heads, D] rows (2-D and contiguous: the CPU rmsnorm kernel takes them in bf16)
        q = self.q_norm(q.reshape(n * self.num_heads, self.head_dim)).view(n, self.num_heads, self.head_dim)
        k = self.k_norm(k.reshape(n * self.num_kv_heads, self.head_dim)).view(n, self.num_kv_heads, self.head_dim)
        q, _ = self.rotary_emb(positions, q)  # one tensor at a time: in place on the CPU rotary kernel path
        k, _ = self.rotary_emb(positions, k)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(q, k, v, forward_batch))


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3Model(LlamaModel):
    decoder_layer_cls = Qwen3DecoderLayer


class Qwen3ForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3Model


EntryClass = Qwen3ForCausalLM
