"""Token embedding and LM head, split over the TP ranks by vocabulary rows.

The vocabulary is padded to a multiple of tp; rank r holds rows [r * V/tp, (r+1) * V/tp) of the padded table (rows
past the real vocabulary are zero). The embedding looks up the ids in its range, zeroes the others and all-reduces;
the LM head's logits are all-gathered in rank order by LogitsProcessor before sampling. At tp == 1 both are the
plain [vocab, hidden] table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.distributed.communication_op import tp_all_reduce
from sglang.srt.distributed.parallel_state import get_tp_rank, get_tp_size
from sglang.srt.layers.linear import default_weight_loader


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.num_embeddings_per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * self.num_embeddings_per_rank
        self.vocab_end = self.vocab_start + self.num_embeddings_per_rank
        self.weight = nn.Parameter(torch.empty(self.num_embeddings_per_rank, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        if self.tp_size == 1:
            return default_weight_loader(param, loaded_weight)
        if loaded_weight.shape != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"weight shape mismatch: vocabulary table {tuple(loaded_weight.shape)} vs "
                             f"{(self.num_embeddings, self.embedding_dim)}")
        n = max(0, min(self.vocab_end, self.num_embeddings) - self.vocab_start)
        with torch.no_grad():
            param.zero_()
            param[:n].copy_(loaded_weight[self.vocab_start : self.vocab_start + n])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: [N] -> [N, hidden]
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)  # [N]
        out = F.embedding((input_ids - self.vocab_start) * mine, self.weight)
        out.mul_(mine.unsqueeze(-1).to(out.dtype))
        return tp_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Holds this rank's [vocab / tp, hidden] rows of the output projection; LogitsProcessor applies it. Tied models
    share the embedding's Parameter via `tie_weights` (same rows on the same rank)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False):
        super().__init__(num_embeddings, embedding_dim)
        if bias:
            raise NotImplementedError("LM head bias is not supported.")

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> "ParallelLMHead":
        self.weight = embed_tokens.weight
        return self

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied by LogitsProcessor, not called directly.")
