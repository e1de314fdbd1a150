"""fp8 block checkpoints built in the tests from a random bf16 one, quantized here (not by the runtime's code): per
[128, 128] block of each linear weight, scale = amax / 448 (fp32), weight = round_to_e4m3(w / scale), stored as
weight float8_e4m3fn + weight_scale_inv fp32 [ceil(rows/128), ceil(cols/128)], as DeepSeek-V3 / Qwen3-FP8 ship them
(transformers' FineGrainedFP8 quantizer). Not a test file (run_suite collects test_*.py only)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Dict

import torch

BLOCK = 128
E4M3_MAX = 448.0
LINEAR_PARTS = (".self_attn.", ".mlp.")  # the converted modules: every attention / MLP projection
ROUTER = ".mlp.gate.weight"  # a MoE router stays bf16 (as in DeepSeek-V3's published checkpoint)


def make_random_qwen3_bf16(path: str, seed: int = 0, intermediate_size: int = 320) -> str:
    """A random Qwen3 whose projections hold whole 128-blocks and, at intermediate 320 (2.5 blocks), ragged ones."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=intermediate_size, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                      rope_theta=10000.0, tie_word_embeddings=False, eos_token_id=1, bos_token_id=0,
                      torch_dtype="bfloat16")
    model = Qwen3ForCausalLM(cfg)
    # projections at std 0.04 under unit-scale embeddings: fp8's ~3% weight error then moves the logits less than
    # the gaps between a random model's top tokens (at 0.08 everywhere top-1 agreement with bf16 is ~83%)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 1.0 if "embed" in name or "lm_head" in name else 0.04)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    return path


def quantize_block(w: torch.Tensor, block: int = BLOCK):
    """(fp8 weight, fp32 scales) of a 2-D weight, one scale per [block, block] tile (ragged tiles at the edges)."""
    rows, cols = w.shape
    sr, sc = -(-rows // block), -(-cols // block)
    padded = torch.zeros(sr * block, sc * block, dtype=torch.float64)
    padded[:rows, :cols] = w.double()
    tiles = padded.reshape(sr, block, sc, block)
    scale = (tiles.abs().amax(dim=(1, 3)) / E4M3_MAX).clamp(min=1e-12)
    q = (tiles / scale[:, None, :, None]).reshape(sr * block, sc * block)[:rows, :cols]
    return q.to(torch.float8_e4m3fn), scale.float()


def dequantize_reference(q: torch.Tensor, scale: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """fp64 value of a stored pair, element by element (the loader's independent reference)."""
    rows, cols = q.shape
    r = torch.arange(rows)[:, None] // block
    c = torch.arange(cols)[None, :] // block
    return q.double() * scale.double()[r, c]


def write_fp8_block_checkpoint(bf16_dir: str, out_dir: str, not_converted=("lm_head",),
                               keep_dense=()) -> Dict[str, torch.Tensor]:
    """The fp8 block copy of a bf16 checkpoint; returns {name: fp64 value the checkpoint stands for} of every tensor.
    keep_dense: substrings of linear weights left bf16 (they must be covered by not_converted to be consistent)."""
    from safetensors.torch import load_file, save_file

    os.makedirs(out_dir, exist_ok=True)
    tensors = load_file(os.path.join(bf16_dir, "model.safetensors"))
    out, values = {}, {}
    for name, t in tensors.items():
        linear = name.endswith(".weight") and t.dim() == 2 and any(p in name for p in LINEAR_PARTS) and \
            not name.endswith(ROUTER)
        if linear and not any(k in name for k in keep_dense):
            q, s = quantize_block(t)
            out[name], out[name + "_scale_inv"] = q, s
            values[name] = dequantize_reference(q, s)
        else:
            out[name] = t
            values[name] = t.double()
    save_file(out, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(bf16_dir, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [BLOCK, BLOCK], "modules_to_not_convert": list(not_converted)}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for extra in ("generation_config.json",):
        if os.path.isfile(os.path.join(bf16_dir, extra)):
            shutil.copy(os.path.join(bf16_dir, extra), out_dir)
    return values


def make_random_deepseek_v3_bf16(path: str, seed: int = 0) -> str:
    """A random DeepSeek-V3 (MLA with q_lora, a dense first layer, then routed + shared experts with noaux_tc
    routing) of hidden 256, saved in bf16 like the published checkpoints' non-fp8 tensors. Projections at std 0.02:
    at 0.04 top-1 agreement with the fp8 copy sits at 95%, the gaps between a random model's top tokens that small."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    cfg = DeepseekV3Config(vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                           num_hidden_layers=3, num_attention_heads=4, q_lora_rank=192, kv_lora_rank=128,
                           qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, first_k_dense_replace=1,
                           n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                           norm_topk_prob=True, routed_scaling_factor=2.5, max_position_embeddings=512,
                           eos_token_id=None, bos_token_id=None, tie_word_embeddings=False, torch_dtype="bfloat16")
    model = DeepseekV3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 1.0 if "embed" in name or "lm_head" in name else 0.02)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    return path
