"""A random DeepSeek-V3 checkpoint with one multi-token-prediction (MTP) layer, and a plain-torch reference of that
layer (tests of NEXTN: models/deepseek_nextn.py).

save_v3_with_mtp writes what DeepSeek-V3's checkpoint layout holds, with random tensors: the target saved by
transformers' own DeepseekV3ForCausalLM (num_hidden_layers L, the first layer dense, then routed + shared experts,
q_lora, noaux_tc routing with a random e_score_correction_bias, YaRN), plus model.layers.{L}.* under the published
names: a sparse decoder layer (transformers' own tensors of a one-layer sparse model, renamed), enorm, hnorm, eh_proj
[H, 2H], shared_head.norm, and shared_head.head / embed_tokens (copies of the target's lm_head / embedding, as V3's).

mtp_reference computes the published MTP equations independently of the runtime, over one whole sequence:
    x = eh_proj([rms(embed(t), enorm) | rms(f, hnorm)]),  h = shared_head.norm(layer(x)),  logits = lm_head(h)
with transformers' DeepseekV3 decoder layer as `layer` (full causal attention, no paged KV), loaded through
transformers from the same tensors.
"""

from __future__ import annotations

import json
import os
from typing import Tuple

import torch
from safetensors.torch import load_file, save_file

VOCAB = 512
HIDDEN = 64
FIELDS = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, moe_intermediate_size=32,
              num_attention_heads=4, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
              n_shared_experts=1, max_position_embeddings=512, eos_token_id=None, bos_token_id=None,
              tie_word_embeddings=False, q_lora_rank=96, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
              topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, num_nextn_predict_layers=1,
              rope_parameters={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                               "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0,
                               "rope_theta": 10000.0})
MTP_OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")


def _random_v3(num_layers: int, first_dense: int, vocab: int):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM(DeepseekV3Config(**dict(FIELDS, vocab_size=vocab), num_hidden_layers=num_layers,
                                                   first_k_dense_replace=first_dense))
    with torch.no_grad():  # more spread than transformers' init, so greedy paths and routing are not degenerate
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.normal_(0, 0.5)
    return model.float().eval()


def _norm_weight(n: int) -> torch.Tensor:
    return 1.0 + 0.1 * torch.randn(n)


def save_v3_with_mtp(path: str, num_layers: int = 2, seed: int = 0, vocab: int = VOCAB, tokenizer=None) -> str:
    """A random V3 target of num_layers layers plus one MTP layer (model.layers.{num_layers}.*) at path (with
    `tokenizer` saved beside it when given: vocab must then cover it)."""
    torch.manual_seed(seed)
    _random_v3(num_layers, 1, vocab).save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    scratch = os.path.join(path, "_mtp_layer")
    _random_v3(1, 0, vocab).save_pretrained(scratch)  # one sparse layer's tensors, transformers' names
    file = os.path.join(path, "model.safetensors")
    tensors, layer = load_file(file), load_file(os.path.join(scratch, "model.safetensors"))
    for name in os.listdir(scratch):
        os.remove(os.path.join(scratch, name))
    os.rmdir(scratch)
    mtp = f"model.layers.{num_layers}."
    tensors.update({name.replace("model.layers.0.", mtp): t for name, t in layer.items()
                    if name.startswith("model.layers.0.")})
    tensors.update({mtp + "enorm.weight": _norm_weight(HIDDEN), mtp + "hnorm.weight": _norm_weight(HIDDEN),
                    mtp + "shared_head.norm.weight": _norm_weight(HIDDEN),
                    mtp + "eh_proj.weight": 0.2 * torch.randn(HIDDEN, 2 * HIDDEN),
                    mtp + "embed_tokens.weight": tensors["model.embed_tokens.weight"].clone(),
                    mtp + "shared_head.head.weight": tensors["lm_head.weight"].clone()})
    save_file(tensors, file, metadata={"format": "pt"})
    return path


def load_head(target_model, model_config, device: str = "cpu"):
    """The NEXTN head of a loaded target, in its dtype, its tensors read from the target's own checkpoint (what
    model_executor/draft_head.build_head does for a served head)."""
    from sglang.srt.model_loader.loader import set_default_torch_dtype
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
    from sglang.srt.models.deepseek_nextn import DeepseekNextN

    with set_default_torch_dtype(model_config.dtype), torch.device(device):
        head = DeepseekNextN(model_config.hf_config, target_model)
    head.load_weights(safetensors_weights_iterator(model_config.model_path))
    return head.eval()


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


class MTPReference:
    """The checkpoint's MTP layer in plain torch around transformers' decoder layer, float32 (transformers' grouped
    experts GEMM takes no float64)."""

    def __init__(self, path: str):
        from transformers import DeepseekV3ForCausalLM

        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
        n, self.eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
        tensors = load_file(os.path.join(path, "model.safetensors"))
        mtp = f"model.layers.{n}."
        self.own = {k: tensors[mtp + k].float() for k in MTP_OWN}
        self.embed = tensors["model.embed_tokens.weight"].float()
        # the inner layer as a one-layer sparse transformers model: its final norm is shared_head.norm
        ref_dir = os.path.join(path, "_reference")
        os.makedirs(ref_dir, exist_ok=True)
        layer = {k.replace(mtp, "model.layers.0."): t for k, t in tensors.items()
                 if k.startswith(mtp) and k[len(mtp):] not in MTP_OWN
                 and k[len(mtp):] not in ("embed_tokens.weight", "shared_head.head.weight")}
        layer.update({"model.embed_tokens.weight": tensors["model.embed_tokens.weight"],
                      "model.norm.weight": tensors[mtp + "shared_head.norm.weight"],
                      "lm_head.weight": tensors["lm_head.weight"]})
        save_file(layer, os.path.join(ref_dir, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(ref_dir, "config.json"), "w") as f:
            json.dump(dict(cfg, num_hidden_layers=1, first_k_dense_replace=0), f)
        self.inner = DeepseekV3ForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, features: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """One sequence: tokens [S] (row q: the token at q + 1), features [S, H] (row q: the target's feature at q),
        positions 0..S-1 -> (logits [S, V], the head's hidden state [S, H]), float32."""
        x = torch.cat([_rms(self.embed[tokens], self.own["enorm.weight"], self.eps),
                       _rms(features.float(), self.own["hnorm.weight"], self.eps)], dim=-1)
        x = x @ self.own["eh_proj.weight"].T
        out = self.inner.model(inputs_embeds=x[None], position_ids=torch.arange(len(tokens))[None])
        hidden = out.last_hidden_state[0]  # after the model's final norm = shared_head.norm
        return self.inner.lm_head(hidden), hidden
