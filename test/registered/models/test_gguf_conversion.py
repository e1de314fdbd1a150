"""GGUF -> HF conversion of the bundled SmolLM2: exact weights, tokenizer, chat template, atomic one-time cache; the
linear shard written only when a caller reads it (a --quantization gguf start does not), then the same checkpoint."""

import json

import os
import tempfile
import time
import unittest

import numpy as np
import torch
from safetensors import safe_open

from sglang.srt.model_loader.gguf_converter import DENSE_SHARD, GGUF_SOURCE_FILE, LINEAR_SHARD, SHARD_INDEX
from sglang.srt.model_loader.model_path import default_model_path, ensure_converted_gguf, ensure_dense_linears
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


def shard_tensors(model_dir: str) -> dict:
    """name -> tensor of every shard the directory's index lists (read with safetensors, not the project's loader)."""
    with open(os.path.join(model_dir, SHARD_INDEX)) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for shard in sorted(set(weight_map.values())):
        with safe_open(os.path.join(model_dir, shard), "pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    assert sorted(out) == sorted(weight_map), "the index and the shards disagree"
    return out


class TestGGUFConversion(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.gguf_path = default_model_path()
        start = time.perf_counter()
        cls.model_dir = ensure_converted_gguf(cls.gguf_path, cls.tmp.name)
        cls.convert_sec = time.perf_counter() - start
        cls.tensors = shard_tensors(cls.model_dir)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_cache_is_complete_and_reused(self):
        files = set(os.listdir(self.model_dir))
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", DENSE_SHARD,
                     LINEAR_SHARD, SHARD_INDEX, GGUF_SOURCE_FILE):
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
        self.assertEqual(len(self.tensors), len(by_name))
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
            ours = self.tensors[hf_name]
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
        for name, tensor in self.tensors.items():
            self.assertTrue(torch.equal(tensor, ref[name]), name)

    def test_transformers_loads_the_sharded_checkpoint(self):
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        state = hf.state_dict()
        for name in ("model.layers.3.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight",
                     "model.norm.weight", "model.embed_tokens.weight"):
            self.assertTrue(torch.equal(state[name], self.tensors[name]), name)

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


class TestLinearShardOnDemand(unittest.TestCase):
    """dense_linears=False (the runner's --quantization gguf start): no float32 linear layers until asked for."""

    def test_partial_then_completed_equals_full_conversion(self):
        gguf_path = default_model_path()
        with tempfile.TemporaryDirectory() as full_root, tempfile.TemporaryDirectory() as root:
            full = shard_tensors(ensure_converted_gguf(gguf_path, full_root))
            model_dir = ensure_converted_gguf(gguf_path, root, dense_linears=False)
            files = set(os.listdir(model_dir))
            self.assertIn(DENSE_SHARD, files)
            self.assertNotIn(LINEAR_SHARD, files)
            self.assertNotIn(SHARD_INDEX, files)  # without the index transformers refuses the directory: not a checkpoint
            with safe_open(os.path.join(model_dir, DENSE_SHARD), "pt") as f:
                dense = sorted(f.keys())
            # every tensor but the 7 linear layers of each of the 30 layers: 30 x 2 norms, the final norm, the embedding
            self.assertEqual(len(dense), 30 * 2 + 2)
            self.assertFalse(any(n.endswith(("_proj.weight")) for n in dense))
            ensure_dense_linears(model_dir)
            done = shard_tensors(model_dir)
            self.assertEqual(sorted(done), sorted(full))
            for name, tensor in full.items():
                self.assertTrue(torch.equal(done[name], tensor), name)
            stamp = os.stat(os.path.join(model_dir, LINEAR_SHARD)).st_mtime_ns
            ensure_dense_linears(model_dir)  # complete: nothing written again
            self.assertEqual(os.stat(os.path.join(model_dir, LINEAR_SHARD)).st_mtime_ns, stamp)
            self.assertEqual([d for d in os.listdir(model_dir) if ".tmp" in d], [])

    def test_changed_source_is_refused(self):
        with tempfile.TemporaryDirectory() as root:
            src = os.path.join(root, "copy.gguf")
            with open(default_model_path(), "rb") as fin, open(src, "wb") as fout:
                fout.write(fin.read())
            model_dir = ensure_converted_gguf(src, os.path.join(root, "cache"), dense_linears=False)
            with open(src, "ab") as f:
                f.write(b"\0")
            with self.assertRaisesRegex(FileNotFoundError, "gone or has changed"):
                ensure_dense_linears(model_dir)
            self.assertFalse(os.path.exists(os.path.join(model_dir, LINEAR_SHARD)))


if __name__ == "__main__":
    unittest.main()
