"""Gemma 3 (text) on a random fp32 checkpoint saved by transformers' Gemma3ForCausalLM: greedy tokens and logits of
our model over the paged KV pool equal HF's, on prompts 3x the sliding window (local layers masked, global layers
not), with local and global RoPE bases that differ and q/k/layer norms whose weights are not zero."""

import tempfile
import unittest

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader import load_model
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.paged_forward import PagedForwardDriver

register_cpu_ci(est_time=30, suite="cpu")

WINDOW = 16


def load_served(path: str):
    """ModelConfig + model of a saved checkpoint, resolved as a start resolves it."""
    config = ModelConfig.from_pretrained(path, dtype="float32")
    return config, load_model(config)


def make_gemma3(**overrides):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, max_position_embeddings=256, sliding_window=WINDOW,
               layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
               rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                                "full_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}},
               query_pre_attn_scalar=24, initializer_range=0.3, attn_implementation="eager")
    cfg.update(overrides)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**cfg))
    with torch.no_grad():  # HF initialises the norm weights to zero (scale 1); make (1 + w) matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.5)
    return model


class TestGemma3(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.hf = make_gemma3().float().eval()
        with tempfile.TemporaryDirectory() as tmp:
            cls.hf.save_pretrained(tmp)
            cls.config, cls.model = load_served(tmp)
        gen = torch.Generator().manual_seed(1)
        cls.prompt = torch.randint(0, 512, (3 * WINDOW,), generator=gen).tolist()

    def reference(self, seq):
        with torch.no_grad():
            return self.hf(torch.tensor([seq])).logits[0]

    def test_layers_take_the_planner_windows(self):
        windows = [layer.self_attn.attn.sliding_window_size for layer in self.model.model.layers]
        self.assertEqual(windows, [WINDOW, -1, WINDOW, WINDOW])
        self.assertEqual(self.config.shape.text.layer_kinds, ("sliding", "full", "sliding", "sliding"))

    def test_greedy_and_logits_match_hf_past_the_window(self):
        driver = PagedForwardDriver(self.model, self.config, max_reqs=4, max_tokens=1024)
        ours = driver.greedy(self.prompt, 24)
        seq = self.prompt + ours
        ref = self.reference(seq)
        self.assertEqual(ref[len(self.prompt) - 1:-1].argmax(-1).tolist(), ours)
        row = driver.new_request()
        logits = driver.extend([row], [seq], logits_indices=torch.arange(len(seq)))
        torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)

    def test_chunked_prefill_across_the_window_edge(self):
        driver = PagedForwardDriver(self.model, self.config, max_reqs=4, max_tokens=1024)
        row = driver.new_request()
        got = []
        for start in range(0, len(self.prompt), 11):  # 11-token chunks: window edges fall inside chunks
            chunk = self.prompt[start:start + 11]
            got.append(driver.extend([row], [chunk], logits_indices=torch.arange(len(chunk))))
        torch.testing.assert_close(torch.cat(got), self.reference(self.prompt), atol=1e-4, rtol=1e-4)


if __name__ == "__main__":
    unittest.main()
