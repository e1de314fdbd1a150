"""Qwen3-Next (Qwen3NextForCausalLM; transformers' modeling_qwen3_next semantics).

Decoder layers of two kinds, in the order the planner reads them (mem_plan/arch_qwen3_next.layer_kinds: config.json's
layer_types, else every full_attention_interval-th layer full):
    linear  Gated DeltaNet (models/qwen3_next_linear.py), its state in the request slot's linear-state row
    full    gated attention: q_proj yields per head the query and an output gate (heads of 2 d, query first); q / k
            RMSNormed per head, rope on the first partial_rotary_factor of each head, output * sigmoid(gate)
Every layer's MLP is the Qwen MoE block (sparse unless in mlp_only_layers or off decoder_sparse_step): softmax top-k
(renormalised when norm_topk_prob) plus a shared expert scaled by sigmoid(shared_expert_gate(x)) (models/moe_block.py).
Every RMSNorm but the Gated DeltaNet's output norm scales by (1 + w) in fp32 (zero-centred weights: GemmaRMSNorm).

The KV pool holds the full-attention layers only: a full layer's RadixAttention layer_id is its ordinal among the full
layers (0..n_full-1), as a linear layer's state index is its ordinal among the linear layers.
The checkpoint's multi-token-prediction tensors (mtp.*) are skipped on load, named once in the log.
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import torch
from torch import nn

from sglang.srt.configs.model_config import get_rope_parameters
from sglang.srt.layers.linear import QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.moe.moe_layer import QWEN_EXPERT_SHARDS, expert_checkpoint_target
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import get_rope
from sglang.srt.layers.vocab_embedding import VocabParallelEmbedding
from sglang.srt.mem_plan.model_shapes import text_shape_from_config
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.gemma3 import GemmaRMSNorm
from sglang.srt.models.layer_windows import config_dict
from sglang.srt.models.llama import LlamaForCausalLM, LlamaModel
from sglang.srt.models.moe_block import check_experts_loaded
from sglang.srt.models.qwen3_moe import qwen_moe_mlp
from sglang.srt.models.qwen3_next_linear import Qwen3NextGatedDeltaNet

logger = logging.getLogger(__name__)

MTP_PREFIX = "mtp."
# transformers' Qwen3NextConfig default, when rope_parameters does not name it
PARTIAL_ROTARY_FACTOR_DEFAULT = 0.25


def layer_kinds(config) -> Tuple[str, ...]:
    """"linear" / "full" per decoder layer, from the planner's shape of the same config (the state pool and the KV pool
    are sized from it, so the model must agree)."""
    kinds = text_shape_from_config(config_dict(config, "qwen3_next")).kinds()
    other = sorted(set(kinds) - {"linear", "full"})
    if other:
        raise ValueError(f"qwen3_next: layer kinds {other} are not served (only linear_attention / full_attention)")
    return kinds


class Qwen3NextAttention(nn.Module):
    def __init__(self, config, full_layer: int):
        super().__init__()
        d = self.head_dim = config.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        # the query and its gate as 2 nq heads of d: head 2h is query h, head 2h + 1 its gate (q_proj's row order),
        # so a rank's contiguous block of "heads" is whole (query, gate) pairs
        self.qkv_proj = QKVParallelLinear(config.hidden_size, d, 2 * config.num_attention_heads,
                                          config.num_key_value_heads, bias=bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads // 2, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(config.num_attention_heads * d, config.hidden_size, bias=bias)
        self.q_norm = GemmaRMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(d, eps=config.rms_norm_eps)
        rope = get_rope_parameters(config)
        factor = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
        self.rotary_emb = get_rope(d, rotary_dim=int(d * (factor or PARTIAL_ROTARY_FACTOR_DEFAULT)),
                                   max_position=config.max_position_embeddings, base=rope["rope_theta"],
                                   rope_parameters=rope)
        self.attn = RadixAttention(self.num_heads, d, d ** -0.5, num_kv_heads=self.num_kv_heads, layer_id=full_layer)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch
                ) -> torch.Tensor:
        n, d, h, kv = hidden_states.shape[0], self.head_dim, self.num_heads, self.num_kv_heads
        qg, k, v = self.qkv_proj(hidden_states).split([2 * h * d, kv * d, kv * d], dim=-1)
        q, gate = qg.view(n, h, 2 * d).split([d, d], dim=-1)
        q = self.q_norm(q.reshape(n * h, d)).view(n, h, d)
        k = self.k_norm(k.reshape(n * kv, d)).view(n, kv, d)
        q, _ = self.rotary_emb(positions, q)
        k, _ = self.rotary_emb(positions, k)
        out = self.attn(q, k, v.reshape(n, kv, d), forward_batch)  # [N, h d]
        return self.o_proj(out * torch.sigmoid(gate.reshape(n, h * d)))


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(self, config, layer_id: int, kind: str, kind_ordinal: int):
        super().__init__()
        self.is_linear = kind == "linear"
        if self.is_linear:
            self.linear_attn = Qwen3NextGatedDeltaNet(config, kind_ordinal)
        else:
            self.self_attn = Qwen3NextAttention(config, kind_ordinal)
        self.mlp = qwen_moe_mlp(config, layer_id, getattr(config, "shared_expert_intermediate_size", 0) or 0)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch,
                residual: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        mixer = self.linear_attn if self.is_linear else self.self_attn
        hidden_states = mixer(positions, hidden_states, forward_batch)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class Qwen3NextModel(LlamaModel):
    def __init__(self, config):
        nn.Module.__init__(self)  # LlamaModel's forward, not its layers or norm
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        kinds = layer_kinds(config)
        self.layers = nn.ModuleList([Qwen3NextDecoderLayer(config, i, kind, kinds[:i].count(kind))
                                     for i, kind in enumerate(kinds)])
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class Qwen3NextForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3NextModel
    stacked_params_mapping = [
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
        (".in_proj", ".in_proj_qkvz", 0),
        (".in_proj", ".in_proj_ba", 1),
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    ]

    def expert_weight_target(self, name: str) -> Optional[Tuple[str, int, str]]:
        return expert_checkpoint_target(name, QWEN_EXPERT_SHARDS)

    def load_weights(self, weights) -> None:
        skipped = []

        def model_tensors():
            for name, tensor in weights:
                if name.startswith(MTP_PREFIX):
                    skipped.append(name)
                    continue
                yield name.replace(".conv1d.weight", ".conv1d_weight"), tensor

        super().load_weights(model_tensors())
        if skipped:
            logger.info("Skipped %d tensors of mtp.*, the multi-token-prediction layer: not part of the served model "
                        "(no speculative decoding)", len(skipped))
        check_experts_loaded(self)
        for module in self.modules():
            if isinstance(module, GemmaRMSNorm):
                module.refresh()


EntryClass = Qwen3NextForCausalLM
