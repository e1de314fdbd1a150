"""Attention backend registry: name -> class, imported only when chosen (CPU runs never import GPU kernels)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, Tuple

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

_PKG = "sglang.srt.layers.attention"

# name -> (module, class)
ATTENTION_BACKENDS: Dict[str, Tuple[str, str]] = {
    "torch_native": (f"{_PKG}.torch_native_backend", "TorchNativeAttnBackend"),
    "triton": (f"{_PKG}.triton_backend", "TritonAttnBackend"),
    "flashinfer": (f"{_PKG}.flashinfer_backend", "FlashInferAttnBackend"),
    "aiter": (f"{_PKG}.aiter_backend", "AiterAttnBackend"),
}

DEFAULT_ATTENTION_BACKEND = "torch_native"


def get_attention_backend_class(name: str) -> type:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"Unknown attention backend {name!r}; choose one of {', '.join(sorted(ATTENTION_BACKENDS))}.")
    module_name, class_name = ATTENTION_BACKENDS[name]
    return getattr(importlib.import_module(module_name), class_name)


def create_attention_backend(
    name: str | None, *, model_config: Any, req_to_token_pool: Any, token_to_kv_pool: Any, device: str
) -> "AttentionBackend":
    cls = get_attention_backend_class(name or DEFAULT_ATTENTION_BACKEND)
    return cls(
        model_config=model_config,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool=token_to_kv_pool,
        device=device,
    )
