"""The weights of the draft heads speculative decoding loads beside the target (spec_terms.py): EAGLE-1 and EAGLE-3
heads (a Llama-layout config.json of one decoder layer) and DeepSeek's MTP layers (NEXTN: the target checkpoint's
num_nextn_predict_layers layers, which the target's own loader skips: models/deepseek_v2.py, arch_deepseek.py).
Each is declared as WeightGroups under the checkpoint's tensor names, one TP rank's share, like arch_<family>.py.

EAGLE-3 head (LlamaForCausalLMEagle3 configs, e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B):
    fc [H, 3 x H_target] (the target's three auxiliary hidden states -> H; replicated), one decoder layer
    `midlayer` whose q/k/v read 2 x H (the token embedding and the fc output, concatenated), o_proj [H, heads x d],
    a gated MLP, hidden_norm + input_layernorm + post_attention_layernorm, the final norm, and its own lm_head
    [draft_vocab_size, H] (vocab-parallel); plus the vocabulary maps d2t (int64 [draft_vocab_size]: draft id ->
    target id offset) and t2d (bool [vocab_size]). The token embedding is the target's (shared, not counted).
EAGLE-1 head (EAGLE-LLaMA3-Instruct-8B style configs): fc [H, 2 H] with its bias, num_hidden_layers Llama decoder
    layers (the first without input_layernorm), no final norm; embedding and lm_head shared with the target.
NEXTN (DeepSeek-V2/V3 MTP): per MTP layer eh_proj [H, 2 H] (replicated), enorm, hnorm, one decoder layer as the
    target's sparse layers (MLA attention, routed + shared experts, router, two norms) and shared_head.norm; the
    shared head's lm_head and the embedding are the target's (shared, not counted).
"""

from __future__ import annotations

import dataclasses

from sglang.srt.mem_plan import arch_common as C
from sglang.srt.mem_plan.arch_registry import arch_spec
from sglang.srt.mem_plan.arch_spec import WeightGroup
from sglang.srt.mem_plan.dtypes import dtype_bytes

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3",)
EAGLE_HEAD_MODEL_TYPES = ("llama",)
NEXTN_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
D2T_ELEM_BYTES = 8  # int64
T2D_ELEM_BYTES = 1  # bool
LLAMA_MAX_POSITIONS = 2048  # LlamaConfig's default


def _head_geometry(cfg: dict, algorithm: str) -> dict:
    if cfg.get("model_type") not in EAGLE_HEAD_MODEL_TYPES:
        raise ValueError(f"--speculative-draft-model-path: an {algorithm} head's config.json has model_type "
                         f"{cfg.get('model_type')!r}; the planner knows heads of model_type "
                         f"{', '.join(EAGLE_HEAD_MODEL_TYPES)} (a Llama-layout decoder layer).")
    return C.geometry(cfg, kv_heads=None, max_position_embeddings=LLAMA_MAX_POSITIONS)


def _qkv(prefix: str, layers: int, in_features: int, hidden: int, g: dict, tp: int) -> list[WeightGroup]:
    """q/k/v reading in_features, o_proj back to hidden (EAGLE-3's layer reads 2 H)."""
    nq, nkv, d = C.cdiv(g["heads"], tp), max(1, g["kv_heads"] // tp), g["head_dim"]
    w = lambda name, shape: WeightGroup("attention", f"{prefix}.{name}.weight", shape, layers, linear=True)  # noqa
    return [w("q_proj", (nq * d, in_features)), w("k_proj", (nkv * d, in_features)),
            w("v_proj", (nkv * d, in_features)), w("o_proj", (hidden, nq * d))]


def eagle3_vocab(cfg: dict) -> tuple[int, int]:
    """(draft_vocab_size, vocab_size) of an EAGLE-3 head; draft_vocab_size absent: the whole vocabulary."""
    vocab = C.need(cfg, "vocab_size")
    return cfg.get("draft_vocab_size") or vocab, vocab


def eagle3_head_weights(cfg: dict, target_hidden: int, tp: int = 1) -> tuple[WeightGroup, ...]:
    g = _head_geometry(cfg, "EAGLE3")
    if g["layers"] != 1:
        raise ValueError(f"--speculative-draft-model-path: an EAGLE3 head has one decoder layer (midlayer); its "
                         f"config.json says num_hidden_layers {g['layers']}.")
    H = g["hidden"]
    draft_vocab, _ = eagle3_vocab(cfg)
    norm = lambda name: WeightGroup("norms", name, (H,))  # noqa: E731
    return tuple([WeightGroup("attention", "fc.weight", (H, 3 * cfg.get("target_hidden_size", target_hidden)),
                              linear=True)]
                 + _qkv("midlayer.self_attn", 1, 2 * H, H, g, tp)
                 + C.mlp(1, H, g["intermediate"], tp, prefix="midlayer.mlp")
                 + [norm("midlayer.hidden_norm.weight"), norm("midlayer.input_layernorm.weight"),
                    norm("midlayer.post_attention_layernorm.weight"), norm("norm.weight"),
                    WeightGroup("lm_head", "lm_head.weight", (C.cdiv(draft_vocab, tp), H))])


def eagle3_map_bytes(cfg: dict) -> int:
    """d2t (int64 per draft token) and t2d (bool per target token), replicated."""
    draft_vocab, vocab = eagle3_vocab(cfg)
    return draft_vocab * D2T_ELEM_BYTES + vocab * T2D_ELEM_BYTES


def eagle_head_weights(cfg: dict, tp: int = 1) -> tuple[WeightGroup, ...]:
    g = _head_geometry(cfg, "EAGLE")
    H, L = g["hidden"], g["layers"]
    return tuple([WeightGroup("attention", "fc.weight", (H, 2 * H), linear=True),
                  WeightGroup("attention", "fc.bias", (H,))]
                 + _qkv("layers.*.self_attn", L, H, H, g, tp)
                 + C.mlp(L, H, g["intermediate"], tp, prefix="layers.*.mlp")
                 + [WeightGroup("norms", "layers.*.post_attention_layernorm.weight", (H,), L),
                    WeightGroup("norms", "layers.*.input_layernorm.weight", (H,), L - 1)])


def nextn_layers(cfg: dict) -> int:
    """The target checkpoint's MTP layers; ValueError naming what is missing."""
    if cfg.get("model_type") not in NEXTN_MODEL_TYPES:
        raise ValueError(f"--speculative-algorithm NEXTN: model_type {cfg.get('model_type')!r} has no MTP layers the "
                         f"planner knows; NEXTN plans {', '.join(NEXTN_MODEL_TYPES)} checkpoints.")
    n = cfg.get("num_nextn_predict_layers") or 0
    if n < 1:
        raise ValueError("--speculative-algorithm NEXTN: config.json has no num_nextn_predict_layers (>= 1): this "
                         "checkpoint ships no MTP layer to propose with.")
    return n


def nextn_weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
    n = nextn_layers(cfg)
    H = C.need(cfg, "hidden_size")
    one = arch_spec(cfg["model_type"]).weights(dict(cfg, num_hidden_layers=1, first_k_dense_replace=0), tp, ep)
    layer = [dataclasses.replace(w, count=w.count * n) for w in one
             if w.component not in ("embed_tokens", "lm_head") and w.module != "model.norm.weight"]
    norm = lambda name: WeightGroup("norms", f"model.layers.*.{name}.weight", (H,), n)  # noqa: E731
    return tuple(layer + [WeightGroup("attention", "model.layers.*.eh_proj.weight", (H, 2 * H), n, linear=True),
                          norm("enorm"), norm("hnorm"), norm("shared_head.norm")])


def groups_bytes(groups, elem_bytes: int) -> int:
    """Bytes of WeightGroups at elem_bytes, a group that declares its checkpoint dtype at that dtype's."""
    return sum(g.numel * (dtype_bytes(g.dtype) if g.dtype else elem_bytes) for g in groups)
