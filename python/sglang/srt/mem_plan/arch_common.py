"""Building blocks of the family modules (arch_<family>.py): reading config.json keys with a refusal for the ones an
architecture needs, and the WeightGroups of the parts decoder layers share (embeddings, attention, MLPs, experts,
norms), per TP rank.

Sharding rules (one rank of tp; tp = 1 is the whole model): attention heads, intermediate sizes and the vocabulary
are split with ceil division; KV heads are split, or replicated when tp > KV heads (specs.kv_heads_per_rank);
row-parallel biases, norms, routers and latent (MLA down-) projections are replicated; with ep > 1 a rank holds
E / ep routed experts of moe_intermediate_size / (tp / ep) columns (moe_sizes.expert_shard_of_rank).
"""

from __future__ import annotations

from typing import Any, Optional

from sglang.srt.mem_plan.arch_spec import WeightGroup
from sglang.srt.mem_plan.dtypes import canonical_dtype
from sglang.srt.mem_plan.moe_sizes import expert_shard_of_rank
from sglang.srt.mem_plan.rounding import cdiv  # noqa: F401 (the family modules' C.cdiv)
from sglang.srt.mem_plan.specs import kv_heads_per_rank
from sglang.srt.mem_plan.text_shape import TextShape

_MISSING = object()
REQUIRED = object()  # geometry(): the key has no transformers default for this architecture


def need(cfg: dict, key: str) -> Any:
    """A config.json key the architecture cannot be sized without: ValueError naming it when absent or null."""
    value = cfg.get(key)
    if value is None:
        raise ValueError(f"config.json (model_type {cfg.get('model_type')!r}) lacks {key!r}, which the planner needs "
                         f"to size this architecture; add the value the model's published config.json has.")
    return value


def opt(cfg: dict, key: str, default: Any) -> Any:
    """A key with a transformers default (the config class's own, named beside each call): absent or null -> it."""
    value = cfg.get(key, _MISSING)
    return default if value is _MISSING or value is None else value


def checkpoint_dtype(cfg: dict) -> str:
    """The checkpoint dtype (config.json torch_dtype; transformers 5 writes dtype); bfloat16 when neither is given."""
    return canonical_dtype(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")


def geometry(cfg: dict, *, kv_heads=REQUIRED, head_dim=None, vocab=REQUIRED, intermediate=REQUIRED,
             max_position_embeddings=REQUIRED, tied: bool = False) -> dict:
    """The geometry every decoder shares, read from config.json once: hidden, heads and layers (required) and, for
    the keys below, the architecture's transformers default when the key is absent or null (REQUIRED: refused when
    absent). kv_heads None: = num_attention_heads; head_dim None: hidden_size // num_attention_heads."""
    hidden, heads = need(cfg, "hidden_size"), need(cfg, "num_attention_heads")

    def read(key: str, default):
        return need(cfg, key) if default is REQUIRED else opt(cfg, key, default)

    return dict(hidden=hidden, heads=heads, layers=need(cfg, "num_hidden_layers"),
                kv_heads=read("num_key_value_heads", heads if kv_heads is None else kv_heads),
                head_dim=read("head_dim", hidden // heads if head_dim is None else head_dim),
                vocab=read("vocab_size", vocab), intermediate=read("intermediate_size", intermediate),
                max_positions=read("max_position_embeddings", max_position_embeddings),
                tied=bool(opt(cfg, "tie_word_embeddings", tied)))


def text_shape(model_type: str, cfg: dict, g: dict, *, rotary_dim: int, **own) -> TextShape:
    """The TextShape of a geometry() dict (the fields every family shares), the architecture's rotary width and its
    own fields (layer kinds, experts, MLA, state)."""
    return TextShape(model_type=model_type, architectures=tuple(cfg.get("architectures") or ()),
                     num_layers=g["layers"], hidden_size=g["hidden"], num_q_heads=g["heads"],
                     num_kv_heads=g["kv_heads"], head_dim=g["head_dim"], vocab_size=g["vocab"],
                     intermediate_size=g["intermediate"], max_position_embeddings=g["max_positions"],
                     tie_word_embeddings=g["tied"], dtype=checkpoint_dtype(cfg), rotary_dim=rotary_dim, **own)


def rotary_dim(cfg: dict, head_dim: int, default_factor: Optional[float] = None) -> int:
    """Rotary width of a head as transformers' rotary embedding builds it: int(head_dim x partial_rotary_factor)
    where the RoPE reads the factor, else the whole head. An architecture's own default RoPE reads it when
    default_factor is given (its config class's default: Phi-3 1.0, GLM-4.5 0.5, Qwen3-Next 0.25); any other
    rope_type (llama3, yarn, linear ...: transformers' shared init functions) reads it always. The factor: from
    rope_parameters (rope_scaling, its older name), else the top-level key, else the default, the priority
    transformers' convert_rope_params_to_dict gives them."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if default_factor is None and rope_type == "default":
        return head_dim
    factor = rope.get("partial_rotary_factor")
    if factor is None:
        factor = opt(cfg, "partial_rotary_factor", 1.0 if default_factor is None else default_factor)
    return int(head_dim * factor)


def embeddings(vocab: int, hidden: int, tied: bool, tp: int, prefix: str = "model") -> list[WeightGroup]:
    """The input table and, unless tied to it, the lm_head (both vocab-parallel)."""
    rows = cdiv(vocab, tp)
    out = [WeightGroup("embed_tokens", f"{prefix}.embed_tokens.weight", (rows, hidden))]
    if not tied:
        out.append(WeightGroup("lm_head", "lm_head.weight", (rows, hidden)))
    return out


def attention(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, tp: int, *,
              prefix: str = "model.layers.*.self_attn", qkv_bias: bool = False, o_bias: bool = False,
              qk_norm: str = "", fused_qkv: bool = False) -> list[WeightGroup]:
    """q/k/v/o projections of `layers` layers. qk_norm: "head" (one head_dim-wide RMSNorm for q and one for k:
    Qwen3, Gemma 3) or "full" (over the whole projection width: OLMo 2), replicated either way. fused_qkv: one
    qkv_proj tensor (Phi-3)."""
    nq, nkv, d = cdiv(heads, tp), kv_heads_per_rank(kv_heads, tp), head_dim
    g = lambda name, shape, **kw: WeightGroup("attention", f"{prefix}.{name}", shape, layers, **kw)  # noqa: E731
    if fused_qkv:
        out = [g("qkv_proj.weight", ((nq + 2 * nkv) * d, hidden), linear=True)]
        if qkv_bias:
            out.append(g("qkv_proj.bias", ((nq + 2 * nkv) * d,)))
    else:
        out = [g("q_proj.weight", (nq * d, hidden), linear=True), g("k_proj.weight", (nkv * d, hidden), linear=True),
               g("v_proj.weight", (nkv * d, hidden), linear=True)]
        if qkv_bias:
            out += [g("q_proj.bias", (nq * d,)), g("k_proj.bias", (nkv * d,)), g("v_proj.bias", (nkv * d,))]
    out.append(g("o_proj.weight", (hidden, nq * d), linear=True))
    if o_bias:
        out.append(g("o_proj.bias", (hidden,)))
    if qk_norm == "head":
        out += [g("q_norm.weight", (d,)), g("k_norm.weight", (d,))]
    elif qk_norm == "full":
        out += [g("q_norm.weight", (heads * head_dim,)), g("k_norm.weight", (kv_heads * head_dim,))]
    elif qk_norm:
        raise ValueError(f"qk_norm {qk_norm!r}: 'head' or 'full'")
    return out


def mlp(count: int, hidden: int, intermediate: int, tp: int, *, prefix: str = "model.layers.*.mlp",
        names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"), fused_gate_up: bool = False,
        bias: bool = False, component: str = "mlp_dense", expert: bool = False) -> list[WeightGroup]:
    """A gated MLP (gate, up: [I / tp, H]; down: [H, I / tp]) in `count` places; fused_gate_up: one gate_up_proj
    [2 I / tp, H] (Phi-3). expert: a routed expert's (count = layers x experts held)."""
    if not count or not intermediate:
        return []
    cols = cdiv(intermediate, tp)
    gate, up, down = names
    g = lambda name, shape, **kw: WeightGroup(component, f"{prefix}.{name}", shape, count, expert=expert, **kw)  # noqa
    if fused_gate_up:
        out = [g(f"{gate}.weight", (2 * cols, hidden), linear=True)]
    else:
        out = [g(f"{gate}.weight", (cols, hidden), linear=True), g(f"{up}.weight", (cols, hidden), linear=True)]
    out.append(g(f"{down}.weight", (hidden, cols), linear=True))
    if bias:
        out += [g(f"{gate}.bias", ((2 if fused_gate_up else 1) * cols,))] + (
            [] if fused_gate_up else [g(f"{up}.bias", (cols,))]) + [g(f"{down}.bias", (hidden,))]
    return out


def routed_experts(sparse_layers: int, num_experts: int, hidden: int, moe_intermediate: int, tp: int, ep: int, *,
                   prefix: str = "model.layers.*.mlp.experts.*",
                   names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")) -> list[WeightGroup]:
    """Each sparse layer's routed experts as one rank holds them (ep = 1: every expert, its columns split over tp)."""
    if ep == 1:
        experts, cols = num_experts, cdiv(moe_intermediate, tp)
    else:
        experts, cols = expert_shard_of_rank(num_experts, moe_intermediate, tp, ep)
    return mlp(sparse_layers * experts, hidden, cols, 1, prefix=prefix, names=names, component="moe_experts",
               expert=True)


def fused_experts(sparse_layers: int, num_experts: int, hidden: int, moe_intermediate: int, tp: int, ep: int, *,
                  prefix: str, biases: bool = False) -> list[WeightGroup]:
    """Routed experts a checkpoint stores fused over the experts (gpt-oss, Llama 4: experts.gate_up_proj
    [E, H, 2I] and experts.down_proj [E, I, H], + gate_up_proj_bias / down_proj_bias with biases), declared per
    expert as [out, in] slices, `count` = layers x experts this rank holds."""
    if ep == 1:
        held, cols = num_experts, cdiv(moe_intermediate, tp)
    else:
        held, cols = expert_shard_of_rank(num_experts, moe_intermediate, tp, ep)
    g = lambda name, shape, **kw: WeightGroup("moe_experts", f"{prefix}.{name}", shape, sparse_layers * held,  # noqa
                                              expert=True, **kw)
    out = [g("gate_up_proj", (2 * cols, hidden), linear=True), g("down_proj", (hidden, cols), linear=True)]
    if biases:
        out += [g("gate_up_proj_bias", (2 * cols,)), g("down_proj_bias", (hidden,))]
    return out


def router(sparse_layers: int, num_experts: int, hidden: int, *, module: str = "model.layers.*.mlp.gate",
           bias_name: str = "", bias_dtype: str = "") -> list[WeightGroup]:
    """The router's [E, H] weight (replicated, kept dense by every format), and a per-expert bias when named, in
    bias_dtype when its checkpoint stores it in other than the model dtype (WeightGroup.dtype)."""
    out = [WeightGroup("moe_router", f"{module}.weight", (num_experts, hidden), sparse_layers)]
    if bias_name:
        out.append(WeightGroup("moe_router", f"{module}.{bias_name}", (num_experts,), sparse_layers, dtype=bias_dtype))
    return out


def shared_expert_moe(layers: int, sparse: int, experts: int, hidden: int, intermediate: int, moe_intermediate: int,
                      shared: int, tp: int, ep: int, *, router_bias: str = "",
                      router_bias_dtype: str = "") -> list[WeightGroup]:
    """DeepSeek's feed-forward layout (DeepSeek, GLM-4.5, ERNIE 4.5): a dense MLP in the layers - sparse first ones,
    and in each sparse layer routed experts, `shared` shared experts run as one MLP of shared x moe_intermediate
    (mlp.shared_experts) and the router (mlp.gate, with its bias when router_bias names it)."""
    return (mlp(layers - sparse, hidden, intermediate, tp)
            + routed_experts(sparse, experts, hidden, moe_intermediate, tp, ep)
            + mlp(sparse, hidden, shared * moe_intermediate, tp, prefix="model.layers.*.mlp.shared_experts",
                  component="moe_experts")
            + router(sparse, experts, hidden, bias_name=router_bias, bias_dtype=router_bias_dtype))


def norms(layers: int, hidden: int, names: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm"),
          final: str = "model.norm.weight") -> list[WeightGroup]:
    """Each layer's hidden-width RMSNorms and the final norm (replicated)."""
    out = [WeightGroup("norms", f"model.layers.*.{n}.weight", (hidden,), layers) for n in names]
    if final:
        out.append(WeightGroup("norms", final, (hidden,)))
    return out


def layer_kinds_from_types(cfg: dict, num_layers: int) -> tuple[str, ...]:
    """config.json's layer_types (transformers' "full_attention" / "sliding_attention" / "chunked_attention" /
    "linear_attention") as arch_spec.LAYER_KINDS; ValueError for a length or a type the planner does not know."""
    names = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked",
             "linear_attention": "linear"}
    types = cfg["layer_types"]
    if len(types) != num_layers:
        raise ValueError(f"config.json (model_type {cfg.get('model_type')!r}): {len(types)} layer_types for "
                         f"{num_layers} num_hidden_layers")
    unknown = sorted(set(types) - set(names))
    if unknown:
        raise ValueError(f"config.json (model_type {cfg.get('model_type')!r}): layer_types {unknown} are not a kind "
                         f"the planner knows ({', '.join(names)})")
    return tuple(names[t] for t in types)


def uniform_kinds(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """() when every layer is full (TextShape's spelling of the classic model), else the kinds."""
    return () if all(k == "full" for k in kinds) else kinds
