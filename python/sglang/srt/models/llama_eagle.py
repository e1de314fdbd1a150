"""EAGLE-1 draft head over a Llama-family target (LlamaForCausalLMEagle checkpoints, e.g. EAGLE-LLaMA3-Instruct-8B).

Row q of the head reads the token at position q + 1 and a feature of position q, and predicts the token at q + 2:
    x = fc([embed(token), feature])            fc: [2H -> H] with bias; embed: the TARGET's embedding
    x = decoder layers (Llama layers; the first has no input_layernorm: fc's output enters it as is)
    hidden_out = the residual stream after the last layer (no final norm)
    logits = the TARGET's lm_head(hidden_out)
The feature is the target's final-normed hidden state (what its lm_head reads) for rows the target computed, and the
head's own hidden_out of the previous row for rows past them (speculative/eagle_proposer.py). The head's embedding
and lm_head are the target's, held by reference (not parameters of this module: the plan prices the head's own
tensors only, mem_plan/draft_heads.py).
"""

from __future__ import annotations

from typing import Iterable, Tuple

import torch
from torch import nn

from sglang.srt.layers.linear import default_weight_loader
from sglang.srt.layers.logits_processor import compute_logits_indices
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.llama import LlamaDecoderLayer, LlamaForCausalLM

# checkpoint tensors an EAGLE-1 head does not own (the target's, shared) or that carry no weight
SHARED_TENSORS = ("embed_tokens.weight", "lm_head.weight", "rotary_emb.inv_freq")


class _Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def load_head_weights(module: nn.Module, weights: Iterable[Tuple[str, torch.Tensor]],
                      shared: Tuple[str, ...] = SHARED_TENSORS) -> None:
    """A head checkpoint's tensors (names without the "model." prefix some exports add) into module's parameters
    and buffers, q/k/v and gate/up into their merged projections; the shared tensors are skipped."""
    params = dict(module.named_parameters())
    params.update(dict(module.named_buffers()))
    loaded = set()
    for name, w in weights:
        name = name[len("model."):] if name.startswith("model.") else name
        if name.endswith(shared):
            continue
        for merged, part, shard in LlamaForCausalLM.stacked_params_mapping:
            if part in name:
                target = name.replace(part, merged)
                params[target].weight_loader(params[target], w, shard)
                break
        else:
            target = name
            if target not in params:
                raise KeyError(f"Draft head tensor {name!r} has no parameter in {type(module).__name__}.")
            p = params[target]
            if isinstance(p, nn.Parameter):
                getattr(p, "weight_loader", lambda q, x: default_weight_loader(q, x))(p, w)
            else:  # a buffer (EAGLE-3's vocabulary maps): same shape, its own dtype
                p.copy_(torch.as_tensor(w[:] if not isinstance(w, torch.Tensor) else w).to(p.dtype))
        loaded.add(target)
    missing = sorted(n for n, p in module.named_parameters() if n not in loaded)
    if missing:
        raise ValueError(f"Draft head checkpoint is missing tensors: {missing[:8]}")


class LlamaForCausalLMEagle(nn.Module):
    """forward(input_ids, positions, forward_batch, hidden_in [N, H]) -> (float32 logits of the rows
    forward_batch.logits_indices picks (decode: all), hidden_out [N, H])."""

    def __init__(self, config, target_model: nn.Module):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.vocab_size = target_model.config.vocab_size
        self._shared = (target_model.model.embed_tokens, target_model.lm_head)  # the target's, not parameters here
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=True)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.layers[0].input_layernorm = _Identity()  # EAGLE-1: fc's output enters the first layer un-normed

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch,
                hidden_in: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        embed, lm_head = self._shared
        x = self.fc(torch.cat([embed(input_ids).to(hidden_in.dtype), hidden_in], dim=-1))
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, forward_batch, residual)
        hidden_out = x + residual
        idx = compute_logits_indices(forward_batch)
        rows = hidden_out if idx is None else hidden_out[idx]
        return lm_head.logits(rows)[:, : self.vocab_size].float(), hidden_out

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        load_head_weights(self, weights)


EntryClass = LlamaForCausalLMEagle
