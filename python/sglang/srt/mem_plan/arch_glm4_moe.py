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

# transformers' Glm4MoeConfig defaults (5.x), for keys a config leaves out
ATTENTION_BIAS_DEFAULT = False
USE_QK_NORM_DEFAULT = False
N_SHARED_EXPERTS_DEFAULT = 1
# The router's e_score_correction_bias is float32 beside the bf16 weights: transformers creates it so
# (Glm4MoeTopkRouter's float32 buffer, _keep_in_fp32_modules_strict), and upstream SGLang and vLLM allocate it in
# float32 to load the checkpoint's values unrounded (sgl-project/sglang#8729, vllm-project/vllm#22143).
PARTIAL_ROTARY_FACTOR_DEFAULT = 0.5  # rotary on the first half of each head (Glm4MoeRotaryEmbedding)


def _geometry(cfg: dict) -> dict:
    g = C.geometry(cfg)
    return dict(g, experts=C.need(cfg, "n_routed_experts"), moe_intermediate=C.need(cfg, "moe_intermediate_size"),
                shared=C.opt(cfg, "n_shared_experts", N_SHARED_EXPERTS_DEFAULT),
                sparse=tuple(range(C.need(cfg, "first_k_dense_replace"), g["layers"])),
                bias=bool(C.opt(cfg, "attention_bias", ATTENTION_BIAS_DEFAULT)),
                qk_norm=bool(C.opt(cfg, "use_qk_norm", USE_QK_NORM_DEFAULT)))


def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
    g = _geometry(cfg)
    H, L, S = g["hidden"], g["layers"], len(g["sparse"])
    return tuple(C.embeddings(g["vocab"], H, g["tied"], tp)
                 + C.attention(L, H, g["heads"], g["kv_heads"], g["head_dim"], tp, qkv_bias=g["bias"],
                               qk_norm="head" if g["qk_norm"] else "")
                 + C.shared_expert_moe(L, S, g["experts"], H, g["intermediate"], g["moe_intermediate"], g["shared"],
                                       tp, ep, router_bias="e_score_correction_bias", router_bias_dtype="float32")
                 + C.norms(L, H))


def shape(cfg: dict):
    g = _geometry(cfg)
    return C.text_shape(
        "glm4_moe", cfg, g, rotary_dim=C.rotary_dim(cfg, g["head_dim"], PARTIAL_ROTARY_FACTOR_DEFAULT),
        qkv_bias=g["bias"], qk_norm=g["qk_norm"], num_experts=g["experts"],
        num_experts_per_tok=C.need(cfg, "num_experts_per_tok"), moe_intermediate_size=g["moe_intermediate"],
        num_shared_experts=g["shared"], router_bias=True, sparse_layers=g["sparse"])


ARCHS = (ArchSpec("glm4_moe", "moe", weights, shape, served=False),)
