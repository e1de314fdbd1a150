"""DeepSeek's MoE MLP (V2, V3 / R1, Kimi-K2): routed experts chosen by group-limited top-k, plus shared experts.

    gate            ReplicatedLinear [E, hidden] (dense under --quantization); V3 adds gate.e_score_correction_bias,
                    fp32 [E] (the checkpoint's dtype: mem_plan/arch_deepseek.V3_ROUTER_BIAS)
    experts         FusedMoE's stacked weights, loaders and implementations (layers/moe/moe_layer.py), routed by
                    layers/moe/grouped_topk.py instead of plain top-k softmax
    shared_experts  one dense gated MLP of n_shared_experts x moe_intermediate_size, added unscaled
Which layers are sparse: layer_id >= first_k_dense_replace and layer_id % moe_layer_freq == 0 (DeepSeek's rule,
mem_plan/arch_deepseek.py's; transformers ignores moe_layer_freq, 1 in every published config). With tp ranks the
routed and shared experts each leave a partial sum over their intermediate columns: one all-reduce per block.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from sglang.srt.distributed.communication_op import tp_all_reduce
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.moe.grouped_topk import GroupedTopK
from sglang.srt.layers.moe.moe_layer import FusedMoE
from sglang.srt.layers.quantization import dense_linear
from sglang.srt.models.llama import LlamaMLP


def is_sparse_layer(config, layer_id: int) -> bool:
    if not getattr(config, "n_routed_experts", None):
        return False
    first = getattr(config, "first_k_dense_replace", 0) or 0
    return layer_id >= first and layer_id % (getattr(config, "moe_layer_freq", 1) or 1) == 0


class GroupedTopKExperts(FusedMoE):
    """FusedMoE whose routing is a GroupedTopK (with an optional correction bias) rather than top-k softmax."""

    def __init__(self, routing: GroupedTopK, hidden_size: int, intermediate_size: int):
        super().__init__(routing.num_experts, routing.top_k, hidden_size, intermediate_size, routing.renormalize,
                         reduce_results=False)
        self.routing = routing

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor,
                correction_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """hidden [M, K], router_logits [M, E], the gate's fp32 correction bias [E] or None -> this rank's partial
        sum [M, K] (routed_scaling_factor included). After the routing, FusedMoE.forward's steps."""
        topk_weights, topk_ids = self.routing.select(router_logits, correction_bias)
        if self.layout.ep_size > 1:
            topk_ids = self.local_expert_ids(topk_ids)
        ws, w13, w2 = self.workspace, self.w13_weight, self.w2_weight
        step = ws.max_tokens if ws is not None else max(hidden.shape[0], 1)
        if hidden.shape[0] <= step:
            return self.fused_experts(hidden, w13, w2, topk_weights, topk_ids, ws)
        return torch.cat([self.fused_experts(hidden[i: i + step], w13, w2, topk_weights[i: i + step],
                                             topk_ids[i: i + step], ws)
                          for i in range(0, hidden.shape[0], step)])


class DeepseekMoE(nn.Module):
    def __init__(self, config, routing: GroupedTopK, router_bias: bool):
        super().__init__()
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"Unsupported expert activation {act!r}; only silu is supported.")
        with dense_linear():  # the router stays dense under --quantization
            self.gate = ReplicatedLinear(config.hidden_size, routing.num_experts, bias=False)
        self.experts = GroupedTopKExperts(routing, config.hidden_size, config.moe_intermediate_size)
        if router_bias:  # checkpoint name: mlp.gate.e_score_correction_bias
            self.gate.e_score_correction_bias = nn.Parameter(
                torch.zeros(routing.num_experts, dtype=torch.float32), requires_grad=False)
        shared = (getattr(config, "n_shared_experts", 0) or 0) * config.moe_intermediate_size
        self.shared_experts = LlamaMLP(config.hidden_size, shared, act, reduce_results=False) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [N, hidden] -> router logits [N, E] -> [N, hidden]
        out = self.experts(x, self.gate(x), getattr(self.gate, "e_score_correction_bias", None))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return tp_all_reduce(out)
