"""Small random-weight MoE checkpoints (Qwen3-MoE, Mixtral, Qwen2-MoE) built from transformers' own config classes
and saved in HF layout (per-expert tensors), optionally with the SmolLM2 tokenizer so a server can chat.

Geometry: 8 experts, top 2 (Qwen2-MoE: top 2 plus a shared expert and one dense layer), hidden 64, expert
intermediate 32 (Mixtral 48), 3 layers, 4 heads / 2 KV heads; intermediate sizes divide by 2 (tp=2 tests).
Any config field can be overridden; embed_std redraws the token embedding with that spread (1.0: a residual stream
that one layer's update does not swamp, as in trained models; the quantized-experts agreement test uses it).
moe_gguf_fixtures.py writes these checkpoints as GGUF files.
make_benchmark_qwen3_moe: issue 21's benchmark proportions (hidden 1024, 64 experts, top 8, expert intermediate 256,
16 heads / 4 KV heads of 64), any layer count and vocabulary, written tensor by tensor (no transformers model built).
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


BENCHMARK_GEOMETRY = dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                          num_experts=64, num_experts_per_tok=8, moe_intermediate_size=256, intermediate_size=3072)


def make_benchmark_qwen3_moe(path: str, num_layers: int = 16, vocab_size: int = 49152, seed: int = 0,
                             dtype: torch.dtype = torch.bfloat16, std: float = 0.02) -> str:
    """A random Qwen3-MoE of BENCHMARK_GEOMETRY in HF's per-expert layout (16 layers, vocab 49152: 0.90B parameters,
    0.15B active). Tensors are drawn one at a time and written with safetensors, so a 2-layer copy takes seconds."""
    import os

    from safetensors.torch import save_file
    from transformers import Qwen3MoeConfig

    g = BENCHMARK_GEOMETRY
    cfg = Qwen3MoeConfig(architectures=["Qwen3MoeForCausalLM"], vocab_size=vocab_size, num_hidden_layers=num_layers,
                         norm_topk_prob=True, max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=False,
                         eos_token_id=None, bos_token_id=None, torch_dtype=str(dtype).replace("torch.", ""), **g)
    os.makedirs(path, exist_ok=True)
    cfg.save_pretrained(path)
    gen = torch.Generator().manual_seed(seed)
    hidden, heads, kv, d = g["hidden_size"], g["num_attention_heads"], g["num_key_value_heads"], g["head_dim"]
    n = g["moe_intermediate_size"]

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * std).to(dtype)

    def ones(size):
        return torch.ones(size, dtype=dtype)

    tensors = {"model.embed_tokens.weight": rand(vocab_size, hidden), "lm_head.weight": rand(vocab_size, hidden),
               "model.norm.weight": ones(hidden)}
    for i in range(num_layers):
        p = f"model.layers.{i}."
        tensors.update({p + "input_layernorm.weight": ones(hidden), p + "post_attention_layernorm.weight": ones(hidden),
                        p + "self_attn.q_proj.weight": rand(heads * d, hidden),
                        p + "self_attn.k_proj.weight": rand(kv * d, hidden),
                        p + "self_attn.v_proj.weight": rand(kv * d, hidden),
                        p + "self_attn.o_proj.weight": rand(hidden, heads * d),
                        p + "self_attn.q_norm.weight": ones(d), p + "self_attn.k_norm.weight": ones(d),
                        p + "mlp.gate.weight": rand(g["num_experts"], hidden)})
        for e in range(g["num_experts"]):
            q = f"{p}mlp.experts.{e}."
            tensors.update({q + "gate_proj.weight": rand(n, hidden), q + "up_proj.weight": rand(n, hidden),
                            q + "down_proj.weight": rand(hidden, n)})
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return path
