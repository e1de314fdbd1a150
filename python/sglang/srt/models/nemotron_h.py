"""NVIDIA Nemotron-H (transformers' NemotronHForCausalLM): a stack of blocks, each one pre-norm mixer with a residual,
the mixer named per block by layers_block_type (or hybrid_override_pattern):

    "M"  linear_attention  the Mamba-2 mixer (models/nemotron_h_mixer.py), state in the linear-state pool
    "*"  full_attention    GQA attention without rope or biases (position comes from the Mamba blocks)
    "-"  mlp               up_proj -> relu(x)^2 -> down_proj (no gate)
    "E"  moe               refused at load: its relu2 experts have no fused MoE kernel here (the planner prices it)

Checkpoint names are transformers' (backbone.embeddings, backbone.layers.{i}.norm / .mixer.*, backbone.norm_f,
lm_head); q/k/v load into one qkv projection. Attention blocks use RadixAttention with a compact layer id, their
ordinal among the attention blocks (the KV pool holds only those); Mamba blocks index the state pool by their ordinal
among the Mamba blocks. Tensor parallel: attention heads, Mamba heads and groups, the MLP's columns split; one
all-reduce per block.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import torch
from torch import nn

from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import QKVParallelLinear, RowParallelLinear, default_weight_loader
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.nemotron_h_mixer import NemotronHMamba2Mixer, SegmentedColumnLinear

PATTERN_KINDS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


def block_types(config) -> List[str]:
    """Each block's mixer type, from layers_block_type (transformers 5) or hybrid_override_pattern (older configs)."""
    types = getattr(config, "layers_block_type", None)
    if not types:
        pattern = getattr(config, "hybrid_override_pattern", None) or ""
        types = [PATTERN_KINDS.get(c, c) for c in pattern]
    if not types:
        raise ValueError("config.json (nemotron_h) names no blocks: add 'hybrid_override_pattern' or "
                         "'layers_block_type'")
    unknown = sorted(set(types) - {"linear_attention", "full_attention", "mlp"})
    if "moe" in unknown:
        raise ValueError("Nemotron-H MoE blocks ('E' in hybrid_override_pattern, 'moe' in layers_block_type) are "
                         "planned (sglang plan) but not served: their relu2 experts have no fused MoE kernel here")
    if unknown:
        raise ValueError(f"config.json (nemotron_h): unknown block types {unknown}; known: M/linear_attention, "
                         f"*/full_attention, -/mlp")
    return list(types)


class NemotronHAttention(nn.Module):
    def __init__(self, config, full_layer: int):
        super().__init__()
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, heads, kv_heads, bias=False)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(heads * self.head_dim, config.hidden_size, bias=False)
        self.attn = RadixAttention(self.num_heads, self.head_dim, self.head_dim**-0.5, num_kv_heads=self.num_kv_heads,
                                   layer_id=full_layer)

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        n = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).view(n, -1, self.head_dim).split(
            [self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        return self.o_proj(self.attn(q, k, v, fb))


class NemotronHMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        act = getattr(config, "mlp_hidden_act", "relu2")
        if act != "relu2":
            raise ValueError(f"Nemotron-H mlp_hidden_act {act!r} is not served; only relu2 is")
        bias = bool(getattr(config, "mlp_bias", False))
        self.up_proj = SegmentedColumnLinear(config.hidden_size, [config.intermediate_size], bias=bias)
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.down_proj(torch.relu(self.up_proj(x)).square())


class NemotronHBlock(nn.Module):
    def __init__(self, config, block_type: str, ordinal: int):
        """ordinal: the block's index among the blocks of its type (state row layer / compact KV layer id)."""
        super().__init__()
        self.block_type = block_type
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        if block_type == "linear_attention":
            self.mixer = NemotronHMamba2Mixer(config, ordinal)
        elif block_type == "full_attention":
            self.mixer = NemotronHAttention(config, ordinal)
        else:
            self.mixer = NemotronHMLP(config)

    def forward(self, hidden: torch.Tensor, residual: Optional[torch.Tensor], fb: ForwardBatch
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        # hidden is the previous block's mixer output; residual the stream before it (None at the first block)
        if residual is None:
            residual, hidden = hidden, self.norm(hidden)
        else:
            hidden, residual = self.norm(hidden, residual)
        return self.mixer(hidden, fb), residual


class NemotronHModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        types = block_types(config)
        self.embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([NemotronHBlock(config, t, types[:i].count(t)) for i, t in enumerate(types)])
        self.norm_f = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)

    def forward(self, input_ids: torch.Tensor, fb: ForwardBatch, input_embeds: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        hidden = self.embeddings(input_ids) if input_embeds is None else input_embeds
        residual = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, fb)
        hidden, _ = self.norm_f(hidden, residual)
        return hidden


class NemotronHForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.backbone = NemotronHModel(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.tie_weights(self.backbone.embeddings)
        self.logits_processor = LogitsProcessor(config)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch,
                input_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        """input_ids, positions: [N] int64 (positions unused: no rope) -> float32 logits [B, V]."""
        hidden = self.backbone(input_ids, forward_batch, input_embeds)
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters(remove_duplicate=False))
        tied = getattr(self.config, "tie_word_embeddings", False)
        loaded = set()
        for name, tensor in weights:
            if name.startswith("model."):  # transformers' in-memory prefix, should a checkpoint carry it
                name = "backbone." + name[len("model."):]
            if tied and name == "lm_head.weight":
                continue
            shard = None
            for proj in ("q", "k", "v"):
                if name.endswith(f".mixer.{proj}_proj.weight"):
                    name, shard = name.replace(f".{proj}_proj.", ".qkv_proj."), proj
            param = params.get(name)
            if param is None:
                raise KeyError(f"Checkpoint tensor {name!r} has no parameter in {type(self).__name__}.")
            loader = getattr(param, "weight_loader", None)
            if shard is not None:
                loader(param, tensor, shard)
            elif loader is not None:
                loader(param, tensor)
            else:
                default_weight_loader(param, tensor)
            loaded.add(name)
        missing = sorted(n for n in params if n not in loaded and not (tied and n == "lm_head.weight"))
        if missing:
            raise ValueError(f"Checkpoint is missing weights: {missing[:8]}{' ...' if len(missing) > 8 else ''}")


EntryClass = NemotronHForCausalLM
