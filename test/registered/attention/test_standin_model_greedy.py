"""A small random-weight Llama (bf16, GQA) decodes the same greedy tokens with the flashinfer and aiter backends
as with torch_native, on CPU through the stand-in libraries (sglang.test.attention_standins).

Checks wiring, not the libraries' numerics: the whole model's forward goes through each backend's metadata and
per-layer calls (prefill, decode, a batched extend over cached prefixes), so a page table that drifts over steps or a
pool view that mixes layers changes the tokens."""

import tempfile
import unittest

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.attention.attention_registry import create_attention_backend
from sglang.srt.mem_plan.backends import AttentionShape, BackendInputs
from sglang.srt.model_loader import load_model
from sglang.test.attention_standins import install, make_aiter, make_flashinfer
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.paged_forward import PagedForwardDriver

register_cpu_ci(est_time=10, suite="cpu")

NUM_REQS = 4
BF16_ULPS = 4  # bf16 rounding differences of attention outputs, carried through 3 layers to the logits


def make_llama_dir(tmp: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                      initializer_range=0.3, tie_word_embeddings=False)  # peaked logits: clear greedy winners
    LlamaForCausalLM(cfg).save_pretrained(tmp)


class TestStandinModelGreedy(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with tempfile.TemporaryDirectory() as tmp:
            make_llama_dir(tmp)
            cls.config = ModelConfig.from_pretrained(tmp, dtype="bfloat16")
            cls.model = load_model(cls.config)
        gen = torch.Generator().manual_seed(1)
        cls.prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (23, 40)]

    def driver(self, backend: str) -> PagedForwardDriver:
        d = PagedForwardDriver(self.model, self.config, max_reqs=NUM_REQS, max_tokens=1024)
        if backend != "torch_native":
            c = self.config
            shape = AttentionShape(c.num_attention_heads, c.head_dim, c.context_len, num_kv_heads=c.num_key_value_heads)
            d.attn_backend = create_attention_backend(backend, model_config=c, req_to_token_pool=d.req_to_token_pool,
                                                      token_to_kv_pool=d.kv_pool, device="cpu",
                                                      inputs=BackendInputs(shape, NUM_REQS))
        return d

    def outputs(self, backend: str):
        d = self.driver(backend)
        tokens = [d.greedy(p, 16) for p in self.prompts]
        rows = [d.new_request(), d.new_request()]
        d.extend(rows, [self.prompts[0], self.prompts[1][:9]])
        logits = d.extend(rows, [[5, 6, 7], self.prompts[1][9:]])  # both over cached prefixes, mixed lengths
        return tokens, logits

    def test_same_tokens_as_torch_native(self):
        want_tokens, want_logits = self.outputs("torch_native")
        for name, make in (("flashinfer", make_flashinfer), ("aiter", make_aiter)):
            with self.subTest(backend=name), install(make()) as lib:
                tokens, logits = self.outputs(name)
                self.assertEqual(tokens, want_tokens)
                tol = BF16_ULPS * 2**-7 * float(want_logits.abs().max())  # measured: 2.5 ulps
                self.assertLess(float((logits - want_logits).abs().max()), tol)
                self.assertGreater(len(lib.calls), 0)


if __name__ == "__main__":
    unittest.main()
