"""LogitsProcessor: pick the rows that need logits and project them onto the vocabulary (with tp ranks: each rank's
vocabulary slice, all-gathered in rank order before the sampler sees them). bf16 logits on a CPU with the kernels
loaded are widened to fp32 by sgl-kernel/csrc/cpu/logits.h (exact, as .float(); torch's copy is an OpenMP region that
costs a thread wake-up per decode step in the server). A packed GGUF lm_head (quantization/vocab_method.py) gives fp32
logits directly: nothing to widen. For a batch (decode or extend) whose rows only the sampler's argmax of the raw
logits reads (ForwardBatch.greedy_only) such an lm_head gives the rows' token ids themselves (int64 [B],
ForwardBatch.greedy_fused): the logits are never written."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from sglang.jit_kernel.cpu_ops import get_cpu_ops
from sglang.srt.distributed.communication_op import tp_all_gather
from sglang.srt.distributed.parallel_state import get_tp_size
from sglang.srt.layers.prompt_logprobs import compute_prompt_logprobs

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
        if getattr(forward_batch, "pooling", None) is not None:  # an embedding server: pooled rows, no logits
            from sglang.srt.layers.pooler import pool_hidden

            return pool_hidden(hidden_states, forward_batch, indices)
        if forward_batch.prompt_logprob_rows is not None:  # before the rows are narrowed to the sampler's
            forward_batch.prompt_logprob_result = compute_prompt_logprobs(
                hidden_states, forward_batch.prompt_logprob_rows, lm_head, self.vocab_size,
                forward_batch.prompt_logprob_spec, forward_batch.prompt_logprob_block_rows)
        if forward_batch.capture_hidden == "last":  # a draft head reads every row's feature (EAGLE, NEXTN)
            forward_batch.captured_hidden = hidden_states
        if indices is not None:
            hidden_states = hidden_states[indices]
        if forward_batch.greedy_only and get_tp_size() == 1:
            token_ids = lm_head.greedy_tokens(hidden_states)  # int64 [B], or None where the lm_head has no such path
            if token_ids is not None:
                forward_batch.greedy_fused = True
                return token_ids
        logits = tp_all_gather(lm_head.logits(hidden_states), dim=-1)  # [B, V / tp] per rank -> [B, V_pad]
        if logits.dtype == torch.bfloat16 and logits.is_cpu and logits.stride(-1) == 1:
            ops = get_cpu_ops()
            if ops is not None:
                return ops.logits_to_float(logits, self.vocab_size)
        if logits.dtype == torch.float32:  # a packed GGUF table's lm_head gives fp32 (quantization/vocab_method.py)
            return logits if logits.shape[-1] == self.vocab_size else logits[:, : self.vocab_size].contiguous()
        return logits[:, : self.vocab_size].float()
