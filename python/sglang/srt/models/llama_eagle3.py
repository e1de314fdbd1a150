"""EAGLE-3 draft head over a Llama-family target (LlamaForCausalLMEagle3 checkpoints, e.g.
yuhuili/EAGLE3-LLaMA3.1-Instruct-8B).

Row q of the head reads the token at position q + 1 and a feature of position q, and predicts the token at q + 2:
    h = fc(feature)                 only for the target's features: [3 x H_target] (three layers' residual streams,
                                    models/llama.py aux capture) -> H; the head's own hidden_out (H) enters as is
    midlayer (one Llama layer whose q/k/v read 2H):
        a = attention([input_layernorm(embed(token)), hidden_norm(h)])      embed: the TARGET's embedding
        r = h + a;  m = mlp(post_attention_layernorm(r));  hidden_out = r + m
    logits = lm_head(norm(hidden_out))   the head's own lm_head over draft_vocab_size tokens
A draft token id i is the target's i + d2t[i] (to_target_ids); t2d marks the target ids the draft vocabulary holds
(loaded, unused by greedy proposals).
"""

from __future__ import annotations

from typing import Iterable, Tuple

import torch
from torch import nn

from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.logits_processor import compute_logits_indices
from sglang.srt.layers.vocab_embedding import ParallelLMHead
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.llama import LlamaAttention, LlamaMLP
from sglang.srt.models.llama_eagle import load_head_weights


class Eagle3MidLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        H, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = LlamaAttention(config, 0, input_size=2 * H)
        self.mlp = LlamaMLP(H, config.intermediate_size, getattr(config, "hidden_act", "silu"),
                            bias=getattr(config, "mlp_bias", False))
        self.hidden_norm = RMSNorm(H, eps=eps)
        self.input_layernorm = RMSNorm(H, eps=eps)
        self.post_attention_layernorm = RMSNorm(H, eps=eps)

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor, h: torch.Tensor,
                forward_batch: ForwardBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(h)], dim=-1)  # [N, 2H]
        a = self.self_attn(positions, x, forward_batch)
        m, r = self.post_attention_layernorm(a, h)  # r = h + a
        return self.mlp(m), r


class LlamaForCausalLMEagle3(nn.Module):
    """forward(input_ids, positions, forward_batch, hidden_in [N, 3 H_target] or [N, H]) -> (float32 logits over the
    draft vocabulary of the rows forward_batch.logits_indices picks (decode: all), hidden_out [N, H])."""

    def __init__(self, config, target_model: nn.Module):
        super().__init__()
        self.config = config
        H = self.hidden_size = config.hidden_size
        target_hidden = getattr(config, "target_hidden_size", None) or target_model.config.hidden_size
        if 3 * target_hidden == H:  # forward tells a feature from the head's own hidden state by its width
            raise ValueError(f"EAGLE3 head: hidden_size {H} == 3 x the target's {target_hidden}; unsupported.")
        self.vocab_size = target_model.config.vocab_size
        self.draft_vocab_size = getattr(config, "draft_vocab_size", None) or self.vocab_size
        self._shared = (target_model.model.embed_tokens,)  # the target's, not a parameter here
        self.fc = nn.Linear(3 * target_hidden, H, bias=getattr(config, "bias", False))
        self.midlayer = Eagle3MidLayer(config)
        self.norm = RMSNorm(H, eps=config.rms_norm_eps)
        self.lm_head = ParallelLMHead(self.draft_vocab_size, H)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(self.vocab_size, dtype=torch.bool))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch,
                hidden_in: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        embeds = self._shared[0](input_ids)
        h = self.fc(hidden_in) if hidden_in.shape[-1] == self.fc.in_features else hidden_in
        m, r = self.midlayer(positions, embeds.to(h.dtype), h, forward_batch)
        normed, hidden_out = self.norm(m, r)
        idx = compute_logits_indices(forward_batch)
        rows = normed if idx is None else normed[idx]
        return self.lm_head.logits(rows)[:, : self.draft_vocab_size].float(), hidden_out

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids + self.d2t[ids]

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        load_head_weights(self, weights, shared=("embed_tokens.weight", "rotary_emb.inv_freq"))  # own lm_head


EntryClass = LlamaForCausalLMEagle3
