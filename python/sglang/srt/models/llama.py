"""Llama (SmolLM2, Llama-2/3 with rope scaling): GQA, merged qkv / gate_up projections, optional tied embeddings.
Tensor parallel: qkv and gate_up column-parallel, o_proj and down_proj row-parallel (one all-reduce each), the
vocabulary split over the ranks (layers/linear.py, layers/vocab_embedding.py)."""

from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch
from torch import nn

from sglang.srt.configs.model_config import get_rope_parameters
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    default_weight_loader,
)
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import get_rope
from sglang.srt.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu", bias: bool = False,
                 reduce_results: bool = True):
        super().__init__()
        if hidden_act != "silu":
            raise ValueError(f"Unsupported activation {hidden_act!r}; only silu is supported.")
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias, reduce_results=reduce_results)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [N, hidden] -> [N, 2I] -> [N, I] -> [N, hidden]; a quantized gate_up: [N, I] in one call, the same bits
        act = self.gate_up_proj.forward_gated(x, "silu")
        return self.down_proj(act if act is not None else self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(nn.Module):
    qkv_bias_default = False

    def __init__(self, config, layer_id: int, input_size: Optional[int] = None):
        """input_size: what q/k/v read (default hidden_size; an EAGLE-3 head's layer reads 2 x hidden_size)."""
        super().__init__()
        self.hidden_size = config.hidden_size
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden_size // total_heads
        bias = getattr(config, "attention_bias", self.qkv_bias_default) or self.qkv_bias_default
        self.qkv_proj = QKVParallelLinear(input_size or self.hidden_size, self.head_dim, total_heads, total_kv_heads, bias=bias)
        # this rank's heads (all of them at tp == 1); KV heads are replicated when tp > KV heads
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, self.hidden_size,
                                        bias=getattr(config, "o_proj_bias", False))
        rope = get_rope_parameters(config)
        self.rotary_emb = get_rope(
            self.head_dim,
            rotary_dim=int(self.head_dim * rope.get("partial_rotary_factor", 1.0)),
            max_position=config.max_position_embeddings,
            base=rope["rope_theta"],
            rope_parameters=rope,
        )
        self.attn = RadixAttention(
            self.num_heads, self.head_dim, self.head_dim**-0.5, num_kv_heads=self.num_kv_heads, layer_id=layer_id
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        n = hidden_states.shape[0]
        qkv = self.qkv_proj(hidden_states)  # [N, (H + 2KV) * D]
        # q and k are adjacent in qkv: rotate them with one call, as [N, H + KV, D]
        qk, _ = self.rotary_emb(positions, qkv[:, : self.q_size + self.kv_size].view(n, -1, self.head_dim))
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)  # [N, H, D], [N, KV, D]
        v = qkv[:, self.q_size + self.kv_size :].view(n, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(q, k, v, forward_batch))


class LlamaDecoderLayer(nn.Module):
    attention_cls = LlamaAttention

    def __init__(self, config, layer_id: int):
        super().__init__()
        self.self_attn = self.attention_cls(config, layer_id)
        self.mlp = self.make_mlp(config, layer_id)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def make_mlp(self, config, layer_id: int) -> nn.Module:
        """This layer's MLP: [N, hidden] -> [N, hidden] (MoE models return a sparse block for their sparse layers)."""
        return LlamaMLP(config.hidden_size, config.intermediate_size, getattr(config, "hidden_act", "silu"),
                        bias=getattr(config, "mlp_bias", False))

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        forward_batch: ForwardBatch,
        residual: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, forward_batch)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    decoder_layer_cls = LlamaDecoderLayer
    # EAGLE-3 features: the layers whose output (the residual stream after the layer) a forward with
    # capture_hidden == "aux" keeps, concatenated in this order (ModelRunner sets them from the head's config)
    aux_layer_ids: Tuple[int, ...] = ()

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([self.decoder_layer_cls(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        input_embeds: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        # [N] -> [N, hidden]; multimodal models pass input_embeds with image rows already spliced in
        hidden_states = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        residual = None
        aux = {} if forward_batch.capture_hidden == "aux" else None
        for i, layer in enumerate(self.layers):
            hidden_states, residual = layer(positions, hidden_states, forward_batch, residual)
            if aux is not None and i in self.aux_layer_ids:
                aux[i] = hidden_states + residual  # a new tensor: the next layer's fused norm updates residual
        if aux is not None:
            forward_batch.captured_hidden = torch.cat([aux[i] for i in self.aux_layer_ids], dim=-1)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    model_cls = LlamaModel
    # (merged param, checkpoint name, shard id)
    stacked_params_mapping = [
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    ]

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = self.model_cls(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        input_embeds: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """input_ids, positions: [N] int64 (input_embeds: optional [N, hidden]) -> float32 logits [B, V]
        for forward_batch.logits_indices."""
        hidden_states = self.model(input_ids, positions, forward_batch, input_embeds)
        return self.logits_processor(input_ids, hidden_states, self.lm_head, forward_batch)

    def hidden_capture_modes(self) -> Tuple[str, ...]:
        """The ForwardBatch.capture_hidden modes this model honours: both where its forward is this generic one
        (the final norm's input reaches the LogitsProcessor, the layer loop is LlamaModel's); none where a subclass
        replaced either forward (a draft head would read features nobody wrote)."""
        generic = type(self).forward is LlamaForCausalLM.forward and type(self.model).forward is LlamaModel.forward
        return ("last", "aux") if generic else ()

    def expert_weight_target(self, name: str) -> Optional[Tuple[str, int, str]]:
        """(parameter, expert id, shard) for a per-expert checkpoint tensor of a MoE model; None here (dense)."""
        return None

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters(remove_duplicate=False))
        tied = getattr(self.config, "tie_word_embeddings", False)
        loaded = set()
        for name, loaded_weight in weights:
            if "rotary_emb.inv_freq" in name or (tied and name == "lm_head.weight"):
                continue
            expert = self.expert_weight_target(name)
            if expert is not None:  # one expert's projection, into the stacked expert weights
                target, expert_id, shard_id = expert
                params[target].weight_loader(params[target], loaded_weight, shard_id, expert_id)
                loaded.add(target)
                continue
            for param_suffix, weight_suffix, shard_id in self.stacked_params_mapping:
                if weight_suffix in name:
                    target = name.replace(weight_suffix, param_suffix)
                    params[target].weight_loader(params[target], loaded_weight, shard_id)
                    break
            else:
                target = name
                if target not in params:
                    raise KeyError(f"Checkpoint tensor {name!r} has no parameter in {type(self).__name__}.")
                param = params[target]
                getattr(param, "weight_loader", lambda p, w: default_weight_loader(p, w))(param, loaded_weight)
            loaded.add(target)
        missing = {n for n in params if n not in loaded and not (tied and n == "lm_head.weight")}
        if missing:
            raise ValueError(f"Checkpoint is missing weights: {sorted(missing)[:8]}{' ...' if len(missing) > 8 else ''}")


EntryClass = LlamaForCausalLM
