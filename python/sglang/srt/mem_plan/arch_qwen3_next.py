"""Qwen3-Next (model_type qwen3_next): Gated DeltaNet linear attention on most layers, gated full attention on the
rest, a routed MoE with a gated shared expert. Served by models/qwen3_next.py, its linear layers' state in the planned
linear-state pool (mem_cache/linear_state_pool.py).

Layers: config.json's layer_types ("linear_attention" / "full_attention"), else transformers' rule: layer i is full
attention when (i + 1) % full_attention_interval == 0 (Qwen3-Next-80B-A3B: 36 linear, 12 full of 48).

Tensors per layer (checkpoint names; nk / nv key / value heads of dk / dv, K the conv kernel, H hidden):
    linear_attn  in_proj_qkvz [2 nk dk + 2 nv dv, H], in_proj_ba [2 nv, H], conv1d.weight [2 nk dk + nv dv, 1, K]
                 (no bias), dt_bias [nv], A_log [nv], norm.weight [dv] (gated RMSNorm over one head),
                 out_proj [H, nv dv]
    self_attn    q_proj [2 nq d, H] (query and its output gate), k_proj / v_proj [nkv d, H], o_proj [H, nq d],
                 q_norm / k_norm [d]
    mlp          router gate [E, H], E experts' gate / up [I, H] and down [H, I], shared_expert (gate / up / down of
                 shared_expert_intermediate_size) and shared_expert_gate [1, H]; a layer in mlp_only_layers (or off
                 decoder_sparse_step) has a dense gate / up / down MLP of intermediate_size instead
    norms        input_layernorm, post_attention_layernorm [H]; the final model.norm
The checkpoint's multi-token-prediction layer (mtp.*) is not counted, as DeepSeek's is not: no runtime loads it
without speculative decoding.

TP sharding (upstream SGLang's Qwen3GatedDeltaNet / Qwen3NextAttention): the q, k, v and z blocks of in_proj_qkvz,
the conv channels and b / a / dt_bias / A_log split by heads (ceil); out_proj splits its input columns; the
one-head norm, q_norm / k_norm, the router and shared_expert_gate are replicated; attention and experts as every
other family (arch_common).

Per request, per linear layer (StateTensor), one rank of tp:
    conv state       [channels, K - 1] in the model dtype: the K - 1 inputs before the next token, over the q, k
                     (nk heads x 2 dk, "conv_qk") and v (nv heads x dv, "conv_v") channels, split by heads as the
                     conv weight is. Upstream SGLang (configs/mamba_utils.Mamba2StateShape: (conv_dim / tp, K - 1),
                     dtype SGLANG_MAMBA_CONV_DTYPE, default bfloat16 = this checkpoint's dtype) and vLLM keep K - 1;
                     transformers' cache keeps K columns (it writes the new input before convolving).
    recurrent state  [nv, dk, dv] in float32: upstream SGLang's temporal state (mamba2_state_dtype: config.json's
                     mamba_ssm_dtype if set, else float32; its env override SGLANG_MAMBA_SSM_DTYPE is not read here)
                     and transformers' cache (the chunked delta rule runs and returns it in float32).
"""

from __future__ import annotations

from dataclasses import replace

from sglang.srt.mem_plan import arch_common as C
from sglang.srt.mem_plan.arch_spec import ArchSpec, StateTensor, WeightGroup
from sglang.srt.mem_plan.dtypes import canonical_dtype
from sglang.srt.mem_plan.text_shape import HeadSplitWidth

# transformers 5.24 Qwen3NextConfig's defaults, used only when config.json omits the key.
DEFAULTS = dict(num_key_value_heads=2, head_dim=256, intermediate_size=5632, max_position_embeddings=32768,
                tie_word_embeddings=False, attention_bias=False, linear_conv_kernel_dim=4, linear_key_head_dim=128,
                linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
                decoder_sparse_step=1, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                num_experts_per_tok=10, num_experts=512, full_attention_interval=4)
# Upstream SGLang's default dtype of the recurrent (temporal) state when config.json has no mamba_ssm_dtype.
DEFAULT_SSM_STATE_DTYPE = "float32"
PARTIAL_ROTARY_FACTOR_DEFAULT = 0.25  # Qwen3NextConfig: rotary on the first quarter of each full-attention head

LINEAR = "model.layers.*.linear_attn"


def _get(cfg: dict, key: str):
    return C.opt(cfg, key, DEFAULTS[key])


def layer_kinds(cfg: dict) -> tuple[str, ...]:
    n = C.need(cfg, "num_hidden_layers")
    if cfg.get("layer_types") is not None:
        return C.layer_kinds_from_types(cfg, n)
    interval = _get(cfg, "full_attention_interval")
    return tuple("full" if (i + 1) % interval == 0 else "linear" for i in range(n))


def sparse_layers(cfg: dict) -> tuple[int, ...]:
    """Layers whose MLP is the routed MoE (transformers' Qwen3NextDecoderLayer rule)."""
    n, experts, step = C.need(cfg, "num_hidden_layers"), _get(cfg, "num_experts"), _get(cfg, "decoder_sparse_step")
    dense = set(cfg.get("mlp_only_layers") or ())
    return tuple(i for i in range(n) if experts > 0 and i not in dense and (i + 1) % step == 0)


def _linear_heads(cfg: dict) -> tuple[int, int, int, int, int]:
    nk, nv = _get(cfg, "linear_num_key_heads"), _get(cfg, "linear_num_value_heads")
    if nv % nk:
        raise ValueError(f"config.json (qwen3_next): linear_num_value_heads {nv} is not a multiple of "
                         f"linear_num_key_heads {nk}; the Gated DeltaNet groups value heads per key head")
    dk, dv = _get(cfg, "linear_key_head_dim"), _get(cfg, "linear_value_head_dim")
    return nk, nv, dk, dv, _get(cfg, "linear_conv_kernel_dim")


def _gated_delta_net(count: int, hidden: int, cfg: dict, tp: int) -> list[WeightGroup]:
    nk, nv, dk, dv, k = _linear_heads(cfg)
    nk_r, nv_r = C.cdiv(nk, tp), C.cdiv(nv, tp)
    g = lambda name, shape, **kw: WeightGroup("linear_attention", f"{LINEAR}.{name}", shape, count, **kw)  # noqa
    return [g("in_proj_qkvz.weight", (2 * nk_r * dk + 2 * nv_r * dv, hidden), linear=True),
            g("in_proj_ba.weight", (2 * nv_r, hidden), linear=True),
            g("conv1d.weight", (2 * nk_r * dk + nv_r * dv, 1, k)),
            g("dt_bias", (nv_r,)), g("A_log", (nv_r,)), g("norm.weight", (dv,)),
            g("out_proj.weight", (hidden, nv_r * dv), linear=True)]


def _gated_attention(count: int, hidden: int, cfg: dict, tp: int) -> list[WeightGroup]:
    """Full attention whose q_proj also yields a per-head output gate: q_proj is twice the query width."""
    groups = C.attention(count, hidden, C.need(cfg, "num_attention_heads"), _get(cfg, "num_key_value_heads"),
                         _get(cfg, "head_dim"), tp, qkv_bias=bool(_get(cfg, "attention_bias")),
                         o_bias=bool(_get(cfg, "attention_bias")), qk_norm="head")
    doubled = ("q_proj.weight", "q_proj.bias")
    return [replace(w, shape=(2 * w.shape[0],) + w.shape[1:]) if w.module.endswith(doubled) else w for w in groups]


def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
    H, n = C.need(cfg, "hidden_size"), C.need(cfg, "num_hidden_layers")
    kinds, sparse = layer_kinds(cfg), sparse_layers(cfg)
    n_linear, n_full = kinds.count("linear"), kinds.count("full")
    if n_linear + n_full != n:
        raise ValueError(f"config.json (qwen3_next): layer_types other than linear_attention / full_attention: "
                         f"{sorted(set(kinds) - {'linear', 'full'})}")
    E, shared = _get(cfg, "num_experts"), _get(cfg, "shared_expert_intermediate_size")
    out = C.embeddings(C.need(cfg, "vocab_size"), H, bool(_get(cfg, "tie_word_embeddings")), tp)
    out += _gated_delta_net(n_linear, H, cfg, tp) + _gated_attention(n_full, H, cfg, tp)
    out += C.mlp(n - len(sparse), H, _get(cfg, "intermediate_size"), tp)
    out += C.router(len(sparse), E, H)
    out += C.routed_experts(len(sparse), E, H, _get(cfg, "moe_intermediate_size"), tp, ep)
    out += C.mlp(len(sparse), H, shared, tp, prefix="model.layers.*.mlp.shared_expert", component="moe_experts")
    if shared:
        out.append(WeightGroup("moe_experts", "model.layers.*.mlp.shared_expert_gate.weight", (1, H), len(sparse)))
    out += C.norms(n, H)
    return tuple(out)


def state_tensors(cfg: dict) -> tuple[StateTensor, ...]:
    nk, nv, dk, dv, k = _linear_heads(cfg)
    conv = C.checkpoint_dtype(cfg)
    ssm = canonical_dtype(cfg.get("mamba_ssm_dtype") or DEFAULT_SSM_STATE_DTYPE)
    return (StateTensor("conv_qk", nk, 2 * dk * (k - 1), conv), StateTensor("conv_v", nv, dv * (k - 1), conv),
            StateTensor("recurrent", nv, dk * dv, ssm))


def linear_widths(cfg: dict) -> tuple[HeadSplitWidth, ...]:
    """A Gated DeltaNet layer's projections per token: per key head q and k (2 dk) of in_proj_qkvz; per value head
    v and z (2 dv) of in_proj_qkvz, b and a (2) of in_proj_ba and the dv the core hands out_proj."""
    nk, nv, dk, dv, _ = _linear_heads(cfg)
    return HeadSplitWidth(nk, 2 * dk), HeadSplitWidth(nv, 2 * dv + 2 + dv)


def shape(cfg: dict):
    sparse = sparse_layers(cfg)
    d = DEFAULTS
    g = C.geometry(cfg, kv_heads=d["num_key_value_heads"], head_dim=d["head_dim"],
                   intermediate=d["intermediate_size"], max_position_embeddings=d["max_position_embeddings"],
                   tied=d["tie_word_embeddings"])
    return C.text_shape(
        "qwen3_next", cfg, g, rotary_dim=C.rotary_dim(cfg, g["head_dim"], PARTIAL_ROTARY_FACTOR_DEFAULT),
        qkv_bias=bool(_get(cfg, "attention_bias")), o_bias=bool(_get(cfg, "attention_bias")), qk_norm=True,
        num_experts=_get(cfg, "num_experts") if sparse else 0,
        num_experts_per_tok=_get(cfg, "num_experts_per_tok") if sparse else 0,
        moe_intermediate_size=_get(cfg, "moe_intermediate_size") if sparse else 0,
        shared_expert_intermediate_size=_get(cfg, "shared_expert_intermediate_size") if sparse else 0,
        sparse_layers=sparse, layer_kinds=layer_kinds(cfg), state_tensors=state_tensors(cfg),
        linear_widths=linear_widths(cfg))


ARCHS = (ArchSpec("qwen3_next", "linear-attention", weights, shape, served=True),)
