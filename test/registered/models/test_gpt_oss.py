"""GptOssForCausalLM on random fp32 checkpoints saved by transformers: alternating sliding (window 16 here) / full
layers, learned sinks, biased attention and experts, the clamped SwiGLU, YaRN. Greedy tokens equal HF transformers'
on a prompt 3x the window (prefilled whole and in chunks cutting the window edge), with the experts in the
checkpoint's float weights and in mxfp4 (quantized here into HF's *_blocks / *_scales layout, loaded by transformers
with dequantize=True and by us)."""

import json
import os
import tempfile
import unittest

import torch
from safetensors.torch import load_file, save_file

from sglang.srt.layers.moe.mxfp4 import dequantize_mxfp4
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.paged_forward import PagedForwardDriver

from test_mistral import load_served  # noqa: E402 (the same directory)

register_cpu_ci(est_time=25, suite="cpu")

WINDOW = 16
VOCAB = 512
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def make_gpt_oss(**overrides):
    """overrides: GptOssConfig fields (a tokenizer's vocab_size / eos_token_id)."""
    from transformers import GptOssConfig, GptOssForCausalLM

    rope = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
            "original_max_position_embeddings": 32, "rope_theta": 150000.0}  # positions past 32 use the scaled band
    fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                  sliding_window=WINDOW, max_position_embeddings=256, initializer_range=0.3, rope_parameters=rope,
                  tie_word_embeddings=False)
    cfg = GptOssConfig(**{**fields, **overrides})
    model = GptOssForCausalLM(cfg).float().eval()
    with torch.no_grad():  # HF initialises the expert biases to zero and the sinks small: make them matter
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj_bias.normal_(0, 0.3)
            layer.mlp.experts.down_proj_bias.normal_(0, 0.3)
            layer.self_attn.sinks.normal_(0, 1.0)
    return model


def quantize_mxfp4(w: torch.Tensor):
    """[..., rows, cols] -> (blocks uint8 [..., rows, cols/32, 16], scales uint8 [..., rows, cols/32]): each group
    of 32 scaled by the power of two that brings its largest magnitude to <= 6, values rounded to the nearest E2M1."""
    g = w.reshape(*w.shape[:-1], -1, 32)
    amax = g.abs().amax(-1, keepdim=True).clamp_min(2.0**-100)
    exp = torch.ceil(torch.log2(amax / 6.0))
    scaled = g / torch.exp2(exp)
    code = (scaled.abs().unsqueeze(-1) - E2M1).abs().argmin(-1) + 8 * (scaled < 0)
    code = code.to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks, (exp.squeeze(-1) + 127).to(torch.uint8)


def write_mxfp4_checkpoint(src: str, dst: str) -> None:
    """src's checkpoint with every layer's expert projections in HF's mxfp4 layout (biases stay float)."""
    os.makedirs(dst, exist_ok=True)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for name, t in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out[name + "_blocks"], out[name + "_scales"] = quantize_mxfp4(t.transpose(1, 2).contiguous())
        else:
            out[name] = t
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "mxfp4",
                                  "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)


class TestGptOss(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.hf = make_gpt_oss()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = os.path.join(cls.tmp.name, "bf")
        cls.hf.save_pretrained(cls.dir)
        cls.config, cls.model = load_served(cls.dir)
        gen = torch.Generator().manual_seed(1)
        cls.prompt = torch.randint(0, VOCAB, (3 * WINDOW,), generator=gen).tolist()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check_greedy(self, hf, config, model, new_tokens: int = 16):
        driver = PagedForwardDriver(model, config, max_reqs=4, max_tokens=1024)
        ours = driver.greedy(self.prompt, new_tokens)
        seq = self.prompt + ours
        with torch.no_grad():
            ref = hf(torch.tensor([seq])).logits[0]
        self.assertEqual(ref[len(self.prompt) - 1: -1].argmax(-1).tolist(), ours)
        return driver, seq, ref

    def test_layer_windows_and_sinks_from_the_checkpoint(self):
        attn = [layer.self_attn.attn for layer in self.model.model.layers]
        self.assertEqual([a.sliding_window_size for a in attn], [WINDOW, -1, WINDOW, -1])
        for ours, theirs in zip(attn, self.hf.model.layers):
            torch.testing.assert_close(ours.sinks, theirs.self_attn.sinks.float(), rtol=0, atol=0)
        names = [n for n, _ in self.model.named_parameters(remove_duplicate=False) if n.endswith("sinks")]
        self.assertEqual(len(names), 4)  # one parameter per layer, not one in the attention and one in the layer

    def test_windows_from_a_start_config_snapshot(self):
        """A warm start's models read an HFConfigSnapshot (no to_dict, no class attributes): the same windows."""
        from sglang.srt.configs.hf_config_snapshot import load_hf_config
        from sglang.srt.models.layer_windows import layer_windows

        with tempfile.TemporaryDirectory() as cache:
            self.assertIsNotNone(load_hf_config(self.dir, cache).to_dict())  # the first start: AutoConfig
            snapshot = load_hf_config(self.dir, cache)
        self.assertFalse(hasattr(snapshot, "to_dict"))
        self.assertEqual(layer_windows(snapshot, "gpt_oss"), (WINDOW, -1, WINDOW, -1))

    def test_greedy_equals_hf_past_the_window(self):
        driver, seq, ref = self.check_greedy(self.hf, self.config, self.model)
        row = driver.new_request()
        logits = driver.extend([row], [seq], logits_indices=torch.arange(len(seq)))
        torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)

    def test_chunked_prefill_across_the_window_edge(self):
        driver = PagedForwardDriver(self.model, self.config, max_reqs=2, max_tokens=512)
        row = driver.new_request()
        with torch.no_grad():
            ref = self.hf(torch.tensor([self.prompt])).logits[0]
        got = [driver.extend([row], [self.prompt[s: s + 11]], logits_indices=torch.arange(len(self.prompt[s: s + 11])))
               for s in range(0, len(self.prompt), 11)]
        torch.testing.assert_close(torch.cat(got), ref, atol=1e-4, rtol=1e-4)

    def test_bf16_agrees_with_fp32_as_well_as_hf_bf16(self):
        """The bf16 path (fp32 sinks beside bf16 scores, the CPU attention kernels where they load, bf16 experts in
        power-of-two row pieces) against the fp32 reference, beside transformers' own bf16 run of the same model (this
        random model is ill-conditioned in bf16: HF's own bf16 argmax agrees on ~80% of the positions)."""
        import copy

        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_loader import load_model

        config = ModelConfig.from_pretrained(self.dir, dtype="bfloat16")
        model = load_model(config)
        seq = self.prompt + self.prompt[:16]
        driver = PagedForwardDriver(model, config, max_reqs=2, max_tokens=512)
        ours = driver.extend([driver.new_request()], [seq], logits_indices=torch.arange(len(seq)))
        with torch.no_grad():
            ref = self.hf(torch.tensor([seq])).logits[0]
            hf_bf16 = copy.deepcopy(self.hf).to(torch.bfloat16)(torch.tensor([seq])).logits[0].float()
        agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
        hf_agree = (hf_bf16.argmax(-1) == ref.argmax(-1)).float().mean().item()
        self.assertGreaterEqual(agree, hf_agree - 0.1, (agree, hf_agree))
        self.assertLess((ours - ref).abs().max().item(), 2 * (hf_bf16 - ref).abs().max().item())

    def test_mxfp4_dequantizer_matches_transformers(self):
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors

        w = torch.randn(3, 8, 96, generator=torch.Generator().manual_seed(2)) * 0.1
        blocks, scales = quantize_mxfp4(w)
        theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, cols, rows]
        ours = dequantize_mxfp4(blocks, scales)
        torch.testing.assert_close(ours, theirs.transpose(1, 2), rtol=0, atol=0)
        # a quantization of w: a group's scale 2^s puts its largest magnitude in (3, 6] x 2^s, where the E2M1 grid's
        # widest gap (4 to 6) rounds by at most 2^s < amax / 3
        err = (ours - w).reshape(3, 8, -1, 32).abs().amax(-1)
        self.assertTrue(bool((err <= w.reshape(3, 8, -1, 32).abs().amax(-1) / 3).all()))

    def test_mxfp4_experts_equal_hf_dequantized(self):
        from transformers import GptOssForCausalLM, Mxfp4Config

        qdir = os.path.join(self.tmp.name, "mxfp4")
        write_mxfp4_checkpoint(self.dir, qdir)
        hf = GptOssForCausalLM.from_pretrained(qdir, quantization_config=Mxfp4Config(dequantize=True),
                                               dtype=torch.float32).eval()
        config, model = load_served(qdir)
        for ours, theirs in zip(model.model.layers, hf.model.layers):
            gate_up = theirs.mlp.experts.gate_up_proj.transpose(1, 2)  # [E, 2I, H], gate / up rows interleaved
            w13 = torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], dim=1)
            torch.testing.assert_close(ours.mlp.experts.w13_weight, w13, rtol=0, atol=0)
            torch.testing.assert_close(ours.mlp.experts.w2_weight, theirs.mlp.experts.down_proj.transpose(1, 2),
                                       rtol=0, atol=0)
        self.check_greedy(hf, config, model)


if __name__ == "__main__":
    unittest.main()
