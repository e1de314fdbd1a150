"""Linear-attention and state-space hybrids (arch_qwen3_next.py, arch_mamba_hybrid.py) against HF transformers' own
model built from the published config.json on the meta device: parameters per component at tp=1, per-rank shards at
tp 2/4/8 split from HF's tensors by name rules written here, layer kinds, KV per token, and the per-request state of
a linear layer measured from the cache transformers fills when its mixer runs on meta for one request."""

import contextlib
import io
import json
import os
import unittest
from functools import lru_cache

import torch
from meta_model import FIXTURES, HF_CHECKPOINT_BUFFERS, fixture_config, hf_config
from transformers import AutoModelForCausalLM, DynamicCache

from sglang.srt.mem_plan import arch_mamba_hybrid, arch_qwen3_next
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=45, suite="cpu")

ZOO = {"qwen3-next-80b-a3b-instruct": arch_qwen3_next, "nemotron-h-8b-base-8k": arch_mamba_hybrid,
       "nemotron-3-nano-30b-a3b": arch_mamba_hybrid}
MOE_ZOO = ("qwen3-next-80b-a3b-instruct", "nemotron-3-nano-30b-a3b")
fixture = fixture_config


@lru_cache(maxsize=None)
def hf_meta(name: str):
    """(HF config, HF model on the meta device in bfloat16) for one fixture, built once per module: the modules
    themselves, not only their tensors (meta_model.hf_tensors), since the state is read by running a mixer."""
    config = hf_config(fixture(name))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return config, model


def hf_layers(model):
    return model.model.layers


def hf_tensors(model):
    """(name, tensor) of every checkpoint tensor of the HF model: its parameters and HF_CHECKPOINT_BUFFERS."""
    yield from model.named_parameters()
    yield from ((n, b) for n, b in model.named_buffers() if n.rsplit(".", 1)[-1] in HF_CHECKPOINT_BUFFERS)


def block_kind(layer) -> str:
    """What a HF decoder layer / block mixes tokens with: "linear", "full", or "" (Nemotron-H MLP blocks)."""
    if hasattr(layer, "linear_attn"):
        return "linear"
    if hasattr(layer, "self_attn"):
        return "full"
    return {"linear_attention": "linear", "full_attention": "full"}.get(getattr(layer, "block_type", ""), "")


def component_of(name: str, model) -> str:
    """Component of one HF parameter, by its name (and, for Nemotron-H's one-mixer blocks, its block's type)."""
    parts = name.split(".")
    if name.endswith(("embed_tokens.weight", "embeddings.weight")):
        return "embed_tokens"
    if name == "lm_head.weight":
        return "lm_head"
    if "layernorm" in name or name in ("model.norm.weight", "model.norm_f.weight") or parts[-2:] == ["norm", "weight"] \
            and parts[-3].isdigit():
        return "norms"
    if ".linear_attn." in name:
        return "linear_attention"
    if ".self_attn." in name:
        return "attention"
    if ".mlp.gate.weight" in name or ".mixer.gate." in name:
        return "moe_router"
    if ".mlp.experts." in name or ".mlp.shared_expert" in name or ".mixer.experts." in name \
            or ".mixer.shared_experts." in name:
        return "moe_experts"
    if ".mlp." in name:
        return "mlp_dense"
    if ".mixer." in name:  # Nemotron-H: the block's type says what its mixer is
        kind = getattr(hf_layers(model)[int(parts[2])], "block_type")
        return {"linear_attention": "ssm", "full_attention": "attention", "mlp": "mlp_dense",
                "moe": "moe_experts"}[kind]
    raise AssertionError(f"no component rule for {name}")


def hf_components(model) -> dict:
    out = {}
    for name, p in hf_tensors(model):
        c = component_of(name, model)
        out[c] = out.get(c, 0) + p.numel()
    return out


def shard_numel(name: str, shape: tuple, tp: int, config) -> int:
    """One TP rank's elements of one HF tensor, split as upstream shards it (an independent rule per name)."""
    parts = name.split(".")
    leaf = parts[-2] if parts[-1] in ("weight", "bias") else parts[-1]
    dims = list(shape)

    def split(dim):
        dims[dim] = -(-dims[dim] // tp)

    if name.endswith(("embed_tokens.weight", "embeddings.weight")) or name == "lm_head.weight":
        split(0)  # vocab-parallel
    elif name.endswith(("experts.gate_up_proj", "experts.up_proj")):
        split(1)  # fused experts [E, (2) I, H]
    elif name.endswith("experts.down_proj"):
        split(2)  # [E, H, I]
    elif leaf in ("k_proj", "v_proj"):
        heads = config.num_key_value_heads
        dims[0] = dims[0] // heads * max(1, heads // tp)  # KV heads split, replicated past tp > heads
    elif leaf in ("q_proj", "in_proj_qkvz", "in_proj_ba", "in_proj", "conv1d", "dt_bias", "A_log", "D",
                  "gate_proj", "up_proj") or (leaf == "norm" and ".mixer." in name):
        split(0)  # column-parallel / per head (Mamba-2's gated norm is per group of the split inner width)
    elif leaf in ("o_proj", "out_proj", "down_proj"):
        split(1)  # row-parallel
    elif leaf in ("norm", "q_norm", "k_norm", "gate", "shared_expert_gate", "norm_f", "e_score_correction_bias") \
            or "layernorm" in leaf:
        pass  # replicated
    else:
        raise AssertionError(f"no TP rule for {name}")
    n = 1
    for d in dims:
        n *= d
    return n


def planned_components(spec, cfg, tp=1, ep=1) -> dict:
    out = {}
    for w in spec.weights(cfg, tp, ep):
        out[w.component] = out.get(w.component, 0) + w.numel
    return {c: n for c, n in out.items() if n}


def hf_state_of_one_request(config, model):
    """The conv and recurrent state transformers' cache holds for one request after a linear layer's mixer runs
    on 5 tokens (meta device): {(shape, dtype)} of the first linear layer."""
    for i, layer in enumerate(hf_layers(model)):
        if block_kind(layer) == "linear":
            mixer = getattr(layer, "linear_attn", None) or layer.mixer
            cache = DynamicCache(config=config)
            mixer(torch.zeros(1, 5, config.hidden_size, device="meta", dtype=torch.bfloat16), cache=cache)
            cached = cache.layers[i]
            return cached.conv_states[0], cached.recurrent_states[0]
    raise AssertionError("no linear layer")


class TestHybridZoo(unittest.TestCase):
    def test_params_per_component_equal_the_hf_meta_model(self):
        for name, module in ZOO.items():
            with self.subTest(name):
                _, model = hf_meta(name)
                self.assertEqual(planned_components(module.ARCHS[0], fixture(name)), hf_components(model))

    def test_per_rank_shards_at_tp_2_4_8(self):
        for name, module in ZOO.items():
            config, model = hf_meta(name)
            for tp in (2, 4, 8):
                with self.subTest(name, tp=tp):
                    expected = {}
                    for pname, p in hf_tensors(model):
                        c = component_of(pname, model)
                        expected[c] = expected.get(c, 0) + shard_numel(pname, tuple(p.shape), tp, config)
                    self.assertEqual(planned_components(module.ARCHS[0], fixture(name), tp), expected)

    def test_expert_parallel_ranks_hold_whole_experts(self):
        """--ep-size ep: a rank holds E / ep routed experts of I / (tp / ep) columns (the same element count as every
        expert's I / tp columns, so the expert tensors' shapes and counts are what is checked)."""
        for name in MOE_ZOO:
            _, model = hf_meta(name)
            for tp, ep in ((8, 1), (8, 8), (8, 2), (4, 4)):
                with self.subTest(name, tp=tp, ep=ep):
                    expected = {}
                    for pname, p in model.named_parameters():
                        if pname.endswith(("experts.gate_up_proj", "experts.up_proj")):  # [E, (2) I, H]
                            e, rows, h = p.shape
                            mats = 2 if pname.endswith("gate_up_proj") else 1  # Qwen's gate and up of each expert
                            key, n = (rows // mats // (tp // ep), h), mats * (e // ep)
                        elif pname.endswith("experts.down_proj"):  # [E, H, I]
                            e, h, i = p.shape
                            key, n = (h, i // (tp // ep)), e // ep
                        else:
                            continue
                        expected[key] = expected.get(key, 0) + n
                    planned = {}
                    for w in ZOO[name].ARCHS[0].weights(fixture(name), tp, ep):
                        if w.expert:
                            planned[w.shape] = planned.get(w.shape, 0) + w.count
                    self.assertEqual(planned, expected)

    def test_layer_kinds_and_kv_per_token(self):
        for name, module in ZOO.items():
            with self.subTest(name):
                _, model = hf_meta(name)
                s = module.ARCHS[0].shape(fixture(name))
                hf_kinds = tuple(k for k in map(block_kind, hf_layers(model)) if k)
                self.assertEqual(s.layer_kinds, hf_kinds)
                self.assertEqual(s.num_layers, len(hf_kinds))
                # K and V of every full layer's heads, bf16: from HF's k_proj / v_proj widths
                kv_hf = sum(2 * (layer.self_attn if hasattr(layer, "self_attn") else layer.mixer).k_proj.out_features
                            * 2 for layer in hf_layers(model) if block_kind(layer) == "full")
                self.assertEqual(2 * s.layer_kinds.count("full") * s.num_kv_heads * s.head_dim * s.dtype_bytes, kv_hf)
                # sparse layers: a decoder layer whose MLP (Qwen) or a following block (Nemotron-H "E") routes experts
                sparse, i = [], -1
                for layer in hf_layers(model):
                    i += bool(block_kind(layer))
                    ffn = getattr(layer, "mlp", None) or getattr(layer, "mixer", None)
                    if hasattr(ffn, "experts") and i not in sparse:
                        sparse.append(i)
                        self.assertEqual(s.num_experts, ffn.experts.down_proj.shape[0])
                self.assertEqual(s.sparse_layers, tuple(sparse))
        q = arch_qwen3_next.ARCHS[0].shape(fixture("qwen3-next-80b-a3b-instruct")).layer_kinds
        self.assertEqual((q.count("linear"), q.count("full")), (36, 12))  # the "36 of 48 layers"

    def test_state_bytes_per_request_equal_the_hf_cache(self):
        """Runtimes keep K - 1 conv columns (the inputs before the next token) where transformers' cache keeps K
        (it writes the new input first): the reference is HF's conv state less one column, in HF's dtypes."""
        for name, module in ZOO.items():
            config, model = hf_meta(name)
            conv, recurrent = hf_state_of_one_request(config, model)
            batch, channels, k = conv.shape
            self.assertEqual(batch, 1)
            states = module.ARCHS[0].shape(fixture(name)).state_tensors
            self.assertEqual({t.dtype for t in states if t.name.startswith("conv")}, {str(conv.dtype)[6:]})
            self.assertEqual({t.dtype for t in states if not t.name.startswith("conv")}, {str(recurrent.dtype)[6:]})
            for tp in (1, 2, 4, 8):
                with self.subTest(name, tp=tp):
                    heads = recurrent.shape[1]  # [1, heads, ., .]: split by heads
                    conv_ref = channels // tp * (k - 1) * conv.element_size()
                    recurrent_ref = recurrent.numel() // heads * (heads // tp) * recurrent.element_size()
                    self.assertEqual(sum(t.bytes_per_rank(tp) for t in states), conv_ref + recurrent_ref)
        qwen = fixture("qwen3-next-80b-a3b-instruct")
        per_layer = sum(t.bytes_per_rank(1) for t in arch_qwen3_next.state_tensors(qwen))
        self.assertEqual(per_layer, 8192 * 3 * 2 + 32 * 128 * 128 * 4)  # 2,146,304 B per request per linear layer

    def test_sglang_plan_json_prices_the_hf_state_per_slot(self):
        """`sglang plan --json` as a user runs it: no traceback, and its state per request slot == the linear layers
        of HF's model x the state HF's cache holds for one request (K - 1 conv columns), on one rank."""
        from sglang.cli.plan import main

        for name, tp in (("qwen3-next-80b-a3b-instruct", 4), ("nemotron-h-8b-base-8k", 1),
                         ("nemotron-3-nano-30b-a3b", 2)):
            config, model = hf_meta(name)
            conv, recurrent = hf_state_of_one_request(config, model)
            layers = sum(block_kind(layer) == "linear" for layer in hf_layers(model))
            per_layer = (conv.shape[1] // tp * (conv.shape[2] - 1) * conv.element_size()
                         + recurrent.numel() // tp * recurrent.element_size())
            out, err = io.StringIO(), io.StringIO()
            with self.subTest(name), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = main(["--model-path", os.path.join(FIXTURES, name), "--gpu", "h100-80gb", "--tp", str(tp),
                               "--json"])
                self.assertEqual(status, 0, err.getvalue())
                card = json.loads(out.getvalue())
                self.assertEqual(card["model_type"], ZOO[name].ARCHS[0].model_type)
                self.assertEqual(card["plan"]["state_bytes_per_slot"], layers * per_layer)

    def test_rotary_width_equals_the_hf_rotary_embedding(self):
        """Qwen3-Next's full-attention layers rotate a quarter of each 256-wide head (64); Nemotron-H has no RoPE
        (no rotary embedding in HF's model), so no table is priced."""
        for name in ZOO:
            _, model = hf_meta(name)
            widths = tuple(2 * b.shape[-1] for n, b in model.named_buffers()
                           if n.endswith("inv_freq") and "original" not in n)
            text = ZOO[name].ARCHS[0].shape(fixture(name))
            with self.subTest(name):
                self.assertEqual((text.rotary_dim,) * text.rope_tables if text.rotary_dim else (), widths)
        self.assertEqual(arch_qwen3_next.shape(fixture("qwen3-next-80b-a3b-instruct")).rotary_dim, 64)

    def test_linear_layer_projection_widths_in_the_activation_formula(self):
        """A linear layer's per-token projection width on one rank (its in-projections' outputs + out_proj's input)
        == HF's first linear layer's projection tensors split by the TP rules above, over hidden_size; the
        activation formula takes it where it is wider than attention's q/k/v + output (every model here)."""
        from dataclasses import replace

        from sglang.srt.mem_plan.model_shapes import model_shape_from_config

        projections = ("in_proj_qkvz", "in_proj_ba", "in_proj", "out_proj")
        for name, module in ZOO.items():
            config, model = hf_meta(name)
            layer = next(x for x in hf_layers(model) if block_kind(x) == "linear")
            mixer = getattr(layer, "linear_attn", None) or layer.mixer
            weights = [(f"model.layers.0.mixer.{n}", tuple(p.shape)) for n, p in mixer.named_parameters()
                       if n.split(".")[0] in projections and n.endswith("weight")]
            self.assertEqual(len(weights), 3 if hasattr(layer, "linear_attn") else 2)
            text = module.ARCHS[0].shape(fixture(name))
            for tp in (1, 2, 4, 8):
                with self.subTest(name, tp=tp):
                    want = sum(shard_numel(n, shape, tp, config) for n, shape in weights) // config.hidden_size
                    self.assertEqual(text.linear_width(tp), want)
            s = model_shape_from_config(fixture(name))
            attn = (2 * text.num_q_heads + 2 * text.num_kv_heads) * text.head_dim  # tp 1: q + k + v + output
            without = replace(s, text=replace(s.text, linear_widths=()))
            with self.subTest(name, formula=True):
                self.assertGreater(text.linear_width(1), attn)
                self.assertEqual(s.activation_bytes(2048) - without.activation_bytes(2048),
                                 2048 * (text.linear_width(1) - attn) * 2 * 2)  # bf16, the GPU factor 2
        self.assertEqual(arch_qwen3_next.shape(fixture("qwen3-next-80b-a3b-instruct")).linear_width(), 16_448)
        self.assertEqual(arch_mamba_hybrid.shape(fixture("nemotron-h-8b-base-8k")).linear_width(), 18_560 + 8_192)

    def test_refusals_name_what_is_missing(self):
        nemotron = fixture("nemotron-h-8b-base-8k")
        no_pattern = {k: v for k, v in nemotron.items() if k != "hybrid_override_pattern"}
        with self.assertRaisesRegex(ValueError, "hybrid_override_pattern"):
            arch_mamba_hybrid.ARCHS[0].weights(no_pattern, 1, 1)
        nano = fixture("nemotron-3-nano-30b-a3b")
        with self.assertRaisesRegex(ValueError, "moe_latent_size is set"):
            arch_mamba_hybrid.ARCHS[0].shape({**nano, "moe_latent_size": 1024})
        with self.assertRaisesRegex(ValueError, "no Mamba"):
            arch_mamba_hybrid.ARCHS[0].shape({**nano, "hybrid_override_pattern": "E-", "num_hidden_layers": 2})
        with self.assertRaisesRegex(ValueError, "num_hidden_layers 52 but the block pattern names 4"):
            arch_mamba_hybrid.ARCHS[0].shape({**nemotron, "hybrid_override_pattern": "M*M-"})
        qwen = {k: v for k, v in fixture("qwen3-next-80b-a3b-instruct").items() if k != "hidden_size"}
        with self.assertRaisesRegex(ValueError, "'hidden_size'"):
            arch_qwen3_next.ARCHS[0].weights(qwen, 1, 1)
        from sglang.srt.models.registry import MODEL_REGISTRY

        for name, module in ZOO.items():  # served exactly when a model implementation is registered
            self.assertEqual(module.ARCHS[0].served, fixture(name)["architectures"][0] in MODEL_REGISTRY, name)

    def test_served_linear_layers(self):
        """A served linear-attention / state-space family starts with its linear layers (the state pool holds them);
        linear layers on any other served architecture, or chunked ones beside them, keep the plan's note."""
        from sglang.srt.mem_plan.arch_registry import PLANNED_NOT_SERVED, not_served_note

        for name, module in ZOO.items():
            kinds = module.ARCHS[0].shape(fixture(name)).layer_kinds
            self.assertIn("linear", kinds)
            self.assertEqual(not_served_note(module.ARCHS[0].model_type, kinds), "", name)
        self.assertEqual(not_served_note("qwen3_next", ("linear", "full", "chunked")),
                         f"{PLANNED_NOT_SERVED}: qwen3_next with chunked layers")
        self.assertEqual(not_served_note("llama", ("full", "linear")),
                         f"{PLANNED_NOT_SERVED}: llama with linear layers")


if __name__ == "__main__":
    unittest.main()
