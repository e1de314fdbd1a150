"""Small random-weight MoE checkpoints (Qwen3-MoE, Mixtral, Qwen2-MoE) built from transformers' own config classes
and saved in HF layout (per-expert tensors), optionally with the SmolLM2 tokenizer so a server can chat.

Geometry: 8 experts, top 2 (Qwen2-MoE: top 2 plus a shared expert and one dense layer), hidden 64, expert
intermediate 32 (Mixtral 48), 3 layers, 4 heads / 2 KV heads; intermediate sizes divide by 2 (tp=2 tests).
Any config field can be overridden; embed_std redraws the token embedding with that spread (1.0: a residual stream
that one layer's update does not swamp, as in trained models; the quantized-experts agreement test uses it).
moe_gguf_fixtures.py writes these checkpoints as GGUF files.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.test.engine_fixtures import spread_random_weights

VOCAB_SIZE = 512
COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=1024, tie_word_embeddings=False,
              eos_token_id=None, bos_token_id=None)  # no EOS: HF's reference (min_new_tokens) would mask it


def _with_tokenizer(common: dict) -> tuple[dict, object]:
    """The SmolLM2 tokenizer and the config fields it needs: its vocabulary (rounded up to 64) and EOS."""
    from transformers import AutoTokenizer

    from sglang.test.engine_fixtures import default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    vocab = (len(tok) + 63) // 64 * 64
    return dict(common, vocab_size=vocab, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id), tok


def _save(model, path: str, tok, seed: int, embed_std: Optional[float] = None) -> str:
    torch.manual_seed(seed)
    spread_random_weights(model.to(torch.float32))
    if embed_std is not None:
        with torch.no_grad():
            model.get_input_embeddings().weight.normal_(0, embed_std)
    model.save_pretrained(path, safe_serialization=True)
    if tok is not None:
        tok.save_pretrained(path)
    return path


def make_random_qwen3_moe(path: str, seed: int = 0, tokenizer: bool = False, embed_std: Optional[float] = None,
                          **overrides) -> str:
    """overrides: config fields replacing these defaults (the GGUF tests pick their own geometry)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    common, tok = _with_tokenizer(COMMON) if tokenizer else (COMMON, None)
    defaults = dict(intermediate_size=128, moe_intermediate_size=32, num_experts=8, norm_topk_prob=True, head_dim=32,
                    rope_theta=10000.0)
    cfg = Qwen3MoeConfig(**{**common, **defaults, **overrides})
    torch.manual_seed(seed)
    return _save(Qwen3MoeForCausalLM(cfg), path, tok, seed, embed_std)


def make_random_mixtral(path: str, seed: int = 0, tokenizer: bool = False, embed_std: Optional[float] = None,
                        **overrides) -> str:
    from transformers import MixtralConfig, MixtralForCausalLM

    common, tok = _with_tokenizer(COMMON) if tokenizer else (COMMON, None)
    cfg = MixtralConfig(**{**common, **dict(intermediate_size=48, num_local_experts=8, rope_theta=1e6), **overrides})
    torch.manual_seed(seed)
    return _save(MixtralForCausalLM(cfg), path, tok, seed, embed_std)


def make_random_qwen2_moe(path: str, seed: int = 0, tokenizer: bool = False, embed_std: Optional[float] = None,
                          **overrides) -> str:
    """Layer 1 is dense (mlp_only_layers): both kinds of layer in one model."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    common, tok = _with_tokenizer(COMMON) if tokenizer else (COMMON, None)
    defaults = dict(intermediate_size=96, moe_intermediate_size=32, num_experts=8, shared_expert_intermediate_size=64,
                    norm_topk_prob=False, mlp_only_layers=[1], rope_theta=10000.0)
    cfg = Qwen2MoeConfig(**{**common, **defaults, **overrides})
    torch.manual_seed(seed)
    model = Qwen2MoeForCausalLM(cfg)
    with torch.no_grad():  # HF initialises the qkv biases to zero; make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.3)
    return _save(model, path, tok, seed, embed_std)
