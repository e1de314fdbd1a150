"""GGUF -> HF conversion of the bundled SmolLM2: exact weights, tokenizer, chat template, atomic one-time cache."""

import os
import tempfile
import time
import unittest

import numpy as np
import torch
from safetensors import safe_open

from sglang.srt.model_loader.model_path import default_model_path, ensure_converted_gguf
from sglang.srt.utils.hf_transformers_utils import apply_chat_template, get_tokenizer
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=25, suite="cpu")


def dequant_q8_0(raw: np.ndarray) -> np.ndarray:
    # block of 32: fp16 scale d, 32 x int8 q; x = d * q
    blocks = raw.reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


def dequant_q4_1(raw: np.ndarray) -> np.ndarray:
    # block of 32: fp16 scale d, fp16 min m, 16 bytes; low nibbles are elements 0..15, high nibbles 16..31
    blocks = raw.reshape(-1, 20)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    return (d * q + m).reshape(-1)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert script: HF rows -> interleaved rope rows (the inverse of what we undo)."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


class TestGGUFConversion(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.gguf_path = default_model_path()
        start = time.perf_counter()
        cls.model_dir = ensure_converted_gguf(cls.gguf_path, cls.tmp.name)
        cls.convert_sec = time.perf_counter() - start

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_cache_is_complete_and_reused(self):
        files = set(os.listdir(self.model_dir))
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
            self.assertIn(name, files)
        self.assertEqual([d for d in os.listdir(self.tmp.name) if d.startswith(".tmp")], [])
        start = time.perf_counter()
        self.assertEqual(ensure_converted_gguf(self.gguf_path, self.tmp.name), self.model_dir)
        self.assertLess(time.perf_counter() - start, 0.5)
        print(f"conversion {self.convert_sec:.1f} s, cached lookup {time.perf_counter() - start:.3f} s")

    def test_weights_equal_independent_dequantization(self):
        import gguf

        reader = gguf.GGUFReader(self.gguf_path)
        by_name = {t.name: t for t in reader.tensors}
        checked = 0
        with safe_open(os.path.join(self.model_dir, "model.safetensors"), "pt") as f:
            self.assertEqual(len(list(f.keys())), len(by_name))
            for gguf_name, hf_name, n_head in [
                ("token_embd.weight", "model.embed_tokens.weight", None),
                ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 9),
                ("blk.7.attn_k.weight", "model.layers.7.self_attn.k_proj.weight", 3),
                ("blk.29.attn_v.weight", "model.layers.29.self_attn.v_proj.weight", None),
                ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight", None),
                ("blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight", None),
                ("output_norm.weight", "model.norm.weight", None),
            ]:
                t = by_name[gguf_name]
                raw = np.asarray(t.data)
                kind = t.tensor_type.name
                if kind == "Q8_0":
                    ref = dequant_q8_0(raw.view(np.uint8))
                elif kind == "Q4_1":
                    ref = dequant_q4_1(raw.view(np.uint8))
                else:
                    ref = raw.astype(np.float32).reshape(-1)
                ref = ref.reshape(tuple(reversed([int(d) for d in t.shape])))
                ours = f.get_tensor(hf_name)
                self.assertEqual(ours.dtype, torch.float32)
                ours = ours.numpy()
                if n_head is not None:
                    ours = llama_cpp_permute(ours, n_head)
                np.testing.assert_array_equal(ours, ref, err_msg=hf_name)
                checked += 1
        self.assertEqual(checked, 7)

    @unittest.skipUnless(__import__("importlib").util.find_spec("accelerate"), "transformers' GGUF loader needs accelerate")
    def test_weights_equal_transformers_gguf_loader(self):
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(self.gguf_path), gguf_file=os.path.basename(self.gguf_path), dtype=torch.float32
        )
        ref = hf.state_dict()
        with safe_open(os.path.join(self.model_dir, "model.safetensors"), "pt") as f:
            for name in f.keys():
                self.assertTrue(torch.equal(f.get_tensor(name), ref[name]), name)

    def test_tokenizer_round_trip_and_chat_template(self):
        tok = get_tokenizer(self.model_dir)
        for text in ["Hello world, how are you?", "In 2024, 12345 people", "naïve café — 日本語 🙂", "  spaces\n\n\ttabs"]:
            ids = tok.encode(text, add_special_tokens=False)
            self.assertEqual(tok.decode(ids), text)
        self.assertEqual(tok.encode("Hello world", add_special_tokens=False), [19556, 905])
        self.assertEqual(tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]), [1, 2])
        self.assertEqual(tok.eos_token, "<|im_end|>")
        text = apply_chat_template(tok, [{"role": "user", "content": "Hi there"}])
        self.assertIn("<|im_start|>user\nHi there<|im_end|>\n", text)
        self.assertTrue(text.endswith("<|im_start|>assistant\n"))
        ids = apply_chat_template(tok, [{"role": "user", "content": "Hi there"}], tokenize=True)
        self.assertEqual(ids[0], 1)
        self.assertEqual(tok.decode(ids), text)


if __name__ == "__main__":
    unittest.main()
