"""ModelConfig: what the runtime needs to know about a model, read once from a Hugging Face directory.

The geometry, the context length and the dtypes are resolved by configs/resolved.py's resolve_model, the function
`sglang plan` resolves them with (so both refuse the same --context-length with the same message); `shape` keeps the
config.json geometry for the memory plan. Read here: the architecture, the HF config the models read, the rope
settings and the set of EOS ids.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Set

import torch

from sglang.srt.configs.hf_config_snapshot import load_hf_config
from sglang.srt.configs.resolved import resolve_device, resolve_model
from sglang.srt.mem_plan.build import ModelFacts
from sglang.srt.mem_plan.dtypes import torch_dtype
from sglang.srt.mem_plan.model_shapes import ModelShape, load_config

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

# Architectures whose checkpoints carry a vision/audio tower.
_MULTIMODAL_ARCH_HINTS = ("VL", "Vision", "Llava", "ForConditionalGeneration", "Mllama", "Audio")


def get_rope_parameters(hf_config: Any) -> dict:
    """Rope settings as one dict {"rope_type", "rope_theta", ...scaling keys}.

    Accepts transformers-5 `rope_parameters` and the older top-level `rope_theta` + `rope_scaling`.
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None)
    if isinstance(scaling, dict):
        for key, value in scaling.items():
            params.setdefault(key, value)
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(hf_config, "rope_theta", 10000.0)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    params["rope_type"] = rope_type
    return params


def _as_id_set(value: Any) -> Set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


@dataclass
class ModelConfig:
    model_path: str
    hf_config: Any
    architecture: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    facts: ModelFacts  # geometry, context length and dtypes, resolved as `sglang plan` resolves them
    device: str
    tie_word_embeddings: bool
    is_multimodal: bool
    eos_token_ids: Set[int] = field(default_factory=set)
    rope_parameters: dict = field(default_factory=dict)

    @property
    def context_len(self) -> int:
        return self.facts.context_len

    @property
    def shape(self) -> ModelShape:
        return self.facts.shape

    @property
    def dtype_name(self) -> str:  # canonical names (mem_plan/dtypes.py)
        return self.facts.dtype

    @property
    def kv_cache_dtype_name(self) -> str:
        return self.facts.kv_cache_dtype

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.facts.dtype)

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        """The dtype attention reads K/V in (an int KV format's codes are dequantized into the model dtype)."""
        from sglang.srt.mem_plan.dtypes import kv_compute_dtype

        return torch_dtype(kv_compute_dtype(self.facts.kv_cache_dtype, self.facts.dtype))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_server_args(cls, server_args: "ServerArgs", model_path: Optional[str] = None) -> "ModelConfig":
        """model_path: the resolved local HF directory (see model_loader.resolve_model_path)."""
        path = model_path or server_args.model_path
        if path is None:
            raise ValueError("ModelConfig needs a local model directory; call model_loader.resolve_model_path first.")
        from sglang.srt.configs.cache_dirs import startup_cache_dir

        return cls.from_pretrained(
            path,
            dtype=server_args.dtype,
            kv_cache_dtype=server_args.kv_cache_dtype,
            context_length=server_args.context_length,
            device=server_args.device,
            startup_cache_dir=startup_cache_dir(server_args),
        )

    @classmethod
    def from_pretrained(
        cls,
        model_path: str,
        dtype: str = "auto",
        kv_cache_dtype: str = "auto",
        context_length: Optional[int] = None,
        device: str = "auto",
        startup_cache_dir: Optional[str] = None,
    ) -> "ModelConfig":
        """startup_cache_dir: where a snapshot of the resolved HF config is read or written (hf_config_snapshot.py);
        None always runs AutoConfig."""
        if not os.path.isfile(os.path.join(model_path, "config.json")):
            raise FileNotFoundError(f"{model_path!r} is not a Hugging Face model directory (no config.json).")
        config_dict = load_config(model_path)
        architectures = config_dict.get("architectures") or []
        if not architectures:
            raise ValueError(f"{model_path}/config.json lists no 'architectures'.")
        architecture = architectures[0]
        device = resolve_device(device)
        facts = resolve_model(config_dict, device, dtype, kv_cache_dtype, context_length)
        text = facts.shape.text
        hf_config = load_hf_config(model_path, startup_cache_dir)
        text_config = getattr(hf_config, "text_config", None) or hf_config

        eos = _as_id_set(getattr(text_config, "eos_token_id", None)) | _as_id_set(config_dict.get("eos_token_id"))
        gen_file = os.path.join(model_path, "generation_config.json")
        if os.path.isfile(gen_file):
            with open(gen_file) as f:
                eos |= _as_id_set(json.load(f).get("eos_token_id"))

        return cls(
            model_path=model_path,
            hf_config=hf_config,
            architecture=architecture,
            num_hidden_layers=text.num_layers,
            hidden_size=text.hidden_size,
            num_attention_heads=text.num_q_heads,
            num_key_value_heads=text.num_kv_heads,
            head_dim=text.head_dim,
            vocab_size=text.vocab_size,
            facts=facts,
            device=device,
            tie_word_embeddings=text.tie_word_embeddings,
            is_multimodal=hasattr(hf_config, "vision_config") or any(h in architecture for h in _MULTIMODAL_ARCH_HINTS),
            eos_token_ids=eos,
            rope_parameters=get_rope_parameters(text_config),
        )
