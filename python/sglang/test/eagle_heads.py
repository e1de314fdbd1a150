"""Random EAGLE-3 / EAGLE-1 draft heads for a given target, for tests: config.json in the published layout
(LlamaForCausalLMEagle3 / LlamaForCausalLMEagle, model_type llama) and a safetensors file of random tensors under
the published names (mem_plan/draft_heads.py lists them). A random head's proposals are rarely accepted: tests check
exactness and that the head is computed right, not speed."""

from __future__ import annotations

import json
import os
from typing import Dict, Optional, Sequence

import torch

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


def _config(target: dict, arch: str, layers: int, **extra) -> dict:
    H = target["hidden_size"]
    cfg = {"architectures": [arch], "model_type": "llama", "hidden_size": H, "intermediate_size": 2 * H,
           "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
           "num_hidden_layers": layers, "rms_norm_eps": 1e-5, "vocab_size": target["vocab_size"],
           "max_position_embeddings": 2048, "rope_theta": 10000.0, "hidden_act": "silu", "torch_dtype": "float32",
           "tie_word_embeddings": False, "bos_token_id": target.get("bos_token_id"), "eos_token_id": None}
    cfg.update(extra)
    return cfg


def _layer(prefix: str, H: int, in_features: int, g: torch.Generator, std: float) -> Dict[str, torch.Tensor]:
    r = lambda *shape: torch.randn(*shape, generator=g) * std  # noqa: E731
    q, kv, inter = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, 2 * H
    return {f"{prefix}.self_attn.q_proj.weight": r(q, in_features), f"{prefix}.self_attn.k_proj.weight": r(kv, in_features),
            f"{prefix}.self_attn.v_proj.weight": r(kv, in_features), f"{prefix}.self_attn.o_proj.weight": r(H, q),
            f"{prefix}.mlp.gate_proj.weight": r(inter, H), f"{prefix}.mlp.up_proj.weight": r(inter, H),
            f"{prefix}.mlp.down_proj.weight": r(H, inter),
            f"{prefix}.post_attention_layernorm.weight": 1 + 0.1 * torch.randn(H, generator=g)}


def _save(path: str, cfg: dict, tensors: Dict[str, torch.Tensor]) -> str:
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(path, "model.safetensors"))
    return path


def _target_config(target_path: str) -> dict:
    with open(os.path.join(target_path, "config.json")) as f:
        return json.load(f)


def make_eagle3_head(path: str, target_path: str, seed: int = 0, draft_vocab_size: Optional[int] = None,
                     aux_layer_ids: Optional[Sequence[int]] = None, std: float = 0.2) -> str:
    """An EAGLE-3 head: fc [H, 3H], midlayer (q/k/v read 2H), norms, lm_head over draft_vocab_size tokens (default
    half the target's) and the maps d2t (draft id -> target id offset) / t2d over a random sorted subset."""
    t = _target_config(target_path)
    H, V = t["hidden_size"], t["vocab_size"]
    Vd = draft_vocab_size or V // 2
    g = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(V, generator=g)[:Vd].sort().values
    tensors = {"fc.weight": torch.randn(H, 3 * H, generator=g) * std / 2,
               "midlayer.hidden_norm.weight": 1 + 0.1 * torch.randn(H, generator=g),
               "midlayer.input_layernorm.weight": 1 + 0.1 * torch.randn(H, generator=g),
               "norm.weight": 1 + 0.1 * torch.randn(H, generator=g),
               "lm_head.weight": torch.randn(Vd, H, generator=g) * std,
               "d2t": chosen - torch.arange(Vd), "t2d": torch.zeros(V, dtype=torch.bool).index_fill(0, chosen, True)}
    tensors.update(_layer("midlayer", H, 2 * H, g, std))
    extra = {"draft_vocab_size": Vd}
    if aux_layer_ids is not None:
        extra["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)}
    return _save(path, _config(t, "LlamaForCausalLMEagle3", 1, **extra), tensors)


def make_eagle_head(path: str, target_path: str, seed: int = 0, layers: int = 1, std: float = 0.2) -> str:
    """An EAGLE-1 head: fc [H, 2H] with bias and `layers` Llama layers (the first without input_layernorm)."""
    t = _target_config(target_path)
    H = t["hidden_size"]
    g = torch.Generator().manual_seed(seed)
    tensors = {"fc.weight": torch.randn(H, 2 * H, generator=g) * std, "fc.bias": torch.randn(H, generator=g) * std}
    for i in range(layers):
        tensors.update(_layer(f"layers.{i}", H, H, g, std))
        if i:
            tensors[f"layers.{i}.input_layernorm.weight"] = 1 + 0.1 * torch.randn(H, generator=g)
    return _save(path, _config(t, "LlamaForCausalLMEagle", layers), tensors)


def make_llama_target(path: str, tok, layers: int = 6, seed: int = 0) -> str:
    """A random fp32 Llama target (hidden 64) with the default model's tokenizer: enough layers for EAGLE-3's three
    auxiliary layers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = (len(tok) + 63) // 64 * 64
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                      max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.bos_token_id, initializer_range=0.3)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path
