"""NEXTN: a DeepSeek-V2/V3 checkpoint's own multi-token-prediction (MTP) layer as a speculative draft head.

The checkpoint holds num_nextn_predict_layers MTP layers after the model's num_hidden_layers (L) decoder layers, as
model.layers.{L}.*; the target's loader skips them (models/deepseek_v2.py). One MTP layer, for a row at position q
with the token t at q + 1 and the target's feature f_q (its final-normed hidden state at q, what its lm_head reads):

    x        = eh_proj( [ enorm(embed(t)) | hnorm(f_q) ] )          [2H -> H], embedding first
    x, res   = decoder layer (MLA attention over the head's own latent pool, routed + shared experts)
    h        = shared_head.norm(x + res)                             the head's hidden state (the next step's feature)
    logits   = lm_head(h)                                            its guess of the token at q + 2
The embedding and lm_head are the target's (the checkpoint's model.layers.{L}.embed_tokens / shared_head.head are
copies of them and are not loaded); the decoder layer is built as the target's sparse layers are (first_k_dense_replace
0), with layer id 0 in the head's own one-layer pool.
"""

from __future__ import annotations

import copy
import re
from typing import Iterable, Tuple

import torch
from torch import nn

from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import ReplicatedLinear, default_weight_loader
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.moe.moe_layer import QWEN_EXPERT_SHARDS, expert_checkpoint_target
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.deepseek_mla import KVBProjection
from sglang.srt.models.moe_block import check_experts_loaded

# checkpoint tensors of the MTP layer that are the target's own (shared, never loaded twice)
SHARED_WITH_TARGET = ("embed_tokens.weight", "shared_head.head.weight")
_STACKED = (("gate_proj", "gate_up_proj", 0), ("up_proj", "gate_up_proj", 1))


def nextn_layer_count(config) -> int:
    """The MTP layers the head serves: exactly one (what DeepSeek-V3 / R1 ship); ValueError naming the field."""
    n = getattr(config, "num_nextn_predict_layers", 0) or 0
    if n < 1:
        raise ValueError("--speculative-algorithm NEXTN: the model's config.json has no num_nextn_predict_layers "
                         "(>= 1): this checkpoint ships no MTP layer to propose with; use NGRAM or STANDALONE.")
    if n > 1:
        raise ValueError(f"--speculative-algorithm NEXTN: config.json has num_nextn_predict_layers {n}; this runtime "
                         "drafts with one MTP layer (model.layers.{num_hidden_layers}.*) only.")
    return n


class SharedHead(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.norm = RMSNorm(hidden, eps=eps)


class DeepseekNextN(nn.Module):
    """The head interface of speculative/eagle_proposer.py: cls(config, target_model); forward(input_ids, positions,
    forward_batch, hidden_in) -> (logits of forward_batch's logits rows, hidden_out [N, H]); to_target_ids;
    load_weights(the target checkpoint's tensors)."""

    def __init__(self, config, target_model: nn.Module):
        super().__init__()
        nextn_layer_count(config)
        if getattr(config, "quantization_config", None):  # fp8 blocks would load without their scales
            raise ValueError("--speculative-algorithm NEXTN: the checkpoint is quantized (quantization_config); this "
                             "runtime loads MTP layers from unquantized checkpoints only; use NGRAM.")
        self.config = config
        self.checkpoint_layer = config.num_hidden_layers  # model.layers.{L}.* in the target checkpoint
        hidden, eps = config.hidden_size, config.rms_norm_eps
        # held outside the module tree: the target owns (and counts) these tensors
        self._shared = (target_model.model.embed_tokens, target_model.lm_head)
        self.enorm = RMSNorm(hidden, eps=eps)
        self.hnorm = RMSNorm(hidden, eps=eps)
        self.eh_proj = ReplicatedLinear(2 * hidden, hidden, bias=False)
        # the target's sparse layer: routed + shared experts whatever first_k_dense_replace says for the target
        layer_config = copy.copy(config)
        layer_config.first_k_dense_replace = 0
        self.decoder = target_model.model.decoder_layer_cls(layer_config, 0)
        self.shared_head = SharedHead(hidden, eps)
        self.logits_processor = LogitsProcessor(config)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch,
                hidden_in: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """input_ids, positions [N]; hidden_in [N, H] (row j: the feature of position positions[j], the token one
        position later) -> (float32 logits [rows of forward_batch.logits_indices, V], hidden_out [N, H])."""
        embed, lm_head = self._shared
        x = torch.cat([self.enorm(embed(input_ids)), self.hnorm(hidden_in.to(self.eh_proj.weight.dtype))], dim=-1)
        x, residual = self.decoder(positions, self.eh_proj(x), forward_batch, None)
        hidden_out, _ = self.shared_head.norm(x, residual)
        return self.logits_processor(input_ids, hidden_out, lm_head, forward_batch), hidden_out

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids  # the target's own vocabulary

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """From the TARGET checkpoint's tensors: model.layers.{L}.* only (the rest is the target's)."""
        own = re.compile(rf"^model\.layers\.{self.checkpoint_layer}\.(.+)$")
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            m = own.match(name)
            if m is None or m.group(1) in SHARED_WITH_TARGET:
                continue
            local = m.group(1)
            if not local.startswith(("enorm.", "hnorm.", "eh_proj.", "shared_head.")):
                local = "decoder." + local
            expert = expert_checkpoint_target(local, QWEN_EXPERT_SHARDS)
            if expert is not None:
                target, expert_id, shard = expert
                params[target].weight_loader(params[target], tensor, shard, expert_id)
                loaded.add(target)
                continue
            for ckpt, merged, shard in _STACKED:
                if f".{ckpt}." in local:
                    target = local.replace(f".{ckpt}.", f".{merged}.")
                    params[target].weight_loader(params[target], tensor, shard)
                    break
            else:
                target = local
                if target not in params:
                    raise KeyError(f"MTP tensor {name!r} has no parameter in the NEXTN head.")
                param = params[target]
                getattr(param, "weight_loader", lambda p, w: default_weight_loader(p, w))(param, tensor)
            loaded.add(target)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"--speculative-algorithm NEXTN: the checkpoint lacks MTP tensors "
                             f"model.layers.{self.checkpoint_layer}.* for {missing[:6]}"
                             f"{' ...' if len(missing) > 6 else ''}.")
        for module in self.modules():
            if isinstance(module, KVBProjection):
                module.arrange()
        check_experts_loaded(self)

