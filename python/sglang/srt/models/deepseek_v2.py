"""DeepSeek-V2 / V2-Lite (DeepseekV2ForCausalLM) and DeepSeek-V3 / R1, Kimi-K2 (DeepseekV3ForCausalLM): the Llama
residual layout with

    attention  multi-head latent attention, absorbed: the KV cache holds one latent row per token and layer
               (models/deepseek_mla.py)
    MLP        dense in the first first_k_dense_replace layers, then routed + shared experts (models/deepseek_moe.py)
               routed by group-limited top-k (layers/moe/grouped_topk.py): V2 softmax (greedy or
               group_limited_greedy), V3 sigmoid with noaux_tc groups and e_score_correction_bias
A V3 checkpoint's multi-token-prediction layer (model.layers.{num_hidden_layers}.*, num_nextn_predict_layers of
them) is not part of the model: its tensors are skipped on load, named once in the log. With
--speculative-algorithm NEXTN they are the draft head's (models/deepseek_nextn.py, priced by
mem_plan/draft_heads.nextn_weights), which reads this model's final-normed hidden states (LlamaForCausalLM's
generic forward keeps them for it: hidden_capture_modes).
"""

from __future__ import annotations

import logging
import re
from typing import Optional, Tuple

from torch import nn

from sglang.srt.layers.moe.grouped_topk import GroupedTopK
from sglang.srt.layers.moe.moe_layer import QWEN_EXPERT_SHARDS, expert_checkpoint_target
from sglang.srt.models.deepseek_mla import DeepseekMLAttention, KVBProjection
from sglang.srt.models.deepseek_moe import DeepseekMoE, is_sparse_layer
from sglang.srt.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel
from sglang.srt.models.moe_block import check_experts_loaded

logger = logging.getLogger(__name__)

_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


class DeepseekV2DecoderLayer(LlamaDecoderLayer):
    attention_cls = DeepseekMLAttention
    routing = staticmethod(GroupedTopK.deepseek_v2)
    router_bias = False

    def make_mlp(self, config, layer_id: int) -> nn.Module:
        if is_sparse_layer(config, layer_id):
            return DeepseekMoE(config, self.routing(config), self.router_bias)
        return LlamaMLP(config.hidden_size, config.intermediate_size, getattr(config, "hidden_act", "silu"))


class DeepseekV3DecoderLayer(DeepseekV2DecoderLayer):
    routing = staticmethod(GroupedTopK.deepseek_v3)
    router_bias = True


class DeepseekV2Model(LlamaModel):
    decoder_layer_cls = DeepseekV2DecoderLayer


class DeepseekV3Model(LlamaModel):
    decoder_layer_cls = DeepseekV3DecoderLayer


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    model_cls = DeepseekV2Model
    # the shared experts' and dense MLPs' gate / up into one weight; the attention projections load as they are
    stacked_params_mapping = [(".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1)]

    def expert_weight_target(self, name: str) -> Optional[Tuple[str, int, str]]:
        return expert_checkpoint_target(name, QWEN_EXPERT_SHARDS)

    def load_weights(self, weights) -> None:
        num_layers = self.config.num_hidden_layers
        skipped = []

        def model_tensors():
            for name, tensor in weights:
                m = _LAYER_INDEX.match(name)
                if m is not None and int(m.group(1)) >= num_layers:
                    skipped.append(name)
                    continue
                yield name, tensor

        super().load_weights(model_tensors())
        for module in self.modules():
            if isinstance(module, KVBProjection):
                module.arrange()
        if skipped:
            layers = sorted({int(_LAYER_INDEX.match(n).group(1)) for n in skipped})
            which = str(layers[0]) if len(layers) == 1 else "{" + ",".join(map(str, layers)) + "}"
            logger.info("Skipped %d tensors of model.layers.%s.*, the multi-token-prediction layer "
                        "(num_nextn_predict_layers): not part of the %d-layer model (--speculative-algorithm NEXTN "
                        "loads it as its draft head)", len(skipped), which, num_layers)
        check_experts_loaded(self)


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    model_cls = DeepseekV3Model


EntryClass = [DeepseekV2ForCausalLM, DeepseekV3ForCausalLM]
