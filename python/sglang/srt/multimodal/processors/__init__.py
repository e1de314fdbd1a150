"""Multimodal processors by architecture (lazy imports): get_mm_processor(hf_config, model_dir, server_args)."""

from __future__ import annotations

import importlib
from typing import Dict, Optional, Tuple

_PKG = "sglang.srt.multimodal.processors"

# architecture -> (module, class)
PROCESSOR_REGISTRY: Dict[str, Tuple[str, str]] = {
    "LlavaForConditionalGeneration": (f"{_PKG}.llava", "LlavaImageProcessor"),
}


def get_mm_processor(architecture: str, hf_config, model_dir: str, server_args) -> Optional[object]:
    """The processor for a multimodal architecture; None for text-only models."""
    if architecture not in PROCESSOR_REGISTRY:
        return None
    module, name = PROCESSOR_REGISTRY[architecture]
    return getattr(importlib.import_module(module), name)(hf_config, model_dir, server_args)
