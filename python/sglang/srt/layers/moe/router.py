"""Top-k softmax routing, as the HF checkpoints define it (transformers' Qwen2Moe / Qwen3Moe / Mixtral routers):

    probs = softmax(router_logits in fp32)        [M, E]
    topk_weights, topk_ids = top-k of probs       [M, k], ids ordered by decreasing weight (torch.topk)
    renormalise: topk_weights /= their sum        Qwen: when config.norm_topk_prob; Mixtral: always

The weights stay fp32 for every activation dtype (the Qwen references cast them back to the model dtype before
scaling the expert outputs: identical in fp32, a bf16 rounding apart in bf16). The ids are int32, what the kernels
take.
"""

from __future__ import annotations

from typing import Tuple

import torch


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """router_logits [M, E] (any float dtype) -> (topk_weights fp32 [M, k], topk_ids int32 [M, k])."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids.to(torch.int32)
