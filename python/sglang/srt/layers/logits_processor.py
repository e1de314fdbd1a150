"""LogitsProcessor: pick the rows that need logits and project them onto the vocabulary (with tp ranks: each rank's
vocabulary slice, all-gathered in rank order before the sampler sees them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from sglang.srt.distributed.communication_op import tp_all_gather

if TYPE_CHECKING:
    from sglang.srt.layers.vocab_embedding import ParallelLMHead
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def compute_logits_indices(forward_batch: "ForwardBatch") -> torch.Tensor:
    """Rows of the [N, hidden] states whose logits are wanted: the last new token of each request."""
    if forward_batch.logits_indices is not None:
        return forward_batch.logits_indices
    if forward_batch.forward_mode.is_decode():
        return None  # every row is the last token of its request
    if forward_batch.extend_seq_lens is not None:
        return torch.cumsum(forward_batch.extend_seq_lens, 0) - 1
    lens = torch.tensor(forward_batch.extend_seq_lens_cpu, dtype=torch.int64, device=forward_batch.input_ids.device)
    return torch.cumsum(lens, 0) - 1


class LogitsProcessor(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.vocab_size = config.vocab_size

    def forward(
        self, input_ids: torch.Tensor, hidden_states: torch.Tensor, lm_head: "ParallelLMHead", forward_batch: "ForwardBatch"
    ) -> torch.Tensor:
        # hidden_states: [N, hidden] -> logits: [B, V] float32
        indices = compute_logits_indices(forward_batch)
        if indices is not None:
            hidden_states = hidden_states[indices]
        logits = tp_all_gather(lm_head.logits(hidden_states), dim=-1)  # [B, V / tp] per rank -> [B, V_pad]
        return logits[:, : self.vocab_size].float()
