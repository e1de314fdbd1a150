"""The architectures of arch_llama / arch_gemma / arch_qwen_moe / arch_deepseek against Hugging Face transformers' own
models of published config.json files (fixtures/<name>), built on the meta device (meta_model.py):

- parameters per component at tp=1 == the HF model's, its tensors assigned to components by the name rules below;
- per-rank parameters at tp 2/4/8 == the HF tensors split by the TP rules below (column-parallel rows by heads or
  ceil(rows / tp); row-parallel columns; norms, routers, latent projections, q/k norms replicated; KV heads replicated
  when tp > KV heads);
- layer kinds == what transformers' config says (layer_types after its __post_init__, else the window Mistral /
  Phi-3 pass to every layer), and the window;
- K/V bytes per token of each layer kind by hand: 2 x KV heads per rank x head_dim x 2 B (MLA: the latent,
  kv_lora_rank + qk_rope_head_dim, x 2 B), times the layers of that kind;
- an unknown model_type and a missing required key refused by name; `sglang plan --json` of every fixture here
  exits 0 or 1 (fits / does not fit) with its JSON, never with a traceback.
"""

import contextlib
import io
import json
import math
import os
import unittest

from meta_model import FIXTURES, fixture_config, hf_config, hf_rotary_widths, hf_tensors

from sglang.srt.mem_plan.layer_pools import split_kv_cell
from sglang.srt.mem_plan.model_shapes import model_shape_from_config, model_shape_from_path
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="cpu")

ZOO = {  # fixture -> (model_type the planner reads, layer kinds as (kind, count) in layer order where they alternate)
    "llama-3.1-8b": "llama", "llama-3.3-70b-instruct": "llama", "qwen2.5-7b-instruct": "qwen2",
    "qwen2.5-72b-instruct": "qwen2", "qwen3-8b": "qwen3", "qwen3-32b": "qwen3", "mistral-7b-v0.1": "mistral",
    "ministral-8b-instruct-2410": "ministral", "phi-3-mini-4k-instruct": "phi3", "phi-4": "phi3",
    "gemma-2-9b": "gemma2", "gemma-3-27b-it": "gemma3_text", "gemma-3-1b-it": "gemma3_text",
    "olmo-2-1124-7b": "olmo2", "granite-3.1-8b-instruct": "granite", "qwen3-30b-a3b": "qwen3_moe",
    "mixtral-8x7b": "mixtral", "deepseek-v3": "deepseek_v3", "kimi-k2-instruct": "deepseek_v3",
    "deepseek-v2-lite": "deepseek_v2",
}
TPS = (2, 4, 8)


def component(name: str) -> str:
    """The plan's component of an HF tensor, by its name alone."""
    if "vision_tower" in name:
        return "vision_tower"
    if "multi_modal_projector" in name:
        return "projector"
    if name.startswith("lm_head"):
        return "lm_head"
    if "embed_tokens" in name:
        return "embed_tokens"
    if ".experts." in name or "shared_expert" in name:
        return "moe_experts"
    if ".mlp.gate." in name:
        return "moe_router"
    if ".self_attn." in name:
        return "attention"
    if ".mlp." in name:
        return "mlp_dense"
    if "norm" in name:
        return "norms"
    raise AssertionError(f"no component rule for {name}")


def rank_numel(name: str, shape: tuple, tp: int, hc) -> int:
    """Elements of one HF tensor on one of tp ranks (hc: the text model's HF config)."""
    leaf = name.split(".")
    module, kind = leaf[-2], leaf[-1]
    nq, nkv = hc.num_attention_heads, hc.num_key_value_heads
    q_heads, kv_heads = math.ceil(nq / tp), max(1, nkv // tp)
    comp = component(name)
    if comp in ("vision_tower", "projector", "norms", "moe_router") or "norm" in module or "shared_expert_gate" in name:
        return math.prod(shape)
    if comp in ("embed_tokens", "lm_head"):
        return math.ceil(shape[0] / tp) * shape[1]
    if module in ("q_a_proj", "kv_a_proj_with_mqa"):  # MLA's latent down-projections: replicated
        return math.prod(shape)
    if module in ("q_proj", "q_b_proj", "kv_b_proj"):  # column-parallel by query heads
        return q_heads * (shape[0] // nq) * math.prod(shape[1:])
    if module in ("k_proj", "v_proj"):  # by KV heads, replicated past their number
        return kv_heads * (shape[0] // nkv) * math.prod(shape[1:])
    if module == "qkv_proj":
        d = shape[0] // (nq + 2 * nkv)
        return (q_heads + 2 * kv_heads) * d * shape[1]
    if module == "o_proj":
        return shape[0] * q_heads * (shape[1] // nq) if kind == "weight" else shape[0]
    if module == "experts" and kind == "gate_up_proj":  # [E, 2 I, H], fused by transformers
        return shape[0] * 2 * math.ceil(shape[1] // 2 / tp) * shape[2]
    if module == "experts" and kind == "down_proj":  # [E, H, I]
        return shape[0] * shape[1] * math.ceil(shape[2] / tp)
    if module in ("gate_proj", "up_proj"):
        return math.ceil(shape[0] / tp) * shape[1]
    if module == "gate_up_proj":  # Phi-3's fused [2 I, H]
        return 2 * math.ceil(shape[0] // 2 / tp) * shape[1]
    if module == "down_proj":
        return shape[0] * math.ceil(shape[1] / tp)
    raise AssertionError(f"no TP rule for {name} {shape}")


def hf_per_component(name: str, tp: int) -> dict:
    cfg = fixture_config(name)
    hc = hf_config(cfg)
    hc = getattr(hc, "text_config", None) or hc
    out = {}
    for tensor, shape in hf_tensors(name).items():
        c = component(tensor)
        out[c] = out.get(c, 0) + rank_numel(tensor, shape, tp, hc)
    return out


def nonzero(d: dict) -> dict:
    return {k: v for k, v in d.items() if v}


def hf_layer_kinds(name: str) -> tuple:
    """transformers' own answer: layer_types after the config's __post_init__, else the sliding_window the
    Mistral / Phi-3 / Mixtral modeling code passes to every layer."""
    hc = hf_config(fixture_config(name))
    hc = getattr(hc, "text_config", None) or hc
    names = {"full_attention": "full", "sliding_attention": "sliding"}
    types = getattr(hc, "layer_types", None)
    if types is not None:
        return tuple(names[t] for t in types), getattr(hc, "sliding_window", None) or 0
    window = getattr(hc, "sliding_window", None)
    return ("sliding" if window else "full",) * hc.num_hidden_layers, window or 0


class TestArchZoo(unittest.TestCase):
    def test_params_equal_the_hf_meta_model(self):
        for name in ZOO:
            with self.subTest(name):
                s = model_shape_from_path(os.path.join(FIXTURES, name))
                self.assertEqual(s.text.model_type, ZOO[name])
                self.assertEqual(nonzero(s.params()), hf_per_component(name, 1))
                self.assertEqual(s.num_params, sum(math.prod(v) for v in hf_tensors(name).values()))

    def test_per_rank_params_at_tp_2_4_8(self):
        for name in ZOO:
            s = model_shape_from_path(os.path.join(FIXTURES, name))
            if s.encoders:
                continue  # multimodal models run on one rank (configs/resolved.check_tp_sharding)
            for tp in TPS:
                with self.subTest(name, tp=tp):
                    self.assertEqual(nonzero(s.params(tp)), hf_per_component(name, tp))

    def test_layer_kinds_and_kv_bytes_per_kind(self):
        for name in ZOO:
            s = model_shape_from_path(os.path.join(FIXTURES, name))
            t = s.text
            kinds, window = hf_layer_kinds(name)
            with self.subTest(name):
                self.assertEqual(t.kinds(), kinds)
                self.assertEqual(t.sliding_window, window if "sliding" in kinds else 0)
            for tp in (1, 2, 8):
                hc = hf_config(fixture_config(name))
                hc = getattr(hc, "text_config", None) or hc
                if t.is_mla:
                    per_layer = (hc.kv_lora_rank + hc.qk_rope_head_dim) * 2
                else:
                    head_dim = getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads
                    per_layer = 2 * max(1, hc.num_key_value_heads // tp) * head_dim * 2
                cell = s.kv_cell("bfloat16", tp)
                full, pools = split_kv_cell(t, cell, tp)
                with self.subTest(name, tp=tp):
                    self.assertEqual(cell.cell_bytes, per_layer * len(kinds))
                    self.assertEqual(full.cell_bytes, per_layer * kinds.count("full"))
                    self.assertEqual(pools.windowed_cell_bytes, per_layer * kinds.count("sliding"))

    def test_rotary_width_equals_the_hf_rotary_embedding(self):
        """The RoPE tables priced (rope_tables x [max_position_embeddings, rotary_dim]) are the ones HF's rotary
        embedding holds: 2 x inv_freq's length per table (Gemma 3: one per RoPE base; MLA: qk_rope_head_dim)."""
        for name in ZOO:
            s = model_shape_from_path(os.path.join(FIXTURES, name))
            widths = hf_rotary_widths(name)
            with self.subTest(name):
                self.assertEqual((s.text.rotary_dim,) * s.text.rope_tables, widths)
                self.assertEqual(s.rope_cache_bytes(2), s.text.max_position_embeddings * sum(widths) * 2)

    def test_float32_router_bias_priced_at_4_bytes(self):
        """DeepSeek-V3 / Kimi-K2 store the router's e_score_correction_bias in float32 beside bf16 weights (sources
        in arch_deepseek): the weights term is params x 2 B + the rope tables + 2 B more per element of HF's
        e_score_correction_bias tensors, which HF's router also creates float32 under a bf16 default dtype; the
        other fixtures declare no tensor in its own dtype."""
        import torch
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

        for name in ZOO:
            s = model_shape_from_path(os.path.join(FIXTURES, name))
            bias = sum(math.prod(v) for k, v in hf_tensors(name).items() if k.endswith("e_score_correction_bias"))
            extra = 2 * bias if ZOO[name] == "deepseek_v3" else 0
            with self.subTest(name):
                elem = s.text.dtype_bytes  # bf16; Gemma-2-9B and OLMo-2 publish float32
                self.assertEqual(s.weight_bytes() - s.num_params * elem - s.rope_cache_bytes(elem), extra)
                self.assertEqual(bool(extra), name in ("deepseek-v3", "kimi-k2-instruct"))
        self.assertEqual(sum(math.prod(v) for k, v in hf_tensors("deepseek-v3").items()
                             if k.endswith("e_score_correction_bias")), 58 * 256)
        default = torch.get_default_dtype()
        try:
            torch.set_default_dtype(torch.bfloat16)
            with torch.device("meta"):
                router = DeepseekV3TopkRouter(hf_config(fixture_config("deepseek-v3")))
        finally:
            torch.set_default_dtype(default)
        self.assertEqual(router.e_score_correction_bias.dtype, torch.float32)

    def test_partial_rotary_factor_as_transformers_reads_it(self):
        """Phi-3's rotary embedding covers partial_rotary_factor of a head (Phi-4-mini publishes 0.75), from the
        top-level key or rope_parameters; Llama's ignores the key."""
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

        variants = [("phi-4", dict(partial_rotary_factor=0.75), Phi3RotaryEmbedding),
                    ("phi-4", dict(rope_parameters={"rope_type": "default", "rope_theta": 250000.0,
                                                    "partial_rotary_factor": 0.5}), Phi3RotaryEmbedding),
                    ("llama-3.1-8b", dict(partial_rotary_factor=0.5), LlamaRotaryEmbedding)]
        for name, change, rotary in variants:
            cfg = dict(fixture_config(name), **change)
            with self.subTest(name, **change):
                want = 2 * rotary(hf_config(cfg)).inv_freq.shape[-1]
                self.assertEqual(model_shape_from_config(cfg).text.rotary_dim, want)
        self.assertEqual(model_shape_from_config(dict(fixture_config("phi-4"), partial_rotary_factor=0.75))
                         .text.rotary_dim, 96)

    def test_window_keys_as_transformers_reads_them(self):
        """Variants of published configs: Qwen2 / Qwen3 slide only with use_sliding_window, from max_window_layers on;
        Mistral's null window is full attention; Qwen2-MoE slides odd-numbered layers below max_window_layers."""
        variants = [
            ("qwen2.5-7b-instruct", dict(use_sliding_window=True, max_window_layers=20, sliding_window=4096)),
            ("qwen2.5-7b-instruct", dict(use_sliding_window=False, max_window_layers=0)),
            ("qwen3-8b", dict(use_sliding_window=True, max_window_layers=30, sliding_window=8192)),
            ("mistral-7b-v0.1", dict(sliding_window=None)),
            ("qwen3-30b-a3b", dict(use_sliding_window=True, max_window_layers=40, sliding_window=2048)),
            ("gemma-2-9b", dict(sliding_window=2048)),
        ]
        names = {"full_attention": "full", "sliding_attention": "sliding"}
        for name, change in variants:
            cfg = dict(fixture_config(name), **change)
            hc = hf_config(cfg)
            text = model_shape_from_config(cfg).text
            with self.subTest(name, **change):
                if getattr(hc, "layer_types", None) is not None:
                    want = tuple(names[t] for t in hc.layer_types)
                else:
                    want = ("sliding" if hc.sliding_window else "full",) * hc.num_hidden_layers
                self.assertEqual(text.kinds(), want)
                self.assertEqual(text.sliding_window, (hc.sliding_window or 0) if "sliding" in want else 0)
        qwen2_moe = dict(fixture_config("qwen3-30b-a3b"), model_type="qwen2_moe", use_sliding_window=True,
                         max_window_layers=9, sliding_window=1024, shared_expert_intermediate_size=768)
        want = tuple(names[t] for t in hf_config(qwen2_moe).layer_types)
        self.assertEqual(model_shape_from_config(qwen2_moe).text.kinds(), want)
        self.assertEqual(want.count("sliding"), 5)

    def test_the_issue_figures(self):
        """Issue 40's: Gemma-3-27B keeps 52 of 62 layers in a 1,024-token window at 81,920 B a token for the
        global ones' (10 layers x 2 x 16 heads x 128 x 2 B); Mistral-7B's every layer holds at most 4,096 tokens."""
        gemma = model_shape_from_path(os.path.join(FIXTURES, "gemma-3-27b-it")).text
        self.assertEqual((gemma.kinds().count("sliding"), gemma.num_layers, gemma.sliding_window), (52, 62, 1024))
        self.assertEqual(10 * 2 * 16 * 128 * 2, 81_920)
        mistral = model_shape_from_path(os.path.join(FIXTURES, "mistral-7b-v0.1")).text
        self.assertEqual((set(mistral.kinds()), mistral.sliding_window), ({"sliding"}, 4096))
        # counts their publishers print: Ministral-8B's model card (8,019,808,256 parameters, attention pattern
        # 128k / 32k / 32k / 32k) and keras-hub's Phi-3-mini preset (3,821,079,552)
        ministral = model_shape_from_path(os.path.join(FIXTURES, "ministral-8b-instruct-2410"))
        self.assertEqual(ministral.num_params, 8_019_808_256)
        self.assertEqual(ministral.text.kinds()[:4], ("full", "sliding", "sliding", "sliding"))
        self.assertEqual(model_shape_from_path(os.path.join(FIXTURES, "phi-3-mini-4k-instruct")).num_params,
                         3_821_079_552)


class TestRefusals(unittest.TestCase):
    def test_unknown_model_type_is_refused_naming_it_and_the_known(self):
        cfg = dict(fixture_config("llama-3.1-8b"), model_type="made_up_arch")
        with self.assertRaises(ValueError) as e:
            model_shape_from_config(cfg)
        message = str(e.exception)
        self.assertIn("'made_up_arch'", message)
        for known in ZOO.values():
            self.assertIn(known, message)

    def test_missing_required_key_is_refused_naming_it(self):
        for name, key in (("llama-3.1-8b", "hidden_size"), ("deepseek-v3", "kv_lora_rank"),
                          ("mixtral-8x7b", "num_local_experts"), ("gemma-2-9b", "intermediate_size")):
            cfg = {k: v for k, v in fixture_config(name).items() if k != key}
            with self.subTest(name, key=key), self.assertRaises(ValueError) as e:
                model_shape_from_config(cfg).params()
            self.assertIn(repr(key), str(e.exception))

    def test_sglang_plan_json_of_every_fixture_without_a_traceback(self):
        from sglang.cli.plan import main

        for name in ZOO:
            out, err = io.StringIO(), io.StringIO()
            with self.subTest(name), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    status = main(["--model-path", os.path.join(FIXTURES, name), "--gpu", "h100-80gb", "--json"])
                except SystemExit as e:  # a refusal (usage error 2) would be a fixture the planner cannot size
                    status = e.code
                self.assertIn(status, (0, 1), err.getvalue())
                result = json.loads(out.getvalue())
                for card in result if isinstance(result, list) else [result]:
                    self.assertEqual(card["model_type"], ZOO[name])


if __name__ == "__main__":
    unittest.main()
