"""A model as the memory plan sees it (ModelShape), from a Hugging Face config.json dict (no torch, no weights).

The text model is its architecture's declaration (arch_registry.py -> arch_<family>.py): every parameter tensor one
rank holds as WeightGroups (weight_groups), whose sums per component are params(); its geometry (text_shape.TextShape:
layer kinds, KV per token, experts, MLA). A model_type the registry does not declare is refused, never priced as
another. Composite VLM configs (text_config + vision_config [siglip / clip] [+ audio_config], llava-style projector;
a Qwen3-Omni "thinker_config" wrapper) add their encoder towers (encoder_shapes.py), replicated on every rank.
Counts are at torch_dtype; quantized linear layers (values, scales, zero points) are sized by quantization_sizes.py,
which build.py applies to the weights term. Not counted: vocab padding, DeepSeek's MTP layer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

from sglang.srt.mem_plan.arch_registry import arch_spec
from sglang.srt.mem_plan.arch_spec import COMPONENTS, ArchSpec, WeightGroup
from sglang.srt.mem_plan.backends import AttentionShape
from sglang.srt.mem_plan.dtypes import dtype_bytes, resolve_kv_cache_dtype
from sglang.srt.mem_plan.encoder_shapes import PREPROCESSOR_KEY, encoder_parts, load_preprocessor_config
from sglang.srt.mem_plan.moe_activations import moe_first_call_bytes, moe_routing_bytes
from sglang.srt.mem_plan.kv_quant import is_quantized
from sglang.srt.mem_plan.specs import KVCellSpec, kv_dtype_bytes, kv_heads_per_rank
from sglang.srt.mem_plan.text_shape import TextShape  # noqa: F401 (re-exported: the family modules build it)

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


def text_arch(cfg: dict) -> ArchSpec:
    """The ArchSpec of a text config (arch_registry: ValueError for a model_type the planner does not know)."""
    return arch_spec(cfg.get("model_type"))


def text_shape_from_config(cfg: dict) -> TextShape:
    """The text model's geometry, from its architecture's declaration (ValueError: unknown model_type, or a key the
    architecture needs missing from config.json)."""
    return text_arch(cfg).shape(cfg)


@dataclass(frozen=True)
class ModelShape:
    text: TextShape
    text_config: dict = field(default_factory=dict, compare=False, repr=False)  # the text model's config.json
    vision_params: int = 0
    audio_params: int = 0
    projector_params: int = 0
    encoders: tuple = field(default=())  # encoder towers (encoder_shapes.py), one per tower, named vision / audio
    processor: Optional[object] = None  # encoder_inputs.ProcessorFacts: the processor's size caps

    # ---- weights ----
    @property
    def arch(self) -> ArchSpec:
        return arch_spec(self.text.model_type)

    def weight_groups(self, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
        """Every parameter tensor of the text model one rank holds (the architecture's declaration)."""
        return self.arch.weights(self.text_config, tp, ep)

    def params(self, tp: int = 1, ep: int = 1) -> dict[str, int]:
        """Parameter counts per component on one rank (tp=1: the whole model); ep: --ep-size. The text model's
        components are sums over weight_groups (the seven classic ones always present, others where non-zero);
        encoder towers and projectors are replicated."""
        p = {c: 0 for c in COMPONENTS[:7]}
        for g in self.weight_groups(tp, ep):
            if g.numel:
                p[g.component] = p.get(g.component, 0) + g.numel
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
        return self.dense_weight_bytes(tp, dtype_bytes(dtype or self.text.dtype), ep)

    def dense_weight_bytes(self, tp: int, elem_bytes: int, ep: int = 1) -> int:
        """Every parameter one rank holds at elem_bytes, except a WeightGroup that declares the dtype its checkpoint
        stores (arch_spec.WeightGroup.dtype: a float32 router bias), at that dtype's bytes; + the rope tables."""
        own = sum(g.numel * (dtype_bytes(g.dtype) - elem_bytes) for g in self.weight_groups(tp, ep) if g.dtype)
        return sum(self.params(tp, ep).values()) * elem_bytes + own + self.rope_cache_bytes(elem_bytes)

    def rope_cache_bytes(self, elem_bytes: int) -> int:
        """This runtime's models keep one cos/sin table [max_position_embeddings, rotary_dim] per distinct RoPE,
        shared by the attention layers that use it (layers/rotary_embedding.py get_rope), in the model dtype; the
        rotary width is the architecture's (text_shape.TextShape.rotary_dim: partial rotary, MLA, none)."""
        s = self.text
        return s.rope_tables * s.max_position_embeddings * s.rotary_dim * elem_bytes

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
        # FlashInfer plans windowed layers with a second wrapper over their own page table (flashinfer_backend.py);
        # a window as long as the context masks nothing and is attended as a full layer
        bounds = {"sliding": s.sliding_window, "chunked": s.attention_chunk_size}
        windowed = any(0 < bounds.get(k, 0) < context_len for k in s.layer_kinds)
        return AttentionShape(nq, s.head_dim, context_len, num_kv_heads=kv_heads_per_rank(s.num_kv_heads, tp),
                              num_wrappers=2 if windowed else 1, **common)

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
        attn = max(attn, s.linear_width(tp))  # a linear-attention / SSM layer's projections, when wider
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
    text_cfg = dict(text_cfg, model_type=text.model_type)  # an alias (qwen2_5_vl) read as the architecture it is
    text_arch(text_cfg).weights(text_cfg, 1, 1)  # a key only the weights read is refused here too, not mid-plan
    if not cfg.get("vision_config") and not cfg.get("audio_config"):
        return ModelShape(text, text_cfg)
    parts = encoder_parts(cfg, text.hidden_size, text.dtype_bytes, preprocessor)
    return ModelShape(text, text_cfg, parts.vision_params, parts.audio_params, parts.projector_params,
                      parts.encoders, parts.processor)


def model_shape_from_path(path: str) -> ModelShape:
    return model_shape_from_config(load_config(path))
