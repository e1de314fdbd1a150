"""Qwen3: Llama with per-head RMSNorm on q and k (before rope) and no qkv bias; head_dim is explicit. In bf16 on a CPU
with the kernels, the norms and the rotation are one in-place call on the qkv rows (sgl-kernel/csrc/cpu/qk_norm_rope.h)."""

from __future__ import annotations

import torch

from sglang.jit_kernel.cpu_ops import get_cpu_ops
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
        if self._kernel_prologue_(positions, qkv):
            q, k, v = qkv.view(n, -1, self.head_dim).split([self.num_heads, self.num_kv_heads, self.num_kv_heads], 1)
            return self.o_proj(self.attn(q, k, v, forward_batch))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # per-head norms over [N x heads, D] rows (2-D and contiguous: the CPU rmsnorm kernel takes them in bf16)
        q = self.q_norm(q.reshape(n * self.num_heads, self.head_dim)).view(n, self.num_heads, self.head_dim)
        k = self.k_norm(k.reshape(n * self.num_kv_heads, self.head_dim)).view(n, self.num_kv_heads, self.head_dim)
        q, _ = self.rotary_emb(positions, q)  # one tensor at a time: in place on the CPU rotary kernel path
        k, _ = self.rotary_emb(positions, k)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(q, k, v, forward_batch))

    def _kernel_prologue_(self, positions: torch.Tensor, qkv: torch.Tensor) -> bool:
        """bf16 on a CPU with the kernels: q/k norms and RoPE in one call, in place on qkv (qk_norm_rope.h, the same
        values as the two norms and two rotations of forward). Positions must be one per token (M-RoPE's [3, N] grid
        positions take the module path; its [N] positions are plain RoPE)."""
        if not (qkv.dtype == torch.bfloat16 and qkv.is_cpu and positions.dim() == 1 and positions.dtype == torch.int64):
            return False
        args = self._prologue_args()
        if args is None:
            return False
        ops, q_weight, k_weight, eps, table = args
        ops.qk_norm_rope_(qkv, positions, q_weight, k_weight, eps, self.num_heads, self.num_kv_heads, self.head_dim,
                          table)
        return True

    def _prologue_args(self):
        """(ops, q weight, k weight, eps, cos/sin table) when the kernel serves this layer, else None; looked up once
        (at batch 1 the module attribute lookups cost as much as the kernel)."""
        cached = self.__dict__.get("_prologue_cache")
        if cached is not None and cached[0] is get_cpu_ops():
            return cached[1]
        ops, table = get_cpu_ops(), self.rotary_emb.cos_sin_cache
        q_w, k_w = self.q_norm.weight, self.k_norm.weight
        ok = (ops is not None and table.dtype == q_w.dtype == k_w.dtype == torch.bfloat16
              and self.q_norm.variance_epsilon == self.k_norm.variance_epsilon)
        args = (ops, q_w, k_w, self.q_norm.variance_epsilon, table) if ok else None
        self.__dict__["_prologue_cache"] = (ops, args)
        return args


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3Model(LlamaModel):
    decoder_layer_cls = Qwen3DecoderLayer


class Qwen3ForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3Model


EntryClass = Qwen3ForCausalLM
