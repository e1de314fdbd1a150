"""GLM-4.5 / GLM-4.5-Air / GLM-4.6 (model_type glm4_moe): DeepSeek-style MoE with GQA attention.

Layers 0 .. first_k_dense_replace-1 have a dense SwiGLU MLP; every later layer has n_routed_experts routed experts
(moe_intermediate_size each), n_shared_experts shared experts run as one MLP of n_shared_experts x
moe_intermediate_size, and a router (mlp.gate) with its e_score_correction_bias. Attention: q/k/v biases
(attention_bias), no o_proj bias, head_dim-wide q/k RMSNorms when use_qk_norm, rotary on the first
partial_rotary_factor of each head (the KV cell is the whole head either way). Every layer is full attention.

MTP: num_nextn_predict_layers (1 in GLM-4.5 / 4.5-Air / 4.6) extra layers sit in the checkpoint after the last
decoder layer (model.layers.{num_hidden_layers}.*): each one sparse decoder layer plus an eh_proj [H, 2H] and its
norms. HF transformers' Glm4MoeForCausalLM does not build them (it ignores those tensors on load), and neither does
this runtime, so the plan counts exactly what HF counts and leaves the MTP layer out; a plan that loads it for
speculative decoding must add it as its own term.
"""

from __future__ import annotations

from sglang.srt.mem_plan import arch_common as C
from sglang.srt.mem_plan.arch_spec import ArchSpec, WeightGroup
from sglang.srt.mem_plan.text_shape import TextShape

# transformers' Glm4MoeConfig defaults (5.x), for keys a config leaves out
ATTENTION_BIAS_DEFAULT = False
USE_QK_NORM_DEFAULT = False
N_SHARED_EXPERTS_DEFAULT = 1


def _geometry(cfg: dict) -> dict:
    hidden, heads, layers = C.need(cfg, "hidden_size"), C.need(cfg, "num_attention_heads"), C.need(cfg, "num_hidden_layers")
    first_dense = C.need(cfg, "first_k_dense_replace")
    return dict(hidden=hidden, heads=heads, layers=layers, kv_heads=C.need(cfg, "num_key_value_heads"),
                head_dim=C.opt(cfg, "head_dim", hidden // heads), vocab=C.need(cfg, "vocab_size"),
                intermediate=C.need(cfg, "intermediate_size"), experts=C.need(cfg, "n_routed_experts"),
                moe_intermediate=C.need(cfg, "moe_intermediate_size"),
                shared=C.opt(cfg, "n_shared_experts", N_SHARED_EXPERTS_DEFAULT),
                sparse=tuple(range(first_dense, layers)),
                bias=bool(C.opt(cfg, "attention_bias", ATTENTION_BIAS_DEFAULT)),
                qk_norm=bool(C.opt(cfg, "use_qk_norm", USE_QK_NORM_DEFAULT)),
                tied=bool(C.opt(cfg, "tie_word_embeddings", False)))


def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
    g = _geometry(cfg)
    H, L, S = g["hidden"], g["layers"], len(g["sparse"])
    return tuple(C.embeddings(g["vocab"], H, g["tied"], tp)
                 + C.attention(L, H, g["heads"], g["kv_heads"], g["head_dim"], tp, qkv_bias=g["bias"],
                               qk_norm="head" if g["qk_norm"] else "")
                 + C.mlp(L - S, H, g["intermediate"], tp)
                 + C.routed_experts(S, g["experts"], H, g["moe_intermediate"], tp, ep)
                 + C.mlp(S, H, g["shared"] * g["moe_intermediate"], tp, prefix="model.layers.*.mlp.shared_experts",
                         component="moe_experts")
                 + C.router(S, g["experts"], H, bias_name="e_score_correction_bias")
                 + C.norms(L, H))


def shape(cfg: dict) -> TextShape:
    g = _geometry(cfg)
    return TextShape(
        model_type="glm4_moe", architectures=tuple(cfg.get("architectures") or ()), num_layers=g["layers"],
        hidden_size=g["hidden"], num_q_heads=g["heads"], num_kv_heads=g["kv_heads"], head_dim=g["head_dim"],
        vocab_size=g["vocab"], intermediate_size=g["intermediate"],
        max_position_embeddings=C.need(cfg, "max_position_embeddings"), tie_word_embeddings=g["tied"],
        dtype=C.checkpoint_dtype(cfg), qkv_bias=g["bias"], qk_norm=g["qk_norm"], num_experts=g["experts"],
        num_experts_per_tok=C.need(cfg, "num_experts_per_tok"), moe_intermediate_size=g["moe_intermediate"],
        num_shared_experts=g["shared"], router_bias=True, sparse_layers=g["sparse"])


ARCHS = (ArchSpec("glm4_moe", "moe", weights, shape, served=False),)
