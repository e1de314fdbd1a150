"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (qkv bias) and, in its sparse layers, top-k
routed experts plus one shared expert gated per token by sigmoid(shared_expert_gate(x)) (models/moe_block.py)."""

from __future__ import annotations

from typing import Optional, Tuple

from torch import nn

from sglang.srt.layers.moe.moe_layer import QWEN_EXPERT_SHARDS, expert_checkpoint_target
from sglang.srt.models.moe_block import check_experts_loaded
from sglang.srt.models.qwen2 import Qwen2DecoderLayer, Qwen2ForCausalLM, Qwen2Model
from sglang.srt.models.qwen3_moe import qwen_moe_mlp


class Qwen2MoeDecoderLayer(Qwen2DecoderLayer):
    def make_mlp(self, config, layer_id: int) -> nn.Module:
        return qwen_moe_mlp(config, layer_id, getattr(config, "shared_expert_intermediate_size", 0) or 0)


class Qwen2MoeModel(Qwen2Model):
    decoder_layer_cls = Qwen2MoeDecoderLayer


class Qwen2MoeForCausalLM(Qwen2ForCausalLM):
    model_cls = Qwen2MoeModel

    def expert_weight_target(self, name: str) -> Optional[Tuple[str, int, str]]:
        return expert_checkpoint_target(name, QWEN_EXPERT_SHARDS)

    def load_weights(self, weights) -> None:
        super().load_weights(weights)
        check_experts_loaded(self)


EntryClass = Qwen2MoeForCausalLM
