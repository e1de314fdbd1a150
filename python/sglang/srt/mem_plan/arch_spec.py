"""An architecture as the planner knows it, declared once: no model_type is ever priced as another.

Each model_type the planner prices has one ArchSpec, in the ARCHS tuple of its family module (arch_registry.py
lists the modules and refuses every other model_type, naming it and the ones it knows):

    weights(cfg, tp, ep) -> tuple[WeightGroup, ...]
        every parameter tensor of the text model that one rank holds (tp = ep = 1: the whole model), under the
        checkpoint's module names. The parameter count per component, the weights term in any checkpoint format
        (quantization_sizes.py) and a format's unquantized modules (modules_to_not_convert / ignore) all read
        this one list, so a count and a byte size cannot disagree about which tensors exist.
    shape(cfg) -> model_shapes.TextShape
        the geometry every other term needs: layer kinds, KV per layer kind, per-request state, experts.
    served
        whether this runtime serves the architecture (models/registry.py). One that is planned but not served is
        planned with PLANNED_NOT_SERVED in the plan's notes, and `sglang serve` refuses it with the same words.

cfg is the text model's config.json dict (a multimodal config's text part; model_shapes unwraps it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from sglang.srt.mem_plan.dtypes import dtype_bytes

# What a decoder layer keeps per request (model_shapes.TextShape.layer_kinds):
#   full     K and V of every token of the request (the KV pool)
#   sliding  K and V of the last sliding_window tokens (Gemma 2/3 local layers, gpt-oss, Mistral)
#   chunked  K and V of the tokens since the last attention_chunk_size boundary (Llama 4's local layers)
#   linear   no KV: a fixed state per request (state_tensors: Gated DeltaNet, Mamba-2)
LAYER_KINDS = ("full", "sliding", "chunked", "linear")

PLANNED_NOT_SERVED = "planned; not served by this runtime"

# Components of a parameter count (WeightGroup.component). The first seven are what every plan has reported.
COMPONENTS = ("embed_tokens", "lm_head", "attention", "mlp_dense", "moe_experts", "moe_router", "norms",
              "linear_attention", "ssm")


@dataclass(frozen=True)
class WeightGroup:
    """`count` tensors of one `shape` on one rank, e.g. every layer's q_proj weight.

    module: the checkpoint's tensor name with each layer (or expert) index written '*',
            e.g. "model.layers.*.self_attn.q_proj.weight" (what modules_to_not_convert / ignore lists match).
    linear: a linear layer's [out_features, in_features] weight, which a quantized checkpoint holds in its format;
            False for embeddings, norms, biases, routers' bias, sinks, convolutions, state-space parameters.
    expert: a routed expert's weight (count includes the experts this rank holds).
    dtype:  the dtype the checkpoint stores (and the serving runtimes hold) this tensor in when it is not the
            model's, e.g. a float32 router bias beside bf16 weights; "" = the model dtype. Only on tensors that no
            format quantizes (linear=False), each one declared with its source.
    """

    component: str
    module: str
    shape: tuple[int, ...]
    count: int = 1
    linear: bool = False
    expert: bool = False
    dtype: str = ""

    def __post_init__(self):
        if self.component not in COMPONENTS:
            raise ValueError(f"WeightGroup {self.module}: component {self.component!r} not in {COMPONENTS}")
        if self.count < 0 or any(d < 0 for d in self.shape):
            raise ValueError(f"WeightGroup {self.module}: negative size {self.shape} x {self.count}")
        if self.linear and len(self.shape) != 2:
            raise ValueError(f"WeightGroup {self.module}: a linear weight is [out, in], not {self.shape}")
        if self.dtype and self.linear:
            raise ValueError(f"WeightGroup {self.module}: a linear weight's bytes are its format's, not dtype "
                             f"{self.dtype}")
        if self.dtype:
            dtype_bytes(self.dtype)  # an unknown dtype is refused here, not mid-plan

    @property
    def numel(self) -> int:
        return math.prod(self.shape) * self.count


@dataclass(frozen=True)
class StateTensor:
    """One per-request state tensor of a "linear" layer: shard_units units split over the TP ranks (ceil), each of
    unit_elems elements, held in dtype. E.g. a Gated DeltaNet recurrent state: units = value heads,
    unit_elems = head_k_dim * head_v_dim, dtype float32."""

    name: str
    shard_units: int
    unit_elems: int
    dtype: str

    def bytes_per_rank(self, tp: int = 1) -> int:
        return -(-self.shard_units // tp) * self.unit_elems * dtype_bytes(self.dtype)


@dataclass(frozen=True)
class ArchSpec:
    model_type: str
    family: str  # dense / moe / mla / hybrid-attention / linear-attention / state-space: what the zoo groups by
    weights: Callable[[dict, int, int], tuple[WeightGroup, ...]]
    shape: Callable[[dict], object]  # -> model_shapes.TextShape
    served: bool
