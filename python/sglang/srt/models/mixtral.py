"""Mixtral (8x7B, 8x22B): Llama's attention and, in every layer, top-k of E experts renormalised over the k chosen
(transformers' MixtralTopKRouter always renormalises), no shared expert. The checkpoint's block_sparse_moe is this
runtime's mlp (models/moe_block.py); its experts' w1 / w3 / w2 are the gate / up / down projections."""

from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch
from torch import nn

from sglang.srt.layers.moe.moe_layer import MIXTRAL_EXPERT_SHARDS, expert_checkpoint_target
from sglang.srt.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from sglang.srt.models.moe_block import SparseMoeBlock, check_experts_loaded


class MixtralDecoderLayer(LlamaDecoderLayer):
    def make_mlp(self, config, layer_id: int) -> nn.Module:
        return SparseMoeBlock(config.hidden_size, config.num_local_experts, config.num_experts_per_tok,
                              config.intermediate_size, renormalize=True,
                              hidden_act=getattr(config, "hidden_act", "silu"))


class MixtralModel(LlamaModel):
    decoder_layer_cls = MixtralDecoderLayer


class MixtralForCausalLM(LlamaForCausalLM):
    model_cls = MixtralModel

    def __init__(self, config):
        if getattr(config, "sliding_window", None):
            raise ValueError(f"Mixtral with sliding_window={config.sliding_window}: sliding-window attention is not "
                             "supported; this runtime attends over the whole context.")
        super().__init__(config)

    def expert_weight_target(self, name: str) -> Optional[Tuple[str, int, str]]:
        return expert_checkpoint_target(name, MIXTRAL_EXPERT_SHARDS)

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        super().load_weights((name.replace(".block_sparse_moe.", ".mlp."), w) for name, w in weights)
        check_experts_loaded(self)


EntryClass = MixtralForCausalLM
