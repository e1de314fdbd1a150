"""The Mamba-2 hybrid the planner knows: NVIDIA Nemotron-H (model_type nemotron_h), dense (Nemotron-H, Nemotron-Nano
v2) or with MoE blocks (Nemotron-3-Nano-30B-A3B). Planned; not served.

Why this one of the three transformers has (granitemoehybrid, nemotron_h, falcon_h1): its published config is the
one this project can reproduce field for field (nvidia/Nemotron-H-8B-Base-8K, fixtures/nemotron-h-8b-base-8k), and
the same model_type carries NVIDIA's deployed Nemotron-H 4B / 8B / 47B / 56B, Nemotron-Nano-9B-v2 / -12B-v2 and the
MoE Nemotron-3-Nano-30B-A3B (fixtures/nemotron-3-nano-30b-a3b), all served by upstream SGLang (models/nemotron_h.py)
and vLLM. Granite-4.0-H's full
config.json (its mamba_n_heads and attention positions) is not in the reference corpus, and Falcon-H1 has the least
deployment of the three.

A Nemotron-H block holds ONE mixer, named per block by hybrid_override_pattern ("M" Mamba-2, "*" attention,
"-" MLP, "E" MoE) or layers_block_type / layer_types ("linear_attention", "full_attention", "mlp", "moe").
Tensors (checkpoint names, backbone.*; nh Mamba heads of hd, ng groups, N = ssm_state_size, K = conv_kernel):
    every block  norm.weight [H]
    "M"          mixer.in_proj [I + conv_dim + nh, H] with I = nh hd and conv_dim = I + 2 ng N (z, then x B C, then
                 dt), mixer.conv1d weight [conv_dim, 1, K] and bias [conv_dim] (use_conv_bias), dt_bias / A_log / D
                 [nh], mixer.norm.weight [I] (gated RMSNorm per group), mixer.out_proj [H, I]; in / out biases with
                 use_bias
    "*"          q_proj [nq d, H], k_proj / v_proj [nkv d, H], o_proj [H, nq d], no biases (NemotronHAttention)
    "-"          up_proj [intermediate_size, H], down_proj [H, intermediate_size] (relu2: no gate), mlp_bias
    "E"          mixer.gate.weight [E, H] and gate.e_score_correction_bias [E] (the router), E experts' up_proj
                 [moe_intermediate_size, H] and down_proj [H, moe_intermediate_size] (relu2: no gate), and
                 shared_experts.up_proj / down_proj of moe_shared_expert_intermediate_size; a moe_latent_size
                 (latent expert projections) is refused: no published config with one is in the zoo to check
and backbone.embeddings, backbone.norm_f, lm_head (unless tied).

Only "M" and "*" blocks keep anything per request, so a TextShape decoder layer is one of those blocks together with
the feed-forward blocks ("-", "E") that follow it up to the next one (Nemotron-H-8B: 24 "linear" + 4 "full" layers of
its 52 blocks; Nemotron-3-Nano: 23 + 6 of 52, 23 of them with an "E" block: its sparse layers).

TP sharding (upstream SGLang MambaMixer2): heads split (ceil); B / C groups split, and replicated so each rank holds
one when tp > ng (configs/mamba_utils.extra_groups_for_head_shards): ceil(ng / tp) per rank. in_proj, conv1d, dt_bias,
A_log, D and the gated norm follow their heads / groups; out_proj splits its input columns. Experts as every MoE
family (E / ep experts of moe_intermediate_size / (tp / ep) columns); the router is replicated.

Per request, per "M" block (StateTensor), one rank of tp:
    conv state  [conv_dim, K - 1] in the model dtype, as two channel groups: x (nh heads x hd, "conv_x") and B, C
                (ng groups x 2 N, "conv_bc"), split as the conv weight is. Upstream SGLang (mamba_utils.
                Mamba2StateShape: (conv_dim / tp, K - 1), dtype SGLANG_MAMBA_CONV_DTYPE, default bfloat16 = this
                checkpoint's dtype) and vLLM keep K - 1 columns; transformers' cache keeps K.
    SSM state   [nh, hd, N] in float32 unless config.json names another (mamba_ssm_dtype, upstream SGLang's key, or
                mamba_ssm_cache_dtype, transformers' NemotronHConfig key, default float32 in both).
"""

from __future__ import annotations

from sglang.srt.mem_plan import arch_common as C
from sglang.srt.mem_plan.arch_spec import ArchSpec, StateTensor, WeightGroup
from sglang.srt.mem_plan.dtypes import canonical_dtype
from sglang.srt.mem_plan.moe_sizes import expert_shard_of_rank
from sglang.srt.mem_plan.text_shape import HeadSplitWidth

# transformers 5.24 NemotronHConfig's defaults, used only when config.json omits the key (head_dim: NVIDIA's
# config.json writes attention_head_dim, which is read first; the tensors have that width).
DEFAULTS = dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                intermediate_size=21504, mlp_bias=False, tie_word_embeddings=False, ssm_state_size=128,
                mamba_num_heads=128, mamba_head_dim=64, n_groups=8, conv_kernel=4, use_conv_bias=True,
                use_bias=False, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=7688,
                moe_shared_expert_intermediate_size=7688)
# Older Nemotron-H / Mamba configs' names of the same keys (NemotronHConfig.__post_init__ reads them).
LEGACY_KEYS = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "use_conv_bias": "mamba_conv_bias"}
DEFAULT_SSM_STATE_DTYPE = "float32"  # upstream SGLang's and transformers' default for the SSM state
BLOCK_KINDS = {"M": "linear", "*": "full", "-": "mlp", "E": "moe"}
BLOCK_TYPE_NAMES = {"linear_attention": "linear", "full_attention": "full", "mlp": "mlp", "moe": "moe",
                    "mamba": "linear", "attention": "full"}
PREFIX = "backbone.layers.*"


def _get(cfg: dict, key: str):
    if key in LEGACY_KEYS and cfg.get(key) is None and cfg.get(LEGACY_KEYS[key]) is not None:
        return cfg[LEGACY_KEYS[key]]
    if key == "head_dim" and cfg.get("head_dim") is None and cfg.get("attention_head_dim") is not None:
        return cfg["attention_head_dim"]
    return C.opt(cfg, key, DEFAULTS[key])


def blocks(cfg: dict) -> tuple[str, ...]:
    """Each block's mixer: "linear" (Mamba-2), "full" (attention), "mlp" or "moe"."""
    pattern = cfg.get("hybrid_override_pattern")
    names = cfg.get("layers_block_type") or cfg.get("layer_types")
    if pattern is not None:
        unknown = sorted(set(pattern) - set(BLOCK_KINDS))
        kinds = tuple(BLOCK_KINDS.get(c, "") for c in pattern)
    elif names is not None:
        unknown = sorted(set(names) - set(BLOCK_TYPE_NAMES))
        kinds = tuple(BLOCK_TYPE_NAMES.get(n, "") for n in names)
    else:
        raise ValueError("config.json (model_type 'nemotron_h') lacks 'hybrid_override_pattern' (or "
                         "'layers_block_type'), which names each block's mixer; add the model's published value.")
    if unknown:
        raise ValueError(f"config.json (nemotron_h): block types {unknown} are none the planner knows "
                         f"(pattern {''.join(BLOCK_KINDS)} or {', '.join(BLOCK_TYPE_NAMES)})")
    declared = cfg.get("num_hidden_layers")
    if declared is not None and declared != len(kinds):
        raise ValueError(f"config.json (nemotron_h): num_hidden_layers {declared} but the block pattern names "
                         f"{len(kinds)} blocks")
    if "moe" in kinds and cfg.get("moe_latent_size") is not None:
        raise ValueError("config.json (nemotron_h): moe_latent_size is set: the planner lacks a checked shape of "
                         "Nemotron-H's latent expert projections (fc1 / fc2_latent_proj); MoE blocks without them "
                         "(Nemotron-3-Nano) are planned")
    return kinds


def decoder_layers(kinds: tuple[str, ...]) -> list[tuple[str, set]]:
    """(mixer kind, kinds of the feed-forward blocks after it) per token-mixing block; feed-forward blocks before
    the first mixer ride with it (weights only either way)."""
    layers: list[tuple[str, set]] = []
    leading: set = set()
    for k in kinds:
        if k in ("linear", "full"):
            layers.append((k, leading if not layers else set()))
        elif layers:
            layers[-1][1].add(k)
        else:
            leading.add(k)
    if not layers:
        raise ValueError("config.json (nemotron_h): the block pattern has no Mamba ('M') or attention ('*') block")
    return layers


def _mamba_sizes(cfg: dict, tp: int) -> tuple[int, int, int, int]:
    """(heads, groups, inner width, conv channels) on one rank."""
    heads, groups = C.cdiv(_get(cfg, "mamba_num_heads"), tp), C.cdiv(_get(cfg, "n_groups"), tp)
    inner = heads * _get(cfg, "mamba_head_dim")
    return heads, groups, inner, inner + 2 * groups * _get(cfg, "ssm_state_size")


def _mamba_mixer(count: int, hidden: int, cfg: dict, tp: int) -> list[WeightGroup]:
    heads, _, inner, conv = _mamba_sizes(cfg, tp)
    g = lambda name, shape, **kw: WeightGroup("ssm", f"{PREFIX}.mixer.{name}", shape, count, **kw)  # noqa: E731
    out = [g("in_proj.weight", (inner + conv + heads, hidden), linear=True),
           g("conv1d.weight", (conv, 1, _get(cfg, "conv_kernel"))),
           g("dt_bias", (heads,)), g("A_log", (heads,)), g("D", (heads,)), g("norm.weight", (inner,)),
           g("out_proj.weight", (hidden, inner), linear=True)]
    if _get(cfg, "use_conv_bias"):
        out.append(g("conv1d.bias", (conv,)))
    if _get(cfg, "use_bias"):
        out += [g("in_proj.bias", (inner + conv + heads,)), g("out_proj.bias", (hidden,))]
    return out


def _mlp(count: int, hidden: int, cfg: dict, tp: int) -> list[WeightGroup]:
    cols = C.cdiv(_get(cfg, "intermediate_size"), tp)
    g = lambda name, shape, **kw: WeightGroup("mlp_dense", f"{PREFIX}.mixer.{name}", shape, count, **kw)  # noqa
    out = [g("up_proj.weight", (cols, hidden), linear=True), g("down_proj.weight", (hidden, cols), linear=True)]
    if _get(cfg, "mlp_bias"):
        out += [g("up_proj.bias", (cols,)), g("down_proj.bias", (hidden,))]
    return out


def _moe(count: int, hidden: int, cfg: dict, tp: int, ep: int) -> list[WeightGroup]:
    if not count:
        return []
    E, cols = _get(cfg, "n_routed_experts"), _get(cfg, "moe_intermediate_size")
    experts, cols = (E, C.cdiv(cols, tp)) if ep == 1 else expert_shard_of_rank(E, cols, tp, ep)
    shared = C.cdiv(_get(cfg, "moe_shared_expert_intermediate_size"), tp)
    x, s = f"{PREFIX}.mixer.experts.*", f"{PREFIX}.mixer.shared_experts"
    return [WeightGroup("moe_router", f"{PREFIX}.mixer.gate.weight", (E, hidden), count),
            WeightGroup("moe_router", f"{PREFIX}.mixer.gate.e_score_correction_bias", (E,), count),
            WeightGroup("moe_experts", f"{x}.up_proj.weight", (cols, hidden), count * experts, True, True),
            WeightGroup("moe_experts", f"{x}.down_proj.weight", (hidden, cols), count * experts, True, True),
            WeightGroup("moe_experts", f"{s}.up_proj.weight", (shared, hidden), count, linear=True),
            WeightGroup("moe_experts", f"{s}.down_proj.weight", (hidden, shared), count, linear=True)]


def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
    H, V, kinds = C.need(cfg, "hidden_size"), C.need(cfg, "vocab_size"), blocks(cfg)
    rows = C.cdiv(V, tp)
    out = [WeightGroup("embed_tokens", "backbone.embeddings.weight", (rows, H))]
    if not _get(cfg, "tie_word_embeddings"):
        out.append(WeightGroup("lm_head", "lm_head.weight", (rows, H)))
    out += _mamba_mixer(kinds.count("linear"), H, cfg, tp)
    out += C.attention(kinds.count("full"), H, _get(cfg, "num_attention_heads"), _get(cfg, "num_key_value_heads"),
                       _get(cfg, "head_dim"), tp, prefix=f"{PREFIX}.mixer")
    out += _mlp(kinds.count("mlp"), H, cfg, tp) + _moe(kinds.count("moe"), H, cfg, tp, ep)
    out += [WeightGroup("norms", f"{PREFIX}.norm.weight", (H,), len(kinds)),
            WeightGroup("norms", "backbone.norm_f.weight", (H,))]
    return tuple(out)


def state_tensors(cfg: dict) -> tuple[StateTensor, ...]:
    k, n = _get(cfg, "conv_kernel"), _get(cfg, "ssm_state_size")
    heads, hd, groups = _get(cfg, "mamba_num_heads"), _get(cfg, "mamba_head_dim"), _get(cfg, "n_groups")
    conv = C.checkpoint_dtype(cfg)
    ssm = canonical_dtype(cfg.get("mamba_ssm_dtype") or cfg.get("mamba_ssm_cache_dtype") or DEFAULT_SSM_STATE_DTYPE)
    return (StateTensor("conv_x", heads, hd * (k - 1), conv), StateTensor("conv_bc", groups, 2 * n * (k - 1), conv),
            StateTensor("ssm", heads, hd * n, ssm))


def linear_widths(cfg: dict) -> tuple[HeadSplitWidth, ...]:
    """A Mamba-2 block's projections per token: per head z and x (2 hd) and dt (1) of in_proj and the hd out_proj
    reads; per group B and C (2 N) of in_proj. Split as in_proj is (heads, groups ceil per rank)."""
    hd, n = _get(cfg, "mamba_head_dim"), _get(cfg, "ssm_state_size")
    return HeadSplitWidth(_get(cfg, "mamba_num_heads"), 3 * hd + 1), HeadSplitWidth(_get(cfg, "n_groups"), 2 * n)


def shape(cfg: dict):
    layers = decoder_layers(blocks(cfg))
    kinds = tuple(mixer for mixer, _ in layers)
    sparse = tuple(i for i, (_, ffn) in enumerate(layers) if "moe" in ffn)
    moe = dict(num_experts=_get(cfg, "n_routed_experts"), num_experts_per_tok=_get(cfg, "num_experts_per_tok"),
               moe_intermediate_size=_get(cfg, "moe_intermediate_size"), router_bias=True,
               shared_expert_intermediate_size=_get(cfg, "moe_shared_expert_intermediate_size")) if sparse else {}
    g = dict(layers=len(kinds), hidden=C.need(cfg, "hidden_size"), heads=_get(cfg, "num_attention_heads"),
             kv_heads=_get(cfg, "num_key_value_heads"), head_dim=_get(cfg, "head_dim"), vocab=C.need(cfg, "vocab_size"),
             intermediate=_get(cfg, "intermediate_size"), max_positions=_get(cfg, "max_position_embeddings"),
             tied=bool(_get(cfg, "tie_word_embeddings")))
    # no RoPE: NemotronHAttention takes no position embeddings (position comes from the Mamba blocks)
    return C.text_shape("nemotron_h", cfg, g, rotary_dim=0, layer_kinds=kinds, state_tensors=state_tensors(cfg),
                        linear_widths=linear_widths(cfg), sparse_layers=sparse, **moe)


ARCHS = (ArchSpec("nemotron_h", "state-space", weights, shape, served=True),)
