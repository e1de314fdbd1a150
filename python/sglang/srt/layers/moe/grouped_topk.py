"""Group-limited top-k routing of DeepSeek's MoE layers (V2, V3 / R1, Kimi-K2), as their checkpoints define it.

The E experts form num_groups equal groups of consecutive ids. For each token:

    scores   = softmax(logits) (V2) or sigmoid(logits) (V3), fp32            [M, E]
    choice   = scores + e_score_correction_bias (V3; V2 has none)             [M, E]
    group    = max of choice over the group (V2 group_limited_greedy) or the sum of its two largest
               (V3 noaux_tc)                                                  [M, G]
    the topk_groups best groups are kept, every other expert is out; the top_k experts by `choice` among the
    kept ones are the ids, their weights the UNCORRECTED scores (the bias steers selection, never the mix)
    weights  = weights / sum(weights)  when renormalising (V3: norm_topk_prob; V2: norm_topk_prob and top_k > 1)
    weights *= routed_scaling_factor   (V3 always; V2 only when it does not renormalise, as DeepSeek-V2's released
                                        modeling code does -- transformers 5 ignores V2's norm_topk_prob, and
                                        every published V2 config sets it false, where both agree)
num_groups 1 (V2's topk_method "greedy", Kimi-K2's n_group 1) is plain top-k. The weights fold the scaling factor
in, so the experts' weighted sum is the routed output (fused_experts' signature, layers/moe/__init__.py). Weights
stay fp32; ids are int32 and ordered by decreasing `choice` (the set is what matters: equal scores are the only
case where torch.topk's order and the reference's unsorted one could pick differently).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

SOFTMAX, SIGMOID = "softmax", "sigmoid"
GROUP_MAX, GROUP_TOP2_SUM = "max", "top2_sum"


@dataclass(frozen=True)
class GroupedTopK:
    num_experts: int
    top_k: int
    scoring: str  # SOFTMAX | SIGMOID
    num_groups: int  # 1: no group limit
    topk_groups: int
    group_score: str  # GROUP_MAX | GROUP_TOP2_SUM
    renormalize: bool
    scaling_factor: float  # routed_scaling_factor, folded into the weights

    def __post_init__(self):
        if self.scoring not in (SOFTMAX, SIGMOID) or self.group_score not in (GROUP_MAX, GROUP_TOP2_SUM):
            raise ValueError(f"unknown routing {self.scoring!r} / group score {self.group_score!r}")
        if self.num_groups < 1 or self.num_experts % self.num_groups:
            raise ValueError(f"n_group {self.num_groups} does not divide the {self.num_experts} routed experts")
        per_group = self.num_experts // self.num_groups
        if not 1 <= self.topk_groups <= self.num_groups or self.topk_groups * per_group < self.top_k:
            raise ValueError(f"topk_group {self.topk_groups} of n_group {self.num_groups} groups ({per_group} experts "
                             f"each) cannot hold num_experts_per_tok {self.top_k} experts")
        if self.group_score == GROUP_TOP2_SUM and self.num_groups > 1 and per_group < 2:
            raise ValueError(f"noaux_tc scores a group by its two best experts; n_group {self.num_groups} leaves "
                             f"{per_group} per group")

    @classmethod
    def deepseek_v2(cls, config) -> "GroupedTopK":
        """V2 / V2-Lite: softmax; topk_method greedy (no groups) or group_limited_greedy (groups by their max)."""
        method = getattr(config, "topk_method", None) or "greedy"
        if method not in ("greedy", "group_limited_greedy"):
            raise ValueError(f"DeepSeek-V2 topk_method {method!r} is not served; known: greedy, group_limited_greedy")
        _check_scoring(config, SOFTMAX)
        grouped = method == "group_limited_greedy"
        top_k = config.num_experts_per_tok
        renormalize = bool(getattr(config, "norm_topk_prob", False)) and top_k > 1
        return cls(config.n_routed_experts, top_k, SOFTMAX, config.n_group if grouped else 1,
                   config.topk_group if grouped else 1, GROUP_MAX, renormalize,
                   1.0 if renormalize else float(getattr(config, "routed_scaling_factor", 1.0) or 1.0))

    @classmethod
    def deepseek_v3(cls, config) -> "GroupedTopK":
        """V3 / R1 / Kimi-K2: sigmoid, noaux_tc groups scored by their two best corrected scores (transformers'
        DeepseekV3TopkRouter applies it whatever topk_method says; the published configs say noaux_tc)."""
        _check_scoring(config, SIGMOID)
        return cls(config.n_routed_experts, config.num_experts_per_tok, SIGMOID, getattr(config, "n_group", None) or 1,
                   getattr(config, "topk_group", None) or 1, GROUP_TOP2_SUM,
                   bool(getattr(config, "norm_topk_prob", False)),
                   float(getattr(config, "routed_scaling_factor", 1.0) or 1.0))

    def select(self, router_logits: torch.Tensor, correction_bias: Optional[torch.Tensor] = None
               ) -> Tuple[torch.Tensor, torch.Tensor]:
        """router_logits [M, E] (any float dtype), correction_bias fp32 [E] or None -> (weights fp32 [M, k],
        ids int32 [M, k])."""
        logits = router_logits.float()
        scores = torch.softmax(logits, dim=-1) if self.scoring == SOFTMAX else torch.sigmoid(logits)
        choice = scores if correction_bias is None else scores + correction_bias.float()
        if self.num_groups > 1 and self.topk_groups < self.num_groups:
            m = choice.shape[0]
            grouped = choice.view(m, self.num_groups, -1)
            if self.group_score == GROUP_MAX:
                group_scores = grouped.amax(dim=-1)
            else:
                group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
            kept = torch.topk(group_scores, self.topk_groups, dim=-1).indices  # [M, topk_groups]
            out_of_group = torch.ones_like(group_scores, dtype=torch.bool).scatter_(1, kept, False)
            choice = grouped.masked_fill(out_of_group.unsqueeze(-1), float("-inf")).view(m, -1)
        ids = torch.topk(choice, self.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        if self.scaling_factor != 1.0:
            weights = weights * self.scaling_factor
        return weights, ids.to(torch.int32)


def _check_scoring(config, expected: str) -> None:
    scoring = getattr(config, "scoring_func", None) or expected
    if scoring != expected:
        raise ValueError(f"scoring_func {scoring!r}: this architecture routes by {expected} "
                         f"(model_type {getattr(config, 'model_type', '?')!r})")
