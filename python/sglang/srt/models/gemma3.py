"""Gemma 3 (text; transformers' Gemma3ForCausalLM, model_type gemma3_text).

Beside Llama: every norm scales by (1 + w) in float32 (GemmaRMSNorm); q and k are normed per head before RoPE;
each layer's attention and MLP outputs are normed again before their residual add (post_attention_layernorm,
post_feedforward_layernorm; pre_feedforward_layernorm normalises the MLP's input); the embedding is multiplied by
sqrt(hidden) rounded to the model dtype; scores are scaled by query_pre_attn_scalar ** -0.5; the MLP is
gelu(tanh)(gate) * up; the vocabulary is tied.

Sliding ("local") and global layers: which layer is which and the window come from the planner's shape of the same
config.json (mem_plan/arch_gemma.py), so the model masks exactly the layers the plan
prices windowed (models/layer_windows.py). Local layers rotate with their own base (rope_parameters['sliding_attention'], formerly
rope_local_base_freq), global layers with rope_parameters['full_attention'] (rope scaling, e.g. linear x8 on the
27B, applies there only).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from sglang.jit_kernel.cpu_ops import get_cpu_ops, get_ops_for_dtype
from sglang.srt.configs.model_config import get_rope_parameters
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import get_rope
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.layer_windows import NO_WINDOW, layer_windows
from sglang.srt.models.llama import LlamaForCausalLM, LlamaModel

# transformers' layer_types names, by the planner's layer kind
_HF_LAYER_TYPE = {"sliding": "sliding_attention", "full": "full_attention"}


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + w), computed in float32 and rounded once to x's dtype (HF's Gemma3RMSNorm). `weight` is the
    checkpoint's w; `scale` (1 + w in float32) is derived from it by refresh() after loading: 1 + w held in bf16
    would round away most of w's bits."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
        self.register_buffer("scale", torch.ones(hidden_size, dtype=torch.float32), persistent=False)
        self.variance_epsilon = eps
        self.hidden_size = hidden_size

    def refresh(self) -> None:
        self.scale = 1.0 + self.weight.detach().float()

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        """x: [..., hidden]. With residual: (norm(x + residual), x + residual), the sum in x's dtype as HF adds."""
        if x.is_cpu and x.dim() == 2 and (residual is None or residual.is_contiguous()):
            x = x.contiguous()  # a k slice of the fused qkv output (one KV head) is a strided view
            ops = get_ops_for_dtype(x.dtype)  # the CPU kernel: the same fp32 math with the fp32 scale, one rounding
            if ops is not None:
                out, residual_out = ops.rmsnorm(x, residual, self.scale, self.variance_epsilon)
                return out if residual is None else (out, residual_out)
        if residual is not None:
            x = x + residual
            residual = x
        out = F.rms_norm(x.float(), (self.hidden_size,), self.scale, self.variance_epsilon).to(x.dtype)
        return out if residual is None else (out, residual)


def norm_pair(first: GemmaRMSNorm, second: GemmaRMSNorm, x: torch.Tensor,
              residual: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """second(first(x), residual): a sub-block's post-norm, then the next pre-norm with the residual add. bf16 rows on
    a CPU with the kernels: one call (rmsnorm_pair, the bits of the two), where a decode step made two per pair."""
    if x.is_cpu and x.dtype == torch.bfloat16 and x.dim() == 2 and x.is_contiguous() and residual.is_contiguous():
        ops = get_cpu_ops()
        if ops is not None:
            return ops.rmsnorm_pair(x, residual, first.scale, second.scale, first.variance_epsilon,
                                    second.variance_epsilon)
    return second(first(x), residual)


def layer_rope_parameters(config, kind: str) -> dict:
    """The rope settings of a layer of this kind: transformers-5 rope_parameters keyed by layer type, else the older
    rope_local_base_freq (local layers) beside rope_theta + rope_scaling (global layers)."""
    params = getattr(config, "rope_parameters", None) or {}
    nested = params.get(_HF_LAYER_TYPE[kind])
    if isinstance(nested, dict):
        out = dict(nested)
        out.setdefault("rope_type", out.get("type", "default"))
        return out
    if kind == "sliding":
        return {"rope_type": "default", "rope_theta": float(getattr(config, "rope_local_base_freq", 10000.0))}
    return get_rope_parameters(config)


class Gemma3MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str):
        super().__init__()
        if hidden_act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"Gemma 3: hidden_activation {hidden_act!r} is not supported; gelu_pytorch_tanh is.")
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=False)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = self.gate_up_proj.forward_gated(x, "gelu_tanh")  # a quantized gate_up: [N, I / tp] in one call
        if act is not None:
            return self.down_proj(act)
        gate_up = self.gate_up_proj(x)  # [N, 2I / tp]
        if gate_up.dtype == torch.bfloat16 and gate_up.is_cpu and gate_up.dim() == 2 and gate_up.is_contiguous():
            ops = get_cpu_ops()
            if ops is not None:  # the CPU kernel: torch's two roundings (gelu to bf16, then the product)
                return self.down_proj(ops.gelu_tanh_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)  # 2 x [N, I / tp]
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class Gemma3Attention(nn.Module):
    def __init__(self, config, layer_id: int, window: int):
        super().__init__()
        hidden = config.hidden_size
        total_heads, total_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, total_heads, total_kv, bias=bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        rope = layer_rope_parameters(config, "full" if window == NO_WINDOW else "sliding")
        self.rotary_emb = get_rope(self.head_dim, rotary_dim=self.head_dim, max_position=config.max_position_embeddings,
                                   base=rope["rope_theta"], rope_parameters=rope)
        self.attn = RadixAttention(self.num_heads, self.head_dim, config.query_pre_attn_scalar ** -0.5,
                                   num_kv_heads=self.num_kv_heads, layer_id=layer_id,
                                   sliding_window_size=window)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        n = hidden_states.shape[0]
        qkv = self.qkv_proj(hidden_states)  # [N, (H + 2KV) * D]
        if self._kernel_prologue_(positions, qkv):
            q, k, v = qkv.view(n, -1, self.head_dim).split([self.num_heads, self.num_kv_heads, self.num_kv_heads], 1)
            return self.o_proj(self.attn(q, k, v, forward_batch))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(n * self.num_heads, self.head_dim)).view(n, self.num_heads, self.head_dim)
        k = self.k_norm(k.reshape(n * self.num_kv_heads, self.head_dim)).view(n, self.num_kv_heads, self.head_dim)
        q, _ = self.rotary_emb(positions, q)
        k, _ = self.rotary_emb(positions, k)
        v = v.reshape(n, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(q, k, v, forward_batch))


    def _kernel_prologue_(self, positions: torch.Tensor, qkv: torch.Tensor) -> bool:
        """bf16 on a CPU with the kernels: both per-head norms (their fp32 scales) and RoPE in one in-place call on
        qkv (qk_norm_rope.h; the same values as the module path's norms and rotations, without its copies)."""
        if not (qkv.dtype == torch.bfloat16 and qkv.is_cpu and qkv.dim() == 2 and positions.dim() == 1
                and positions.dtype == torch.int64):
            return False
        ops, table = get_cpu_ops(), self.rotary_emb.cos_sin_cache
        if ops is None or table.dtype != torch.bfloat16 or self.q_norm.variance_epsilon != self.k_norm.variance_epsilon:
            return False
        ops.qk_norm_rope_(qkv, positions, self.q_norm.scale, self.k_norm.scale, self.q_norm.variance_epsilon,
                          self.num_heads, self.num_kv_heads, self.head_dim, table)
        return True


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config, layer_id: int, window: int):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Gemma3Attention(config, layer_id, window)
        self.mlp = Gemma3MLP(h, config.intermediate_size, getattr(config, "hidden_activation", "gelu_pytorch_tanh"))
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch,
                residual: Optional[torch.Tensor],
                post_norm: Optional[GemmaRMSNorm]) -> Tuple[torch.Tensor, torch.Tensor]:
        """-> (the MLP's output, residual). The MLP's post_feedforward_layernorm is the caller's to run, with the next
        norm as one norm_pair: post_norm is the previous layer's, run here with input_layernorm (none for layer 0,
        whose hidden_states are the embeddings and residual None)."""
        # residual carries the stream; hidden_states the last sub-block's output, normed and added at the next norm
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = norm_pair(post_norm, self.input_layernorm, hidden_states, residual)
        attn = self.self_attn(positions, hidden_states, forward_batch)
        pre_ff = self.pre_feedforward_layernorm
        hidden_states, residual = norm_pair(self.post_attention_layernorm, pre_ff, attn, residual)
        return self.mlp(hidden_states), residual


class Gemma3Model(LlamaModel):
    def __init__(self, config):
        nn.Module.__init__(self)
        from sglang.srt.layers.vocab_embedding import VocabParallelEmbedding

        self.config = config
        windows = layer_windows(config, "gemma3_text")
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Gemma3DecoderLayer(config, i, windows[i])
                                     for i in range(config.num_hidden_layers)])
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch,
                input_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        if input_embeds is None:
            input_embeds = self.embed_tokens(input_ids)
            # HF rounds sqrt(hidden) to the model dtype before multiplying (25.25 in bf16 for 640 where sqrt is 25.30)
            input_embeds = input_embeds * torch.tensor(self.config.hidden_size ** 0.5, dtype=input_embeds.dtype)
        hidden_states, residual, post_norm = input_embeds, None, None
        for layer in self.layers:  # each layer's post-feedforward norm runs with the next norm (norm_pair)
            hidden_states, residual = layer(positions, hidden_states, forward_batch, residual, post_norm)
            post_norm = layer.post_feedforward_layernorm
        return norm_pair(post_norm, self.norm, hidden_states, residual)[0]


class Gemma3ForCausalLM(LlamaForCausalLM):
    model_cls = Gemma3Model

    def __init__(self, config):
        if getattr(config, "final_logit_softcapping", None) or getattr(config, "attn_logit_softcapping", None):
            raise ValueError("Gemma 3: logit soft-capping (final_logit_softcapping / attn_logit_softcapping) is not "
                             "served; set them to null in config.json")
        super().__init__(config)

    def load_weights(self, weights) -> None:
        super().load_weights(weights)
        for module in self.modules():
            if isinstance(module, GemmaRMSNorm):
                module.refresh()


EntryClass = Gemma3ForCausalLM
