"""MistralForCausalLM (a sliding window on every layer) on a random fp32 checkpoint saved by transformers: greedy
tokens equal HF transformers' on a prompt 3x the window, prefilled whole and in chunks that cut the window edge."""

import tempfile
import unittest

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader import load_model
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.paged_forward import PagedForwardDriver

register_cpu_ci(est_time=10, suite="cpu")

WINDOW = 16
VOCAB = 512


def load_served(path: str):
    """ModelConfig + model (fp32) of a saved checkpoint."""
    config = ModelConfig.from_pretrained(path, dtype="float32")
    return config, load_model(config)


def make_mistral(sliding_window):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                        sliding_window=sliding_window, initializer_range=0.3, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return MistralForCausalLM(cfg)


class TestMistral(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.hf = make_mistral(WINDOW).float().eval()
        with tempfile.TemporaryDirectory() as tmp:
            cls.hf.save_pretrained(tmp)
            cls.config, cls.model = load_served(tmp)
        gen = torch.Generator().manual_seed(1)
        cls.prompt = torch.randint(0, VOCAB, (3 * WINDOW,), generator=gen).tolist()

    def reference(self, seq):
        with torch.no_grad():
            return self.hf(torch.tensor([seq])).logits[0]

    def test_window_from_the_planner_shape(self):
        windows = [layer.self_attn.attn.sliding_window_size for layer in self.model.model.layers]
        self.assertEqual(windows, [WINDOW] * 3)

    def test_greedy_equals_hf_past_the_window(self):
        driver = PagedForwardDriver(self.model, self.config, max_reqs=4, max_tokens=1024)
        ours = driver.greedy(self.prompt, 24)
        ref = self.reference(self.prompt + ours)
        self.assertEqual(ref[len(self.prompt) - 1: -1].argmax(-1).tolist(), ours)
        # every position's logits, one extend over the whole sequence
        seq = self.prompt + ours
        row = driver.new_request()
        logits = driver.extend([row], [seq], logits_indices=torch.arange(len(seq)))
        torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)

    def test_chunked_prefill_across_the_window_edge(self):
        driver = PagedForwardDriver(self.model, self.config, max_reqs=4, max_tokens=1024)
        row = driver.new_request()
        ref = self.reference(self.prompt)
        got = []
        for start in range(0, len(self.prompt), 11):  # 11-token chunks: every window edge falls inside a chunk
            chunk = self.prompt[start: start + 11]
            got.append(driver.extend([row], [chunk], logits_indices=torch.arange(len(chunk))))
        torch.testing.assert_close(torch.cat(got), ref, atol=1e-4, rtol=1e-4)

    def test_null_window_is_full_attention(self):
        torch.manual_seed(0)
        hf = make_mistral(None).float().eval()
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(tmp)
            config, model = load_served(tmp)
        self.assertEqual({layer.self_attn.attn.sliding_window_size for layer in model.model.layers}, {-1})
        driver = PagedForwardDriver(model, config, max_reqs=2, max_tokens=512)
        ours = driver.greedy(self.prompt, 8)
        with torch.no_grad():
            ref = hf(torch.tensor([self.prompt + ours])).logits[0]
        self.assertEqual(ref[len(self.prompt) - 1: -1].argmax(-1).tolist(), ours)


if __name__ == "__main__":
    unittest.main()
