"""Test helpers shared by the planner's zoo tests: Hugging Face transformers' own model of a published config.json,
built on the meta device (no weights, no network), as the independent reference for parameter counts.

    fixture_config(name)   the config.json of test/registered/mem_plan/fixtures/<name>
    hf_config(cfg)         transformers' config object of it (its __post_init__ fills layer_types and defaults)
    hf_tensors(name)       {checkpoint tensor name: shape} of the meta model: its parameters (tied ones once) and the
                           buffers a checkpoint holds (HF_CHECKPOINT_BUFFERS); built once per fixture, cached
    hf_rotary_widths(name) the rotary width of each RoPE table of that model (its inv_freq buffers x 2)
Only shapes are kept (a 1T-parameter model on the meta device still costs module construction, done once).
"""

from __future__ import annotations

import functools
import json
import os

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

# keys transformers would act on beyond the architecture (remote code, a quantizer) or that are bookkeeping
NOT_ARCHITECTURE_KEYS = ("auto_map", "quantization_config", "_name_or_path", "transformers_version")
# model_types published by a checkpoint whose architecture transformers builds under another name (Kimi-K2's config
# says kimi_k2 with architectures DeepseekV3ForCausalLM and remote code that is DeepSeek-V3's)
HF_MODEL_TYPE = {"kimi_k2": "deepseek_v3"}
# buffers that are tensors of the checkpoint (DeepSeek-V3's router bias is an nn.Buffer in transformers)
HF_CHECKPOINT_BUFFERS = ("e_score_correction_bias",)


def fixture_config(name: str) -> dict:
    with open(os.path.join(FIXTURES, name, "config.json")) as f:
        return json.load(f)


def _clean(cfg: dict) -> dict:
    out = {k: v for k, v in cfg.items() if k not in NOT_ARCHITECTURE_KEYS}
    out["model_type"] = HF_MODEL_TYPE.get(out["model_type"], out["model_type"])
    for sub in ("text_config", "vision_config"):
        if isinstance(out.get(sub), dict):
            out[sub] = _clean(out[sub]) if "model_type" in out[sub] else dict(out[sub])
    return out


def hf_config(cfg: dict):
    from transformers import AutoConfig

    clean = _clean(cfg)
    return AutoConfig.for_model(clean.pop("model_type"), **clean)


@functools.lru_cache(maxsize=None)
def _hf_model_facts(name: str) -> tuple[dict, tuple]:
    import torch
    import transformers

    cfg = fixture_config(name)
    config = hf_config(cfg)
    arch = (cfg.get("architectures") or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    with torch.device("meta"):
        model = cls(config) if cls is not None else transformers.AutoModelForCausalLM.from_config(config)
    model.tie_weights()
    tensors = {n: tuple(p.shape) for n, p in model.named_parameters()}
    tensors.update({n: tuple(b.shape) for n, b in model.named_buffers()
                    if n.rsplit(".", 1)[-1] in HF_CHECKPOINT_BUFFERS})
    # the text model's rotary embeddings: one inv_freq buffer per distinct RoPE (Gemma 3: <layer type>_inv_freq),
    # each of rotary width / 2 frequencies; the original_ copies are the same table's, the vision towers' not text
    rotary = tuple(2 * b.shape[-1] for n, b in model.named_buffers() if n.endswith("inv_freq")
                   and "original_inv_freq" not in n and "vision" not in n and "visual" not in n)
    return tensors, rotary


def hf_tensors(name: str) -> dict[str, tuple[int, ...]]:
    """{name: shape} of every tensor of the fixture's HF model: parameters once each (tied weights share one
    Parameter, so named_parameters lists it once) plus HF_CHECKPOINT_BUFFERS."""
    return _hf_model_facts(name)[0]


def hf_rotary_widths(name: str) -> tuple[int, ...]:
    """The rotary width (2 x inv_freq's length) of each RoPE table the fixture's HF text model holds; () for none."""
    return _hf_model_facts(name)[1]
