"""Multimodal processors by architecture (lazy imports): get_mm_processor(hf_config, model_dir, server_args)."""

from __future__ import annotations

import importlib
from typing import Dict, Optional, Tuple

_PKG = "sglang.srt.multimodal.processors"

# architecture -> (module, class)
PROCESSOR_REGISTRY: Dict[str, Tuple[str, str]] = {
    "LlavaForConditionalGeneration": (f"{_PKG}.llava", "LlavaImageProcessor"),
    "Qwen2_5_VLForConditionalGeneration": (f"{_PKG}.qwen2_5_vl", "Qwen2_5_VLProcessor"),
    "Qwen2AudioForConditionalGeneration": (f"{_PKG}.qwen2_audio", "Qwen2AudioProcessor"),
    "Qwen3OmniMoeThinkerForConditionalGeneration": (f"{_PKG}.qwen3_omni", "Qwen3OmniThinkerProcessor"),
    "Qwen3OmniMoeForConditionalGeneration": (f"{_PKG}.qwen3_omni", "Qwen3OmniThinkerProcessor"),
}


def get_mm_processor_for_dir(model_dir: str, server_args) -> Optional[object]:
    """The processor for a model directory (reads config.json); None for text-only models. No weights are loaded."""
    import json
    import os

    path = os.path.join(model_dir or "", "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        archs = json.load(f).get("architectures") or []
    if not archs or archs[0] not in PROCESSOR_REGISTRY:
        return None
    from transformers import AutoConfig

    return get_mm_processor(archs[0], AutoConfig.from_pretrained(model_dir), model_dir, server_args)


def get_mm_processor(architecture: str, hf_config, model_dir: str, server_args) -> Optional[object]:
    """The processor for a multimodal architecture; None for text-only models."""
    if architecture not in PROCESSOR_REGISTRY:
        return None
    module, name = PROCESSOR_REGISTRY[architecture]
    return getattr(importlib.import_module(module), name)(hf_config, model_dir, server_args)
