"""The architectures the planner prices: model_type -> its one ArchSpec (arch_spec.py), gathered from the family
modules listed here, and the refusal of every other model_type (naming it, what the planner lacks, and the ones it
knows). No model_type is priced as another: a multimodal config's text part is looked up under the architecture
it is (TEXT_MODEL_TYPE_ALIASES), never by a guess."""

from __future__ import annotations

import importlib
from functools import lru_cache

from sglang.srt.mem_plan.arch_spec import PLANNED_NOT_SERVED, ArchSpec

FAMILY_MODULES = (
    "arch_llama", "arch_gemma", "arch_qwen_moe", "arch_deepseek",  # dense, Gemma, Qwen MoE / Mixtral, MLA
    "arch_glm4_moe", "arch_gpt_oss", "arch_llama4", "arch_ernie",  # more MoE, windowed and chunked attention
    "arch_qwen3_next", "arch_mamba_hybrid",  # linear attention, state-space hybrids
)

# Text models of multimodal configs that are an architecture the registry knows under another name.
TEXT_MODEL_TYPE_ALIASES = {
    "qwen2_vl": "qwen2", "qwen2_vl_text": "qwen2", "qwen2_5_vl": "qwen2", "qwen2_5_vl_text": "qwen2",
    "qwen3_vl_text": "qwen3", "qwen3_vl_moe_text": "qwen3_moe", "qwen3_omni_moe_text": "qwen3_moe",
    # Kimi-K2 publishes model_type kimi_k2 with architectures DeepseekV3ForCausalLM and DeepSeek-V3's config keys
    "kimi_k2": "deepseek_v3",
}


@lru_cache(maxsize=None)
def registry() -> dict[str, ArchSpec]:
    """model_type -> ArchSpec over every family module; a model_type declared twice is a bug, refused here."""
    out: dict[str, ArchSpec] = {}
    for name in FAMILY_MODULES:
        for spec in importlib.import_module(f"sglang.srt.mem_plan.{name}").ARCHS:
            if spec.model_type in out:
                raise RuntimeError(f"model_type {spec.model_type!r} declared by two family modules ({name})")
            out[spec.model_type] = spec
    return out


def known_model_types() -> list[str]:
    return sorted(registry())


def canonical_model_type(model_type: str) -> str:
    return TEXT_MODEL_TYPE_ALIASES.get(model_type, model_type)


def arch_spec(model_type) -> ArchSpec:
    """The ArchSpec of a (text) model_type; ValueError naming it, what is missing and the model_types known."""
    spec = registry().get(canonical_model_type(model_type)) if model_type else None
    if spec is None:
        what = f"model_type {model_type!r}" if model_type else "a config.json without a model_type"
        raise ValueError(f"{what}: the planner has no declaration of this architecture (its weights, layer kinds and "
                         f"per-request memory), so it cannot size it and will not guess. It knows: "
                         f"{', '.join(known_model_types())}.")
    return spec


# model_type -> the model implementation (models/registry.py) that reads each layer's window from the planner's shape
# and is served with its sliding layers in the windowed pool (mem_cache/swa_pool.py). The family module may still
# declare the architecture planned-only: this list is what serves it.
SERVED_WITH_WINDOWS = {
    "mistral": "MistralForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}
# model_type -> the model implementation that serves an architecture its family module declares planned-only: the
# MLA models, cached as latent rows in the MLA pool (mem_cache/mla_pool.py; kimi_k2 is deepseek_v3 by alias).
SERVED_MLA = {
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}
SERVED_LAYER_KINDS = frozenset({"full", "sliding"})  # chunked layers: planned, not served
# A linear-attention / state-space family module that declares its architecture served serves the linear layers its
# config gives it: their state rows live in the planned linear-state pool (mem_cache/linear_state_pool.py). Any other
# architecture's linear layers are refused.
LINEAR_LAYER_KIND = "linear"
LINEAR_STATE_FAMILIES = frozenset({"linear-attention", "state-space"})


def not_served_note(model_type: str, layer_kinds: tuple = ()) -> str:
    """PLANNED_NOT_SERVED for what the planner knows and the runtime does not serve, else '': an architecture without
    a model implementation (models/registry.py; SERVED_WITH_WINDOWS and SERVED_MLA name the ones served beside their
    family's declaration), one whose config gives it chunked layers (linear ones unless it is a served
    linear-attention / state-space family), or sliding layers on a model that attends over the whole context (only
    SERVED_WITH_WINDOWS masks and pools them)."""
    spec = arch_spec(model_type)
    windowed_model = spec.model_type in SERVED_WITH_WINDOWS
    if not spec.served and not windowed_model and spec.model_type not in SERVED_MLA:
        return f"{PLANNED_NOT_SERVED}: {spec.model_type}"
    served_kinds = set(SERVED_LAYER_KINDS if windowed_model else {"full"})
    if spec.served and spec.family in LINEAR_STATE_FAMILIES:
        served_kinds.add(LINEAR_LAYER_KIND)
    other = sorted(set(layer_kinds) - served_kinds)
    if other:
        return f"{PLANNED_NOT_SERVED}: {spec.model_type} with {' / '.join(other)} layers"
    return ""


def check_served(model_type: str, layer_kinds: tuple = ()) -> None:
    """What a start runs before loading: ValueError with the plan's own words for a planned-only architecture."""
    note = not_served_note(model_type, layer_kinds)
    if note:
        raise ValueError(f"{note}. `sglang plan` sizes it; serving it needs a model implementation this runtime "
                         f"lacks (models/registry.py).")
