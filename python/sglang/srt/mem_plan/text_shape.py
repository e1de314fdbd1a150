"""TextShape: the geometry of a text model that every memory term reads (weights come from the ArchSpec's
WeightGroups instead: arch_spec.py). Built by an ArchSpec's shape(cfg) (arch_<family>.py); model_shapes re-exports it.
Torch-free, no imports of the family modules (they import this)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglang.srt.mem_plan.dtypes import dtype_bytes


@dataclass(frozen=True)
class HeadSplitWidth:
    """Per-token elements of a tensor split by heads over the TP ranks: units (heads or groups, ceil per rank) of
    unit_elems each."""

    units: int
    unit_elems: int

    def per_rank(self, tp: int = 1) -> int:
        return -(-self.units // tp) * self.unit_elems


@dataclass(frozen=True)
class TextShape:
    model_type: str
    architectures: tuple[str, ...]
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    dtype: str
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # qwen2_moe: one shared expert of this width (+ a 1-wide gate)
    num_shared_experts: int = 0  # deepseek: shared experts of moe_intermediate_size
    router_bias: bool = False  # deepseek-v3 e_score_correction_bias
    sparse_layers: tuple[int, ...] = ()
    # MLA
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # what each decoder layer keeps per request (arch_spec.LAYER_KINDS); () means every layer "full"
    layer_kinds: tuple[str, ...] = ()
    sliding_window: int = 0  # tokens of a "sliding" layer's window
    attention_chunk_size: int = 0  # tokens of a "chunked" layer's chunk
    state_tensors: tuple = ()  # arch_spec.StateTensor: per request, per "linear" layer
    attention_sinks: bool = False
    # Elements of one rotary cos/sin table row (ModelShape.rope_cache_bytes): what the architecture's rotary
    # embedding covers of a head (partial_rotary_factor x head_dim; MLA: qk_rope_head_dim; 0: no RoPE, Nemotron-H).
    # Every family module declares it (arch_common.text_shape); None, only for shapes built by hand in tests, is a
    # whole head's (MLA: qk_rope_head_dim).
    rotary_dim: Optional[int] = None
    rope_tables: int = 1  # distinct cos/sin tables its layers use (Gemma 3: one per RoPE base of local / global)
    # Per-token elements of a "linear" layer's projections, on one rank: its input projections' outputs and its
    # output projection's input (Qwen3-Next in_proj_qkvz + in_proj_ba + out_proj; Mamba-2 in_proj + out_proj),
    # the linear layer's counterpart of attention's q/k/v + output widths in the activation formula.
    linear_widths: tuple[HeadSplitWidth, ...] = ()

    def __post_init__(self):
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", self.qk_rope_head_dim if self.is_mla else self.head_dim)
        if self.layer_kinds and len(self.layer_kinds) != self.num_layers:
            raise ValueError(f"{self.model_type}: {len(self.layer_kinds)} layer kinds for {self.num_layers} layers")
        if "sliding" in self.layer_kinds and self.sliding_window <= 0:
            raise ValueError(f"{self.model_type}: sliding layers without a sliding_window")
        if "chunked" in self.layer_kinds and self.attention_chunk_size <= 0:
            raise ValueError(f"{self.model_type}: chunked layers without an attention_chunk_size")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    def linear_width(self, tp: int = 1) -> int:
        return sum(w.per_rank(tp) for w in self.linear_widths)

    def kinds(self) -> tuple[str, ...]:
        """layer_kinds with () spelled out: one kind per decoder layer."""
        return self.layer_kinds or ("full",) * self.num_layers
