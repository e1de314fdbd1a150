"""The Mamba-2 hybrid the planner knows: NVIDIA Nemotron-H (model_type nemotron_h). Planned; not served.

Why this one of the three transformers has (granitemoehybrid, nemotron_h, falcon_h1): its published config is the
one this project can reproduce field for field (nvidia/Nemotron-H-8B-Base-8K, fixtures/nemotron-h-8b-base-8k), and
the same model_type carries NVIDIA's deployed Nemotron-H 4B / 8B / 47B / 56B, Nemotron-Nano-9B-v2 and
Nemotron-Nano-12B-v2, all served by upstream SGLang (models/nemotron_h.py) and vLLM. Granite-4.0-H's full
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
    "E"          refused: no published MoE Nemotron-H config is in the zoo to check it against
and backbone.embeddings, backbone.norm_f, lm_head (unless tied).

Only "M" and "*" blocks keep anything per request, so TextShape's decoder layers are those blocks, in order
(Nemotron-H-8B: 24 "linear" + 4 "full" of its 52 blocks); the "-" blocks are weights only.

TP sharding (upstream SGLang MambaMixer2): heads split (ceil); B / C groups split, and replicated so each rank holds
one when tp > ng (configs/mamba_utils.extra_groups_for_head_shards): ceil(ng / tp) per rank. in_proj, conv1d, dt_bias,
A_log, D and the gated norm follow their heads / groups; out_proj splits its input columns.

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
from sglang.srt.mem_plan.text_shape import TextShape

# transformers 5.24 NemotronHConfig's defaults, used only when config.json omits the key (head_dim: NVIDIA's
# config.json writes attention_head_dim, which is read first; the tensors have that width).
DEFAULTS = dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                intermediate_size=21504, mlp_bias=False, tie_word_embeddings=False, ssm_state_size=128,
                mamba_num_heads=128, mamba_head_dim=64, n_groups=8, conv_kernel=4, use_conv_bias=True,
                use_bias=False)
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
    if "moe" in kinds:
        raise ValueError("config.json (nemotron_h): MoE blocks ('E') are not planned: the planner lacks a checked "
                         "Nemotron-H MoE shape (router, latent projections, shared experts); the dense Nemotron-H "
                         "and Nemotron-Nano-v2 patterns (M, *, -) are planned")
    return kinds


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


def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
    H, V, kinds = C.need(cfg, "hidden_size"), C.need(cfg, "vocab_size"), blocks(cfg)
    rows = C.cdiv(V, tp)
    out = [WeightGroup("embed_tokens", "backbone.embeddings.weight", (rows, H))]
    if not _get(cfg, "tie_word_embeddings"):
        out.append(WeightGroup("lm_head", "lm_head.weight", (rows, H)))
    out += _mamba_mixer(kinds.count("linear"), H, cfg, tp)
    out += C.attention(kinds.count("full"), H, _get(cfg, "num_attention_heads"), _get(cfg, "num_key_value_heads"),
                       _get(cfg, "head_dim"), tp, prefix=f"{PREFIX}.mixer")
    out += _mlp(kinds.count("mlp"), H, cfg, tp)
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


def shape(cfg: dict) -> TextShape:
    kinds = tuple(k for k in blocks(cfg) if k in ("linear", "full"))
    return TextShape(
        model_type="nemotron_h", architectures=tuple(cfg.get("architectures") or ()), num_layers=len(kinds),
        hidden_size=C.need(cfg, "hidden_size"), num_q_heads=_get(cfg, "num_attention_heads"),
        num_kv_heads=_get(cfg, "num_key_value_heads"), head_dim=_get(cfg, "head_dim"),
        vocab_size=C.need(cfg, "vocab_size"), intermediate_size=_get(cfg, "intermediate_size"),
        max_position_embeddings=_get(cfg, "max_position_embeddings"),
        tie_word_embeddings=bool(_get(cfg, "tie_word_embeddings")), dtype=C.checkpoint_dtype(cfg),
        layer_kinds=kinds, state_tensors=state_tensors(cfg))


ARCHS = (ArchSpec("nemotron_h", "state-space", weights, shape, served=False),)
