"""Top-k softmax routing, as the HF checkpoints define it (transformers' Qwen2Moe / Qwen3Moe / Mixtral routers):

    probs = softmax(router_logits in fp32)        [M, E]
    topk_weights, topk_ids = top-k of probs       [M, k], ids ordered by decreasing weight (torch.topk)
    renormalise: topk_weights /= their sum        Qwen: when config.norm_topk_prob; Mixtral: always

The weights stay fp32 for every activation dtype (the Qwen references cast them back to the model dtype before
scaling the expert outputs: identical in fp32, a bf16 rounding apart in bf16). The ids are int32, what the kernels
take.

bf16 router logits on a CPU with the kernels loaded take one call of sgl-kernel/csrc/cpu/moe_router.h instead of the
five torch operators (each an OpenMP region, ~20 us a layer at batch 1 in the server's scheduler): the same formula,
weights within a few fp32 ulps of torch's (its own vector exp), and one stated rule for ties where torch.topk leaves
the order to its selection algorithm: equal probabilities are taken lower expert id first (in bf16, logits tie
often: on random N(0, 2) logits over 64 experts ~2% of rows tie at the k-th place, and the chosen set can then differ
from torch's). fp32 logits keep the torch path, the one the HF references run.
"""

from __future__ import annotations

from typing import Tuple

import torch

from sglang.jit_kernel.cpu_ops import get_cpu_ops


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """router_logits [M, E] (any float dtype) -> (topk_weights fp32 [M, k], topk_ids int32 [M, k])."""
    if router_logits.dtype == torch.bfloat16 and router_logits.is_cpu:
        ops = get_cpu_ops()
        if ops is not None:
            return ops.topk_softmax(router_logits, top_k, renormalize)
    return select_experts_torch(router_logits, top_k, renormalize)


def select_experts_torch(router_logits: torch.Tensor, top_k: int, renormalize: bool
                         ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The torch path (every device and dtype; the reference the kernel is tested against)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids.to(torch.int32)
