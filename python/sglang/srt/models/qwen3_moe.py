"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (q/k norms) and, in its sparse layers, top-k of E
routed experts (renormalised when config.norm_topk_prob), no shared expert (models/moe_block.py)."""

from __future__ import annotations

from typing import Optional, Tuple

from torch import nn

from sglang.srt.layers.moe.moe_layer import QWEN_EXPERT_SHARDS, expert_checkpoint_target
from sglang.srt.models.llama import LlamaMLP
from sglang.srt.models.moe_block import SparseMoeBlock, check_experts_loaded, is_sparse_layer, num_routed_experts
from sglang.srt.models.qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM, Qwen3Model


def qwen_moe_mlp(config, layer_id: int, shared_expert_intermediate_size: int = 0) -> nn.Module:
    """A Qwen MoE layer's MLP: the sparse block, or the dense MLP in mlp_only_layers / off-stride layers."""
    act = getattr(config, "hidden_act", "silu")
    if not is_sparse_layer(config, layer_id):
        return LlamaMLP(config.hidden_size, config.intermediate_size, act)
    return SparseMoeBlock(config.hidden_size, num_routed_experts(config), config.num_experts_per_tok,
                          config.moe_intermediate_size, bool(getattr(config, "norm_topk_prob", False)),
                          shared_expert_intermediate_size, act)


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    def make_mlp(self, config, layer_id: int) -> nn.Module:
        return qwen_moe_mlp(config, layer_id)


class Qwen3MoeModel(Qwen3Model):
    decoder_layer_cls = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    model_cls = Qwen3MoeModel

    def expert_weight_target(self, name: str) -> Optional[Tuple[str, int, str]]:
        return expert_checkpoint_target(name, QWEN_EXPERT_SHARDS)

    def load_weights(self, weights) -> None:
        super().load_weights(weights)
        check_experts_loaded(self)


EntryClass = Qwen3MoeForCausalLM
