"""PlanInputs: every integer the planner needs, measured or declared by the component that owns it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from sglang.srt.mem_plan.layer_pools import NO_LAYER_POOLS, LayerPools
from sglang.srt.mem_plan.sizes import REQ_TO_TOKEN_ELEM_BYTES
from sglang.srt.mem_plan.spec_sizes import SpecInputs
from sglang.srt.mem_plan.specs import WorkspaceSpec

# Default provenance of each term; callers override through PlanInputs.sources.
DEFAULT_SOURCES = {
    "weights": "measured",
    "kv_cache": "formula",
    "kv_window": "formula",
    "kv_windowed": "formula",
    "kv_windowed_map": "formula",
    "linear_state": "formula",
    "req_to_token": "formula",
    "attention_workspace": "declared",
    "logits": "declared",
    "activations": "measured",
    "moe_workspace": "declared",
    "cuda_graphs": "measured",
    "encoder": "declared",
    "mm_embedding_cache": "declared",
    "grammar": "declared",
    "safety_margin": "formula",
    # speculative decoding (spec_sizes.py, spec_terms.py)
    "draft_weights": "formula",
    "draft_kv_cache": "formula",
    "spec_hidden_states": "declared",
    "draft_cuda_graphs": "formula",
    "draft_attention_workspace": "declared",
}


def check_mem_fraction_static(value: Optional[float]) -> None:
    """The one range check of --mem-fraction-static (ServerArgs and PlanInputs): unset, or in (0, 1)."""
    if value is not None and not 0.0 < value < 1.0:
        raise ValueError(f"--mem-fraction-static must be in (0, 1), got {value}. "
                         "Leave it unset to let the memory planner derive it.")


@dataclass(frozen=True)
class PlanInputs:
    """Inputs to plan_memory(). All sizes in bytes; all counts in tokens or requests.

    pre_load_free_bytes  free device memory before weights load, MIN over ranks (measure.py)
    weight_bytes         measured weights (+ LoRA/draft weights) on this rank
    kv_cell_bytes        KV bytes per token on this rank (specs.KVCellSpec.cell_bytes) of the "full" layers
    layer_pools          the sliding / chunked / linear layers' per-slot pools (layer_pools.py); empty: all full
    kv_fixed_bytes       KV bytes that do not grow with the pool: fp8's per-(layer, KV head) scales
                         (specs.KVCellSpec.fixed_bytes); charged in the kv_cache term
    mem_fraction_static  None = auto (solved); a value = honoured exactly or MemoryPlanError
    workspace            the attention backend's declaration, linear in request slots and graph batch size
    logits_bytes         fixed sampler/logits bytes; logits_per_req_bytes adds bytes per request slot
    moe_workspace_bytes  MoE models: the fused-experts buffers, fixed (sized by the chunk, not the slots)
    cuda_graph_max_bs    None = upstream tier for device_total_bytes (0 when the device is unknown)
    min_kv_tokens        None = one prefill chunk (min(context_len, chunked_prefill_size)), page-aligned up
    """

    pre_load_free_bytes: int
    weight_bytes: int
    kv_cell_bytes: int
    context_len: int
    page_size: int = 1
    mem_fraction_static: Optional[float] = None
    max_running_requests: Optional[int] = None
    max_total_tokens: Optional[int] = None
    cap_bytes: Optional[int] = None
    cap_source: str = "--max-total-memory-gb"  # what set cap_bytes (a flag, or the CPU default rule)
    chunked_prefill_size: int = 8192
    activation_bytes: int = 0
    workspace: WorkspaceSpec = WorkspaceSpec()
    req_to_token_elem_bytes: int = REQ_TO_TOKEN_ELEM_BYTES
    logits_bytes: int = 0
    cuda_graph_bytes: int = 0
    encoder_bytes: int = 0
    safety_margin_bytes: Optional[int] = None
    device_total_bytes: Optional[int] = None
    sources: dict = field(default_factory=dict)
    # additions beyond the runner contract
    logits_per_req_bytes: int = 0
    cuda_graph_max_bs: Optional[int] = None
    tp_size: int = 1
    min_kv_tokens: Optional[int] = None
    mm_cache_bytes: int = 0  # multimodal embedding cache budget (--mm-embedding-cache-mb)
    encoder_detail: str = ""  # how the encoder term was obtained, for the rendered plan
    grammar_per_req_bytes: int = 0  # structured output: bitmask row per request slot (sizes.py)
    grammar_cache_bytes: int = 0  # structured output: compiled-grammar cache budget (--grammar-cache-mb)
    moe_workspace_bytes: int = 0  # MoE models: the fused-experts workspace at the chunk size (moe_sizes.py)
    moe_workspace_detail: str = ""
    # one term per encoded modality (encoder.EncoderTerm: encoder_image / encoder_video / encoder_audio); with them
    # encoder_bytes is 0, and a plan without them shows the one shared `encoder` term (--encoder-mem-reserve or 0)
    encoder_terms: tuple = ()
    kv_fixed_bytes: int = 0
    kv_detail: str = ""  # a quantized KV format's bytes and gain over bf16 (kv_quant.describe), for the table
    # a quantized format's recent-window ring, bytes per window row (kv_quant.window_bytes_per_slot); the rows are
    # planned from the budget (kv_window.py): the kv_window term
    kv_window_row_bytes: int = 0
    layer_pools: LayerPools = NO_LAYER_POOLS
    # speculative decoding (None: off): the draft's weights and KV cell, the verify rows (spec_sizes.SpecInputs)
    speculative: Optional[SpecInputs] = None

    @property
    def draft_kv_cell_bytes(self) -> int:
        return self.speculative.draft_kv_cell_bytes if self.speculative is not None else 0

    @property
    def token_cell_bytes(self) -> int:
        """What one token of the pool costs: the target's full-layer cell + the draft's (the same slots)."""
        return self.kv_cell_bytes + self.draft_kv_cell_bytes

    @property
    def static_weight_bytes(self) -> int:
        """The weights the static region holds: the target's + a draft model's / head's."""
        return self.weight_bytes + (self.speculative.draft_weight_bytes if self.speculative is not None else 0)

    @property
    def encoder_total_bytes(self) -> int:
        return self.encoder_bytes + sum(t.num_bytes for t in self.encoder_terms)

    def __post_init__(self):
        for name in ("pre_load_free_bytes", "weight_bytes", "kv_cell_bytes", "activation_bytes", "logits_bytes",
                     "cuda_graph_bytes", "encoder_bytes", "logits_per_req_bytes", "mm_cache_bytes",
                     "grammar_per_req_bytes", "grammar_cache_bytes", "moe_workspace_bytes", "kv_fixed_bytes",
                     "kv_window_row_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"PlanInputs.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("context_len", "page_size", "req_to_token_elem_bytes", "tp_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"PlanInputs.{name} must be > 0, got {getattr(self, name)}")
        for name in ("max_running_requests", "max_total_tokens", "cap_bytes", "device_total_bytes",
                     "min_kv_tokens"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"PlanInputs.{name} must be > 0 when set, got {value}")
        for name in ("safety_margin_bytes", "cuda_graph_max_bs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"PlanInputs.{name} must be >= 0 when set, got {value}")
        check_mem_fraction_static(self.mem_fraction_static)
        if self.encoder_terms and self.encoder_bytes:
            raise ValueError("PlanInputs: per-modality encoder_terms and a shared encoder_bytes exclude each other")
        if self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1:
            raise ValueError("chunked_prefill_size must be positive, or -1 (disabled)")
        bad = {k: v for k, v in self.sources.items() if v not in ("measured", "declared", "formula")}
        if bad:
            raise ValueError(f"PlanInputs.sources values must be measured/declared/formula: {bad}")

    def source_of(self, term: str) -> str:
        return self.sources.get(term, DEFAULT_SOURCES[term])
