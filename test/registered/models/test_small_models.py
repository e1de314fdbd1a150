"""Small random-weight Qwen3, Qwen2 and Llama (llama3 rope scaling) checkpoints saved by transformers, loaded by
our loader: fp32 logits equal HF's within tolerance and greedy continuations are identical."""

import tempfile
import unittest

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader import load_model
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.paged_forward import PagedForwardDriver

register_cpu_ci(est_time=15, suite="cpu")

COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    # large init so the logits are peaked: greedy then has clear winners instead of fp32 near-ties
    initializer_range=0.3,
)


def make_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    return Qwen3ForCausalLM(cfg)


def make_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**COMMON, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # HF initialises biases to zero; make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.3)
    return model


def make_llama3():
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,  # positions beyond it exercise the scaled band
    }
    cfg = LlamaConfig(**COMMON, tie_word_embeddings=False, rope_parameters=rope)
    return LlamaForCausalLM(cfg)


class TestSmallModels(unittest.TestCase):
    def check(self, make_model):
        torch.manual_seed(0)
        hf = make_model().float().eval()
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(tmp)
            config = ModelConfig.from_pretrained(tmp, dtype="float32")
            model = load_model(config)
        gen = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, COMMON["vocab_size"], (40,), generator=gen).tolist()

        driver = PagedForwardDriver(model, config, max_reqs=4, max_tokens=1024)
        ours = driver.greedy(prompt, 48)  # reaches position 87, past original_max_position_embeddings
        seq = prompt + ours
        with torch.no_grad():
            ref = hf(torch.tensor([seq])).logits[0]
        self.assertEqual(ref[len(prompt) - 1 : -1].argmax(-1).tolist(), ours)
        row = driver.new_request()
        logits = driver.extend([row], [seq], logits_indices=torch.arange(len(seq)))
        torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
        return (logits - ref).abs().max().item()

    def test_qwen3(self):
        print(f"qwen3 max diff {self.check(make_qwen3):.1e}")

    def test_qwen2_bias_tied(self):
        print(f"qwen2 max diff {self.check(make_qwen2):.1e}")

    def test_llama3_rope_scaling(self):
        print(f"llama3 max diff {self.check(make_llama3):.1e}")


if __name__ == "__main__":
    unittest.main()
