"""Mixture-of-experts decoders of the Llama layout: attention as their dense siblings, routed experts (+ a shared
expert) in the sparse layers, a dense MLP in the others.

    qwen2_moe   q/k/v biases (qkv_bias, default true); sparse layers by decoder_sparse_step / mlp_only_layers; one
                shared expert of shared_expert_intermediate_size and its 1-wide sigmoid gate              served
    qwen3_moe   head_dim-wide q_norm / k_norm; attention_bias on q/k/v/o; no shared expert; with
                use_sliding_window every layer slides                                                       served
    mixtral     block_sparse_moe: experts w1 (gate) / w3 (up) / w2 (down), every layer sparse; a sliding_window set
                applies to every layer                                                                      served
Transformers 5 names qwen3_moe's num_experts num_local_experts when it saves a config: both are read.
"""

from __future__ import annotations

from sglang.srt.mem_plan import arch_common as C
from sglang.srt.mem_plan.arch_llama import window_on_every_layer
from sglang.srt.mem_plan.arch_spec import ArchSpec, WeightGroup

# transformers' defaults (Qwen2MoeConfig, Qwen3MoeConfig, MixtralConfig) for keys a published config may omit
DEFAULTS = {
    "qwen2_moe": dict(num_key_value_heads=16, max_position_embeddings=32768, num_experts=60,
                      shared_expert_intermediate_size=5632),
    "qwen3_moe": dict(num_key_value_heads=4, max_position_embeddings=32768, num_experts=128,
                      shared_expert_intermediate_size=0),
    "mixtral": dict(num_key_value_heads=8, max_position_embeddings=4096 * 32, shared_expert_intermediate_size=0),
}


def num_experts(cfg: dict, model_type: str) -> int:
    if model_type == "mixtral":
        return C.need(cfg, "num_local_experts")
    return cfg.get("num_experts") or cfg.get("num_local_experts") or DEFAULTS[model_type]["num_experts"]


def sparse_layers(cfg: dict, model_type: str, num_layers: int) -> tuple[int, ...]:
    if model_type == "mixtral":
        return tuple(range(num_layers))
    step, skip = C.opt(cfg, "decoder_sparse_step", 1), set(C.opt(cfg, "mlp_only_layers", []))
    return tuple(i for i in range(num_layers) if i not in skip and (i + 1) % step == 0)


def qwen2_moe_kinds(cfg: dict, n: int):
    """Qwen2MoeConfig: with use_sliding_window, layer_types, else odd-numbered (i + 1 odd) layers below
    max_window_layers slide."""
    if not cfg.get("use_sliding_window", False):
        return ("full",) * n, 0
    window = C.opt(cfg, "sliding_window", 4096)
    if cfg.get("layer_types") is not None:
        return C.layer_kinds_from_types(cfg, n), window
    first = C.opt(cfg, "max_window_layers", 28)
    return tuple("sliding" if (i + 1) % 2 and i < first else "full" for i in range(n)), window


def qwen3_moe_kinds(cfg: dict, n: int):
    """Qwen3MoeConfig has no layer_types or max_window_layers: with use_sliding_window every layer's attention takes
    config.sliding_window (Qwen3MoeAttention)."""
    if not cfg.get("use_sliding_window", False):
        return ("full",) * n, 0
    window = cfg.get("sliding_window", 4096)
    return (("sliding",) * n, window) if window else (("full",) * n, 0)


def _geometry(cfg: dict, model_type: str) -> dict:
    d = DEFAULTS[model_type]
    mixtral = model_type == "mixtral"
    g = C.geometry(cfg, kv_heads=d["num_key_value_heads"], max_position_embeddings=d["max_position_embeddings"])
    return dict(
        g,
        experts=num_experts(cfg, model_type),
        sparse=sparse_layers(cfg, model_type, g["layers"]) if num_experts(cfg, model_type) else (),
        moe_intermediate=C.need(cfg, "intermediate_size" if mixtral else "moe_intermediate_size"),
        shared=C.opt(cfg, "shared_expert_intermediate_size", d["shared_expert_intermediate_size"]),
        qkv_bias=(bool(C.opt(cfg, "qkv_bias", True)) if model_type == "qwen2_moe"
                  else bool(cfg.get("attention_bias", False))),
        o_bias=model_type == "qwen3_moe" and bool(cfg.get("attention_bias", False)),
    )


def _weights(model_type: str):
    mixtral = model_type == "mixtral"
    block = "model.layers.*.block_sparse_moe" if mixtral else "model.layers.*.mlp"
    expert_names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")

    def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
        g = _geometry(cfg, model_type)
        H, L, S = g["hidden"], g["layers"], len(g["sparse"])
        out = (C.embeddings(g["vocab"], H, g["tied"], tp)
               + C.attention(L, H, g["heads"], g["kv_heads"], g["head_dim"], tp, qkv_bias=g["qkv_bias"],
                             o_bias=g["o_bias"], qk_norm="head" if model_type == "qwen3_moe" else "")
               + C.mlp(L - S, H, g["intermediate"], tp)
               + C.routed_experts(S, g["experts"], H, g["moe_intermediate"], tp, ep, prefix=f"{block}.experts.*",
                                  names=expert_names)
               + C.router(S, g["experts"], H, module=f"{block}.gate"))
        if model_type == "qwen2_moe" and g["shared"] and S:
            out += C.mlp(S, H, g["shared"], tp, prefix=f"{block}.shared_expert", component="moe_experts")
            out.append(WeightGroup("moe_experts", f"{block}.shared_expert_gate.weight", (1, H), S))
        return tuple(out + C.norms(L, H))
    return weights


def _shape(model_type: str):
    kinds_of = {"qwen2_moe": qwen2_moe_kinds, "qwen3_moe": qwen3_moe_kinds, "mixtral": window_on_every_layer(None)}

    def shape(cfg: dict):
        g = _geometry(cfg, model_type)
        kinds, window = kinds_of[model_type](cfg, g["layers"])
        moe = bool(g["sparse"] and g["experts"])
        return C.text_shape(
            model_type, cfg, g, rotary_dim=C.rotary_dim(cfg, g["head_dim"]), qkv_bias=g["qkv_bias"], o_bias=g["o_bias"],
            qk_norm=model_type == "qwen3_moe", num_experts=g["experts"] if moe else 0,
            num_experts_per_tok=C.need(cfg, "num_experts_per_tok") if moe else 0,
            moe_intermediate_size=g["moe_intermediate"] if moe else 0,
            shared_expert_intermediate_size=g["shared"] if model_type == "qwen2_moe" and moe else 0,
            sparse_layers=g["sparse"] if moe else (), layer_kinds=C.uniform_kinds(kinds),
            sliding_window=window if "sliding" in kinds else 0)
    return shape


ARCHS = tuple(ArchSpec(mt, "moe", _weights(mt), _shape(mt), True) for mt in ("qwen2_moe", "qwen3_moe", "mixtral"))
