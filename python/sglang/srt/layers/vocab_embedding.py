"""Token embedding and LM head, split over the TP ranks by vocabulary rows.

The vocabulary is padded to a multiple of tp; rank r holds rows [r * V/tp, (r+1) * V/tp) of the padded table (rows
past the real vocabulary are zero). The embedding looks up the ids in its range, zeroes the others and all-reduces;
the LM head's logits are all-gathered in rank order by LogitsProcessor before sampling. At tp == 1 both are the
plain [vocab, hidden] table.

With --quantization gguf one table may be held as packed GGUF blocks instead (layers/quantization/vocab_method.py;
which one: quantization_config's packed_vocab, named by the loader from the file): an untied lm_head's, or the
embedding's, which a tied lm_head then reads instead of sharing a dense Parameter. Such a layer has quant_method
set, `weight` None once loaded and the packed `qweight` buffer (tp == 1 only: quantization refuses tp > 1).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.distributed.communication_op import tp_all_reduce
from sglang.srt.distributed.parallel_state import get_tp_rank, get_tp_size
from sglang.srt.layers.linear import default_weight_loader, linear
from sglang.srt.layers.quantization import vocab_quant_method


class VocabParallelEmbedding(nn.Module):
    is_lm_head = False

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.num_embeddings_per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * self.num_embeddings_per_rank
        self.vocab_end = self.vocab_start + self.num_embeddings_per_rank
        # None: a dense table; else the packed GGUF blocks (module docstring)
        self.quant_method = vocab_quant_method(self.is_lm_head)
        if self.quant_method is not None:
            if self.tp_size != 1:
                raise ValueError("a packed vocabulary table is not sharded over TP ranks; use --tp-size 1")
            self.output_size, self.input_size = num_embeddings, embedding_dim  # the [rows, cols] of the packed form
            self.quant_method.create_weights(self)
            return
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
        if self.quant_method is not None:
            return self.quant_method.embedding(self, input_ids)
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)  # [N]
        out = F.embedding((input_ids - self.vocab_start) * mine, self.weight)
        out.mul_(mine.unsqueeze(-1).to(out.dtype))
        return tp_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Holds this rank's [vocab / tp, hidden] rows of the output projection; LogitsProcessor applies it (logits).
    Tied models share the embedding's Parameter via `tie_weights` (same rows on the same rank), or read its packed
    table when the embedding is packed."""

    is_lm_head = True

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False):
        super().__init__(num_embeddings, embedding_dim)
        self._tied_table = ()  # (the packed embedding,) when tied to one: a plain attribute, not a submodule
        if bias:
            raise NotImplementedError("LM head bias is not supported.")

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> "ParallelLMHead":
        if embed_tokens.quant_method is not None:  # one packed table: no weight of our own
            self.weight = None
            self._tied_table = (embed_tokens,)
            return self
        self.weight = embed_tokens.weight
        return self

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[B, hidden] -> [B, vocab / tp] in the hidden states' dtype: this rank's vocabulary rows."""
        table = self._tied_table[0] if self._tied_table else self
        if table.quant_method is not None:
            return table.quant_method.apply(table, hidden_states)
        return linear(hidden_states, self.weight)

    def greedy_tokens(self, hidden_states: torch.Tensor) -> Optional[torch.Tensor]:
        """[B, hidden] -> int64 [B], each row's argmax of logits(hidden_states) computed without them, where the
        table's quantization method can (a packed GGUF table with the CPU kernels); else None."""
        table = self._tied_table[0] if self._tied_table else self
        fused = getattr(table.quant_method, "argmax", None)
        return fused(table, hidden_states) if fused is not None else None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied by LogitsProcessor, not called directly.")
