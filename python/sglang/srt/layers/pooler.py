"""Pooling of final hidden states for an embedding server (--is-embedding; configs/pooling.py picks the mode).

The LogitsProcessor calls `pool_hidden` instead of projecting onto the vocabulary when the batch carries a pooling
mode. One float32 row per request of the batch, [B, hidden]:
    last   the hidden state of the request's last new token in this forward (the prompt's last token once its final
           chunk runs)
    mean   the SUM of the request's new tokens' hidden states in this forward; the scheduler adds the chunks of a
           chunked prompt and divides by the prompt length (managers/embedding_output.py)
The sums accumulate in float32 without an fp32 copy of the hidden states (torch's reduction casts as it reads), so
the forward holds no more than the [B, hidden] result beyond the activations the profile forward measured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def pool_hidden(hidden_states: torch.Tensor, forward_batch: "ForwardBatch", indices: torch.Tensor) -> torch.Tensor:
    """hidden_states [N, hidden] -> float32 [B, hidden]; `indices`: each request's last new row."""
    if forward_batch.pooling == "last":
        return hidden_states[indices].float()
    if forward_batch.pooling != "mean":
        raise ValueError(f"unknown pooling mode {forward_batch.pooling!r}")
    out = torch.empty(len(forward_batch.extend_seq_lens_cpu), hidden_states.shape[-1], dtype=torch.float32,
                      device=hidden_states.device)
    start = 0
    for b, n in enumerate(forward_batch.extend_seq_lens_cpu):
        torch.sum(hidden_states[start : start + n], dim=0, dtype=torch.float32, out=out[b])
        start += n
    return out
