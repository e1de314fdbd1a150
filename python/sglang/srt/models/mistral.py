"""Mistral (Mistral-7B v0.1 / v0.2+, Mistral-Nemo): the Llama layout with one sliding window on every layer
(transformers' MistralConfig: sliding_window, default 4096; null: every layer attends to the whole context).
The window comes from the planner's shape (models/layer_windows.py), so the pool it sizes is the one masked here."""

from __future__ import annotations

from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.models.layer_windows import layer_windows
from sglang.srt.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


class MistralAttention(LlamaAttention):
    def __init__(self, config, layer_id: int):
        super().__init__(config, layer_id)
        window = layer_windows(config, "mistral")[layer_id]
        self.attn = RadixAttention(self.num_heads, self.head_dim, self.head_dim**-0.5, num_kv_heads=self.num_kv_heads,
                                   layer_id=layer_id, sliding_window_size=window)


class MistralDecoderLayer(LlamaDecoderLayer):
    attention_cls = MistralAttention


class MistralModel(LlamaModel):
    decoder_layer_cls = MistralDecoderLayer


class MistralForCausalLM(LlamaForCausalLM):
    model_cls = MistralModel


EntryClass = MistralForCausalLM
