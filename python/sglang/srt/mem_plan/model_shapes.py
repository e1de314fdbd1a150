"""Exact weight bytes and attention shapes from a Hugging Face config.json dict (no torch, no weights).

Supported: llama / mistral / qwen2 / qwen3 (dense), qwen2_moe / qwen3_moe / mixtral (MoE), deepseek_v2 / v3 (MLA),
and composite VLM configs (text_config + vision_config [siglip / clip] [+ audio_config], llava-style projector;
a Qwen3-Omni "thinker_config" wrapper is unwrapped). Counts follow the checkpoint's tensors: tied embeddings
counted once, q/k norms, biases, MoE experts and router (and DeepSeek's score-correction bias). Not counted:
vocab padding, DeepSeek's MTP layer. Counts are at torch_dtype; quantized linear layers (values, scales, zero
points) are sized by quantization_sizes.py, which build.py applies to the weights term.

Per-rank counts under TP shard heads, intermediate sizes and the vocabulary (ceil division); norms, routers,
latent (MLA down-) projections and encoders are replicated; KV heads are replicated when tp > num_kv_heads.
With --ep-size ep a rank holds E / ep routed experts of moe_intermediate_size / (tp / ep) columns each
(moe_sizes.expert_shard_of_rank); shared experts stay split over all tp ranks.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

from sglang.srt.mem_plan.backends import AttentionShape
from sglang.srt.mem_plan.dtypes import canonical_dtype, dtype_bytes, resolve_kv_cache_dtype
from sglang.srt.mem_plan.encoder_shapes import PREPROCESSOR_KEY, encoder_parts, load_preprocessor_config
from sglang.srt.mem_plan.moe_activations import moe_first_call_bytes, moe_routing_bytes
from sglang.srt.mem_plan.moe_sizes import expert_shard_of_rank
from sglang.srt.mem_plan.kv_quant import is_quantized
from sglang.srt.mem_plan.specs import KVCellSpec, kv_dtype_bytes, kv_heads_per_rank

# Used when config.json has no max_position_embeddings (transformers' LlamaConfig default).
DEFAULT_MAX_POSITION_EMBEDDINGS = 2048

# Declared activation formula (the server measures this term; `sglang plan` uses the formula):
# live tensors of one decoder layer per token, in elements, times a temporaries factor for kernel scratch and
# the allocator's rounding. GPU: upstream-style factor 2 for the caching allocator. CPU: fitted to the peak RSS the
# server measures (SmolLM2-135M Q4_1, bf16, 2048-token chunk: 84-114 MiB over ~40 starts on a 2-core AVX-512 Xeon,
# most of them 93-112, = 2.7-3.7x the live tensors; glibc arenas and oneDNN scratch are the extra), set just above
# the top of that range (3.9 -> 120 MiB), so a start rarely measures more than the formula and the plan, the same on
# every start, is what `sglang plan` predicts; a start that does measure more still reserves what it measured.
# Those starts also counted the K/V the profile wrote into its scratch pool (~47 MB); with those pages resident before
# the peak (model_runner_kv_cache_mixin) the same model measures 62-68 MB, so 3.9 is now generous (left as is: a
# refit moves every dense CPU plan). MoE models add their routing and first-call terms (moe_activations.py).
ACTIVATION_TEMPORARY_FACTOR = 2
ACTIVATION_TEMPORARY_FACTOR_CPU = 3.9
# CPU: what loading adds to the process beyond the tensors, after the heap trim (library code and allocator state
# first touched by the load; measured on SmolLM2-135M: RSS +10.6 MB over the tensors, 3 starts within 0.2 MB; +9.9
# MiB again, and +10.1 MiB on the issue-21 MoE benchmark's Q8_0 GGUF, starts that read the packed-weights cache).
# With the lm_head's table held packed (--quantization gguf, quantization_sizes.gguf_packed_vocab) those starts add
# much less: SmolLM2 (tied table) -2.5 to +1.7 MiB over 5 starts, the MoE file (untied lm_head, the embedding still
# read dense) +0.8 MiB; a first start, which parses and packs the file and writes the cache, adds more: SmolLM2 +13.0
# / +13.4 MiB (+25.6 with the dense table), the MoE file +24.7 MiB. 6 MiB sits between SmolLM2's two kinds of start.
CPU_LOAD_RESIDUAL_BYTES = 10 * 2**20
CPU_PACKED_LOAD_RESIDUAL_BYTES = 6 * 2**20


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def load_config(path: str) -> dict:
    """config.json from a model directory, or a .json file path. A directory's preprocessor_config.json (the image /
    video / audio processor's size caps) rides along under PREPROCESSOR_KEY."""
    directory = path if os.path.isdir(path) else None
    if directory is not None:
        path = os.path.join(path, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    preprocessor = load_preprocessor_config(directory) if directory is not None else None
    if preprocessor is not None:
        cfg[PREPROCESSOR_KEY] = preprocessor
    return cfg


@dataclass(frozen=True)
class TextShape:
    model_type: str
    architectures: tuple[str, ...]
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    dtype: str
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # qwen2_moe: one shared expert of this width (+ a 1-wide gate)
    num_shared_experts: int = 0  # deepseek: shared experts of moe_intermediate_size
    router_bias: bool = False  # deepseek-v3 e_score_correction_bias
    sparse_layers: tuple[int, ...] = ()
    # MLA
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def rotary_dim(self) -> int:
        return self.qk_rope_head_dim if self.is_mla else self.head_dim


def _dtype_of(cfg: dict) -> str:
    """The checkpoint dtype (config.json torch_dtype)."""
    return canonical_dtype(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")


def _num_experts(cfg: dict) -> int:
    """Routed experts of a Qwen MoE config: transformers 5 saves qwen3_moe's num_experts as num_local_experts."""
    return cfg.get("num_experts") or cfg.get("num_local_experts") or 0


def _sparse_layers(cfg: dict, model_type: str, num_layers: int) -> tuple[int, ...]:
    if model_type in ("qwen2_moe", "qwen3_moe"):
        if not _num_experts(cfg):
            return ()
        step = cfg.get("decoder_sparse_step", 1)
        skip = set(cfg.get("mlp_only_layers", []))
        return tuple(i for i in range(num_layers) if i not in skip and (i + 1) % step == 0)
    if model_type == "mixtral":
        return tuple(range(num_layers))
    if model_type.startswith("deepseek"):
        if not cfg.get("n_routed_experts"):
            return ()
        first, freq = cfg.get("first_k_dense_replace", 0), cfg.get("moe_layer_freq", 1)
        return tuple(i for i in range(num_layers) if i >= first and i % freq == 0)
    return ()


# Text models of multimodal configs that are an architecture this module knows under another name.
TEXT_MODEL_TYPE_ALIASES = {
    "qwen2_vl": "qwen2", "qwen2_vl_text": "qwen2", "qwen2_5_vl": "qwen2", "qwen2_5_vl_text": "qwen2",
    "qwen3_vl_text": "qwen3", "qwen3_vl_moe_text": "qwen3_moe", "qwen3_omni_moe_text": "qwen3_moe",
}


def text_shape_from_config(cfg: dict) -> TextShape:
    mt = cfg.get("model_type", "llama")
    mt = TEXT_MODEL_TYPE_ALIASES.get(mt, mt)
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    num_layers = cfg["num_hidden_layers"]
    is_deepseek = mt.startswith("deepseek")
    common = dict(
        model_type=mt,
        architectures=tuple(cfg.get("architectures") or ()),
        num_layers=num_layers,
        hidden_size=hidden,
        num_q_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads,
        vocab_size=cfg["vocab_size"],
        intermediate_size=cfg.get("intermediate_size", 0),
        max_position_embeddings=cfg.get("max_position_embeddings") or DEFAULT_MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        dtype=_dtype_of(cfg),
        sparse_layers=_sparse_layers(cfg, mt, num_layers),
    )
    if is_deepseek:
        return TextShape(
            **common,
            num_experts=cfg.get("n_routed_experts") or 0,
            num_experts_per_tok=cfg.get("num_experts_per_tok") or 0,
            moe_intermediate_size=cfg.get("moe_intermediate_size", 0),
            num_shared_experts=cfg.get("n_shared_experts") or 0,
            router_bias=cfg.get("topk_method") == "noaux_tc",
            kv_lora_rank=cfg["kv_lora_rank"],
            q_lora_rank=cfg.get("q_lora_rank") or 0,
            qk_nope_head_dim=cfg["qk_nope_head_dim"],
            qk_rope_head_dim=cfg["qk_rope_head_dim"],
            v_head_dim=cfg["v_head_dim"],
        )
    bias = bool(cfg.get("attention_bias", False))
    qkv_bias_types = ("qwen2", "qwen2_moe", "qwen2_5_vl_text", "qwen2_vl_text")  # biases on q/k/v only
    moe = {}
    if mt in ("qwen2_moe", "qwen3_moe"):
        moe = dict(num_experts=_num_experts(cfg), num_experts_per_tok=cfg.get("num_experts_per_tok", 0),
                   moe_intermediate_size=cfg.get("moe_intermediate_size", 0),
                   shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size", 0))
    elif mt == "mixtral":
        moe = dict(num_experts=cfg["num_local_experts"], num_experts_per_tok=cfg["num_experts_per_tok"],
                   moe_intermediate_size=cfg["intermediate_size"])
    return TextShape(
        **common,
        qkv_bias=bias or mt in qkv_bias_types,
        o_bias=bias and mt not in qkv_bias_types,
        qk_norm=mt in ("qwen3", "qwen3_moe"),
        **moe,
    )


def text_params(s: TextShape, tp: int = 1, ep: int = 1) -> dict[str, int]:
    """Parameter counts per component on one TP rank (tp=1: the whole model); ep: --ep-size."""
    H = s.hidden_size
    nq = _cdiv(s.num_q_heads, tp)
    attn = 0
    if s.is_mla:
        qk_dim = s.qk_nope_head_dim + s.qk_rope_head_dim
        if s.q_lora_rank:
            attn += H * s.q_lora_rank + s.q_lora_rank + s.q_lora_rank * nq * qk_dim  # q_a, q_a_norm, q_b
        else:
            attn += H * nq * qk_dim
        attn += H * (s.kv_lora_rank + s.qk_rope_head_dim) + s.kv_lora_rank  # kv_a_proj_with_mqa, kv_a_norm
        attn += s.kv_lora_rank * nq * (s.qk_nope_head_dim + s.v_head_dim)  # kv_b_proj
        attn += nq * s.v_head_dim * H  # o_proj
    else:
        d = s.head_dim
        nkv = kv_heads_per_rank(s.num_kv_heads, tp)
        attn += H * nq * d + 2 * H * nkv * d + nq * d * H
        if s.qkv_bias:
            attn += nq * d + 2 * nkv * d
        if s.o_bias:
            attn += H
        if s.qk_norm:
            attn += 2 * d
    dense_mlp = 3 * H * _cdiv(s.intermediate_size, tp)
    expert_mlp = 3 * H * _cdiv(s.moe_intermediate_size, tp)
    num_sparse = len(s.sparse_layers)
    num_dense = s.num_layers - num_sparse
    shared = 0
    if s.shared_expert_intermediate_size:
        shared = 3 * H * _cdiv(s.shared_expert_intermediate_size, tp) + H  # + shared_expert_gate (H -> 1)
    elif s.num_shared_experts:
        shared = s.num_shared_experts * expert_mlp
    router = H * s.num_experts + (s.num_experts if s.router_bias else 0)
    vocab = _cdiv(s.vocab_size, tp) * H
    return {
        "embed_tokens": vocab,
        "lm_head": 0 if s.tie_word_embeddings else vocab,
        "attention": s.num_layers * attn,
        "mlp_dense": num_dense * dense_mlp,
        "moe_experts": num_sparse * (_routed_expert_params(s, tp, ep) + shared),
        "moe_router": num_sparse * router,
        "norms": s.num_layers * 2 * H + H,
    }


def _routed_expert_params(s: TextShape, tp: int, ep: int) -> int:
    """One sparse layer's routed experts on one rank: gate, up and down of each held expert's columns."""
    if ep == 1:  # every expert, its columns split over the tp ranks (ceil, as the rest of the model)
        return s.num_experts * 3 * s.hidden_size * _cdiv(s.moe_intermediate_size, tp)
    experts, columns = expert_shard_of_rank(s.num_experts, s.moe_intermediate_size, tp, ep)
    return experts * 3 * s.hidden_size * columns


@dataclass(frozen=True)
class ModelShape:
    text: TextShape
    vision_params: int = 0
    audio_params: int = 0
    projector_params: int = 0
    encoders: tuple = field(default=())  # encoder towers (encoder_shapes.py), one per tower, named vision / audio
    processor: Optional[object] = None  # encoder_inputs.ProcessorFacts: the processor's size caps

    # ---- weights ----
    def params(self, tp: int = 1, ep: int = 1) -> dict[str, int]:
        p = text_params(self.text, tp, ep)
        if self.vision_params:
            p["vision_tower"] = self.vision_params
        if self.projector_params:
            p["projector"] = self.projector_params
        if self.audio_params:
            p["audio_tower"] = self.audio_params
        return p

    @property
    def num_params(self) -> int:
        return sum(self.params(1).values())

    def weight_bytes(self, tp: int = 1, dtype: Optional[str] = None, ep: int = 1) -> int:
        """Parameters x the weight dtype (default: the checkpoint's) + this runtime's rope tables."""
        elem = dtype_bytes(dtype or self.text.dtype)
        return sum(self.params(tp, ep).values()) * elem + self.rope_cache_bytes(elem)

    def rope_cache_bytes(self, elem_bytes: int) -> int:
        """This runtime's models keep one cos/sin table [max_position_embeddings, rotary_dim], shared by all
        attention layers (layers/rotary_embedding.py get_rope), in the model dtype."""
        s = self.text
        return s.max_position_embeddings * s.rotary_dim * elem_bytes

    # ---- KV and attention ----
    def kv_cell(self, kv_cache_dtype: str = "auto", tp: int = 1, model_dtype: Optional[str] = None) -> KVCellSpec:
        s = self.text
        kvb = kv_dtype_bytes(kv_cache_dtype, model_dtype or s.dtype)
        fmt = resolve_kv_cache_dtype(kv_cache_dtype, model_dtype or s.dtype)
        fmt = fmt if is_quantized(fmt) else ""
        if s.is_mla:
            return KVCellSpec(s.num_layers, kvb, kv_lora_rank=s.kv_lora_rank, qk_rope_head_dim=s.qk_rope_head_dim,
                              tp_size=tp, kv_format=fmt)
        return KVCellSpec(s.num_layers, kvb, s.num_kv_heads, s.head_dim, tp_size=tp, kv_format=fmt)

    def attention_shape(self, context_len: int, tp: int = 1, *, num_kv_splits: Optional[int] = None,
                        model_dtype_bytes: int = 2, kv_dtype_bytes: int = 2) -> AttentionShape:
        s = self.text
        nq = _cdiv(s.num_q_heads, tp)
        common = dict(architectures=s.architectures, num_kv_splits=num_kv_splits, model_dtype_bytes=model_dtype_bytes,
                      kv_dtype_bytes=kv_dtype_bytes)
        if s.is_mla:
            return AttentionShape(nq, s.kv_lora_rank + s.qk_rope_head_dim, context_len, v_head_dim=s.kv_lora_rank,
                                  is_mla=True, num_kv_heads=1, **common)
        return AttentionShape(nq, s.head_dim, context_len, num_kv_heads=kv_heads_per_rank(s.num_kv_heads, tp),
                              **common)

    # ---- declared runtime terms ----
    def activation_bytes(self, num_tokens: int, tp: int = 1, dtype: Optional[str] = None, device: str = "cuda",
                         moe_impl: Optional[str] = None) -> int:
        """Declared formula for the peak activation of a forward over num_tokens tokens on one rank; a MoE model's
        routing and its experts' first-call state with moe_impl (moe_activations.py; build.activation_formula_bytes
        passes the planned implementation)."""
        s = self.text
        H, nq = s.hidden_size, _cdiv(s.num_q_heads, tp)
        if s.is_mla:
            attn = (nq * (s.qk_nope_head_dim + s.qk_rope_head_dim) + s.kv_lora_rank + s.qk_rope_head_dim
                    + nq * (s.qk_nope_head_dim + s.v_head_dim) + nq * s.v_head_dim)
        else:
            nkv = kv_heads_per_rank(s.num_kv_heads, tp)
            attn = (nq + 2 * nkv) * s.head_dim + nq * s.head_dim
        has_dense_mlp = len(s.sparse_layers) < s.num_layers
        mlp = _cdiv(s.intermediate_size, tp) if has_dense_mlp else 0
        router = first_call = 0
        if s.sparse_layers:
            # the routed experts' rows live in the moe_workspace term (moe_sizes.py); what a MoE layer adds here is
            # its shared expert (a dense MLP), the routing temporaries and, once, its libraries' first-call state
            shared = s.shared_expert_intermediate_size or s.num_shared_experts * s.moe_intermediate_size
            mlp = max(mlp, _cdiv(shared, tp))
            router = moe_routing_bytes(num_tokens, s.num_experts, s.num_experts_per_tok)
            first_call = moe_first_call_bytes(moe_impl, device)
        per_token = 3 * H + attn + 3 * mlp  # residual, normed, output + attention + gate/up (2x) and act
        factor = ACTIVATION_TEMPORARY_FACTOR_CPU if device == "cpu" else ACTIVATION_TEMPORARY_FACTOR
        return int((num_tokens * per_token * dtype_bytes(dtype or s.dtype) + router) * factor) + first_call


def model_shape_from_config(cfg: dict) -> ModelShape:
    """config.json (a load_config dict) -> ModelShape: the text model, and the encoder towers of a multimodal model
    (encoder_shapes.py: LLaVA-style text_config + vision_config, Qwen2.5-VL's flat config + vision_config, a
    Qwen3-Omni thinker_config)."""
    preprocessor = cfg.get(PREPROCESSOR_KEY)
    if "thinker_config" in cfg:
        cfg = cfg["thinker_config"]
    if "text_config" in cfg:
        text_cfg = dict(cfg["text_config"])
        text_cfg.setdefault("torch_dtype", cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        text_cfg.setdefault("architectures", cfg.get("architectures"))
        if "tie_word_embeddings" in cfg:
            text_cfg.setdefault("tie_word_embeddings", cfg["tie_word_embeddings"])
    else:
        text_cfg = {k: v for k, v in cfg.items() if k not in ("vision_config", "audio_config")}
    text = text_shape_from_config(text_cfg)
    if not cfg.get("vision_config") and not cfg.get("audio_config"):
        return ModelShape(text)
    parts = encoder_parts(cfg, text.hidden_size, text.dtype_bytes, preprocessor)
    return ModelShape(text, parts.vision_params, parts.audio_params, parts.projector_params, parts.encoders,
                      parts.processor)


def model_shape_from_path(path: str) -> ModelShape:
    return model_shape_from_config(load_config(path))
