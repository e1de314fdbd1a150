"""gpt-oss (gpt-oss-20b / -120b; transformers' GptOssForCausalLM): the Llama residual layout with

    attention  q/k/v/o with biases, GQA, YaRN RoPE, a window on the "sliding_attention" layers (layer_types;
               absent: every other layer from layer 0, window 128), and one learned sink logit per query head
               that joins the softmax denominator (RadixAttention's sinks)
    MLP        every layer a MoE block: a biased router, top-k then softmax over the chosen, experts with biases
               and the clamped SwiGLU (layers/moe/gpt_oss_experts.py; bf16 or mxfp4 checkpoints)
The layer windows come from the planner's shape (models/layer_windows.py), so the pool it sizes is the one masked.
Tensor parallel: heads (and their sinks) and the experts' intermediate columns split over the ranks; one all-reduce
per attention output and per MoE block.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from sglang.srt.distributed.communication_op import tp_all_reduce
from sglang.srt.distributed.parallel_state import get_tp_rank
from sglang.srt.layers.linear import ReplicatedLinear, RowParallelLinear, default_weight_loader
from sglang.srt.layers.moe.gpt_oss_experts import GptOssExperts, gpt_oss_expert_target
from sglang.srt.layers.quantization import dense_linear
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.model_loader.weight_utils import materialize
from sglang.srt.models.layer_windows import layer_windows
from sglang.srt.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel

SINKS_PARAM = "attn.sinks"  # where the checkpoint's self_attn.sinks lives: in RadixAttention, registered once


class GptOssAttention(LlamaAttention):
    def __init__(self, config, layer_id: int):
        super().__init__(config, layer_id)
        self.o_proj = RowParallelLinear(config.num_attention_heads * self.head_dim, self.hidden_size,
                                        bias=bool(config.attention_bias))
        # fp32 whatever the model dtype: the backends add them to fp32 scores (a bf16 checkpoint's values are exact)
        sinks = nn.Parameter(torch.empty(self.num_heads, dtype=torch.float32), requires_grad=False)
        sinks.weight_loader = self._load_sinks
        self.attn = RadixAttention(self.num_heads, self.head_dim, self.head_dim**-0.5, num_kv_heads=self.num_kv_heads,
                                   layer_id=layer_id, sliding_window_size=layer_windows(config, "gpt_oss")[layer_id],
                                   sinks=sinks)

    def _load_sinks(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """The checkpoint's [H] sinks -> this rank's heads (QKVParallelLinear gives rank r heads [r H_r, (r+1) H_r))."""
        default_weight_loader(param, materialize(loaded.narrow(0, get_tp_rank() * self.num_heads, self.num_heads)))


class GptOssMoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        with dense_linear():  # the router stays dense under --quantization
            self.router = ReplicatedLinear(config.hidden_size, config.num_local_experts, bias=True)
        self.experts = GptOssExperts(config.num_local_experts, config.num_experts_per_tok, config.hidden_size,
                                     config.intermediate_size, config.swiglu_alpha, config.swiglu_limit)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [N, hidden] -> router logits [N, E] -> [N, hidden]
        return tp_all_reduce(self.experts(x, self.router(x)))


class GptOssDecoderLayer(LlamaDecoderLayer):
    attention_cls = GptOssAttention

    def make_mlp(self, config, layer_id: int) -> nn.Module:
        return GptOssMoE(config)


class GptOssModel(LlamaModel):
    decoder_layer_cls = GptOssDecoderLayer


class GptOssForCausalLM(LlamaForCausalLM):
    model_cls = GptOssModel

    def expert_weight_target(self, name: str) -> Optional[Tuple[str, int, str]]:
        return gpt_oss_expert_target(name)

    def load_weights(self, weights) -> None:
        # the checkpoint's self_attn.sinks is the parameter RadixAttention holds
        super().load_weights((name.replace("self_attn.sinks", f"self_attn.{SINKS_PARAM}"), w) for name, w in weights)
        for name, module in self.named_modules():
            if isinstance(module, GptOssExperts) and module.missing_tensors():
                raise ValueError(f"Checkpoint is missing expert tensors of {name}: {module.missing_tensors()} "
                                 "(an mxfp4 projection needs both its _blocks and its _scales)")


EntryClass = GptOssForCausalLM
