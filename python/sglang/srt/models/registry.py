"""Model registry: HF architecture name -> model class, imported on first use."""

from __future__ import annotations

import importlib
from typing import Dict, Tuple

_PKG = "sglang.srt.models"

# architecture -> (module, class)
MODEL_REGISTRY: Dict[str, Tuple[str, str]] = {
    "LlamaForCausalLM": (f"{_PKG}.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": (f"{_PKG}.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": (f"{_PKG}.qwen3", "Qwen3ForCausalLM"),
    "Qwen2MoeForCausalLM": (f"{_PKG}.qwen2_moe", "Qwen2MoeForCausalLM"),
    "Qwen3MoeForCausalLM": (f"{_PKG}.qwen3_moe", "Qwen3MoeForCausalLM"),
    "Qwen3NextForCausalLM": (f"{_PKG}.qwen3_next", "Qwen3NextForCausalLM"),
    "MixtralForCausalLM": (f"{_PKG}.mixtral", "MixtralForCausalLM"),
    "Gemma3ForCausalLM": (f"{_PKG}.gemma3", "Gemma3ForCausalLM"),
    "MistralForCausalLM": (f"{_PKG}.mistral", "MistralForCausalLM"),
    "GptOssForCausalLM": (f"{_PKG}.gpt_oss", "GptOssForCausalLM"),
    "DeepseekV2ForCausalLM": (f"{_PKG}.deepseek_v2", "DeepseekV2ForCausalLM"),
    "DeepseekV3ForCausalLM": (f"{_PKG}.deepseek_v2", "DeepseekV3ForCausalLM"),
    "NemotronHForCausalLM": (f"{_PKG}.nemotron_h", "NemotronHForCausalLM"),
    "LlavaForConditionalGeneration": (f"{_PKG}.llava", "LlavaForConditionalGeneration"),
    "Qwen2_5_VLForConditionalGeneration": (f"{_PKG}.qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    "Qwen2AudioForConditionalGeneration": (f"{_PKG}.qwen2_audio", "Qwen2AudioForConditionalGeneration"),
    "Qwen3OmniMoeThinkerForConditionalGeneration": (f"{_PKG}.qwen3_omni_thinker",
                                                    "Qwen3OmniMoeThinkerForConditionalGeneration"),
    "Qwen3OmniMoeForConditionalGeneration": (f"{_PKG}.qwen3_omni_thinker", "Qwen3OmniMoeForConditionalGeneration"),
}


def get_supported_archs() -> list:
    return sorted(MODEL_REGISTRY)


def get_model_class(architecture: str) -> type:
    if architecture not in MODEL_REGISTRY:
        raise ValueError(
            f"Model architecture {architecture!r} is not supported; supported: {', '.join(get_supported_archs())}."
        )
    module, class_name = MODEL_REGISTRY[architecture]
    return getattr(importlib.import_module(module), class_name)
