"""DeepSeek's multi-head latent attention (MLA) with routed + shared experts: deepseek_v2 (V2, V2-Lite) and
deepseek_v3 (V3, R1, and Kimi-K2, which publishes its config as deepseek_v3).

Attention per layer: q_a_proj [q_lora_rank, H] + q_a_layernorm + q_b_proj [heads x (nope + rope), q_lora_rank]
(q_lora_rank null: one q_proj [heads x (nope + rope), H]); kv_a_proj_with_mqa [kv_lora_rank + rope, H] +
kv_a_layernorm + kv_b_proj [heads x (nope + v), kv_lora_rank]; o_proj [H, heads x v]. The latent (a-) projections and
their norms are replicated under TP, the b-projections and o_proj split by heads. The KV cache holds the latent
(kv_lora_rank + qk_rope_head_dim per token and layer). MLPs: a dense MLP in the first first_k_dense_replace layers,
then every moe_layer_freq-th layer sparse: routed experts, one shared MLP of n_shared_experts x moe_intermediate_size,
the router (V3: + its e_score_correction_bias, float32 in the checkpoint: V3_ROUTER_BIAS). Not counted: the MTP layer
(num_nextn_predict_layers), which this runtime does not load.
"""

from __future__ import annotations

from sglang.srt.mem_plan import arch_common as C
from sglang.srt.mem_plan.arch_spec import ArchSpec, WeightGroup

# transformers' defaults (DeepseekV2Config / DeepseekV3Config) for keys a published config may omit
DEFAULTS = {
    "deepseek_v2": dict(q_lora_rank=1536, first_k_dense_replace=0, n_shared_experts=2, max_position_embeddings=2048),
    "deepseek_v3": dict(q_lora_rank=1536, first_k_dense_replace=3, n_shared_experts=1, max_position_embeddings=4096),
}


# V3's router bias is float32 beside the bf16 weights in the published checkpoints: loaded with dtype "auto",
# DeepSeek-V3.1-Terminus's gate.weight is bf16 and its e_score_correction_bias fp32 (huggingface/transformers#42580);
# vLLM allocates it in fp32 because the checkpoint's tensor is (vllm-project/vllm#23640). transformers
# (DeepseekV3TopkRouter's float32 buffer, _keep_in_fp32_modules_strict) and upstream SGLang hold it in float32 too.
V3_ROUTER_BIAS = dict(router_bias="e_score_correction_bias", router_bias_dtype="float32")


def _geometry(cfg: dict, model_type: str) -> dict:
    d = DEFAULTS[model_type]
    # MLA's KV is the latent, not heads: num_key_value_heads and head_dim are what every MLA term ignores
    g = C.geometry(cfg, kv_heads=None, max_position_embeddings=d["max_position_embeddings"])
    experts = C.need(cfg, "n_routed_experts")
    first, freq = C.opt(cfg, "first_k_dense_replace", d["first_k_dense_replace"]), C.opt(cfg, "moe_layer_freq", 1)
    return dict(
        g, q_lora=cfg.get("q_lora_rank", d["q_lora_rank"]) or 0,  # present and null: no q compression (V2-Lite)
        kv_lora=C.need(cfg, "kv_lora_rank"), nope=C.need(cfg, "qk_nope_head_dim"), rope=C.need(cfg, "qk_rope_head_dim"),
        v=C.need(cfg, "v_head_dim"), experts=experts, moe_intermediate=C.need(cfg, "moe_intermediate_size"),
        shared=C.opt(cfg, "n_shared_experts", d["n_shared_experts"]), bias=bool(cfg.get("attention_bias", False)),
        sparse=tuple(i for i in range(g["layers"]) if i >= first and i % freq == 0) if experts else (),
    )


def mla_attention(g: dict, tp: int) -> list[WeightGroup]:
    H, L, nq = g["hidden"], g["layers"], C.cdiv(g["heads"], tp)
    qk = g["nope"] + g["rope"]
    a = lambda name, shape: WeightGroup("attention", f"model.layers.*.self_attn.{name}", shape, L,  # noqa: E731
                                        linear=name.endswith("proj.weight") or name.endswith("mqa.weight"))
    out = []
    if g["q_lora"]:
        out += [a("q_a_proj.weight", (g["q_lora"], H)), a("q_a_layernorm.weight", (g["q_lora"],)),
                a("q_b_proj.weight", (nq * qk, g["q_lora"]))]
        if g["bias"]:
            out.append(a("q_a_proj.bias", (g["q_lora"],)))
    else:
        out.append(a("q_proj.weight", (nq * qk, H)))
    out += [a("kv_a_proj_with_mqa.weight", (g["kv_lora"] + g["rope"], H)), a("kv_a_layernorm.weight", (g["kv_lora"],)),
            a("kv_b_proj.weight", (nq * (g["nope"] + g["v"]), g["kv_lora"])), a("o_proj.weight", (H, nq * g["v"]))]
    if g["bias"]:
        out += [a("kv_a_proj_with_mqa.bias", (g["kv_lora"] + g["rope"],)), a("o_proj.bias", (H,))]
    return out


def _weights(model_type: str):
    def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
        g = _geometry(cfg, model_type)
        H, L, S = g["hidden"], g["layers"], len(g["sparse"])
        out = (C.embeddings(g["vocab"], H, g["tied"], tp) + mla_attention(g, tp)
               + C.shared_expert_moe(L, S, g["experts"], H, g["intermediate"], g["moe_intermediate"], g["shared"], tp,
                                     ep, **(V3_ROUTER_BIAS if model_type == "deepseek_v3" else {})))
        return tuple(out + C.norms(L, H))
    return weights


def _shape(model_type: str):
    def shape(cfg: dict):
        g = _geometry(cfg, model_type)
        moe = bool(g["sparse"])
        return C.text_shape(
            model_type, cfg, g, rotary_dim=g["rope"], num_experts=g["experts"] if moe else 0,
            num_experts_per_tok=C.need(cfg, "num_experts_per_tok") if moe else 0,
            moe_intermediate_size=g["moe_intermediate"] if moe else 0, num_shared_experts=g["shared"] if moe else 0,
            router_bias=moe and model_type == "deepseek_v3", sparse_layers=g["sparse"], kv_lora_rank=g["kv_lora"],
            q_lora_rank=g["q_lora"], qk_nope_head_dim=g["nope"], qk_rope_head_dim=g["rope"], v_head_dim=g["v"])
    return shape


ARCHS = tuple(ArchSpec(mt, "mla", _weights(mt), _shape(mt), False) for mt in ("deepseek_v2", "deepseek_v3"))
