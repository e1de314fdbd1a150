"""Quantized SmolLM2 against the dense bf16 path of the same weights: top-1 agreement, teacher-forced, 16 prompts.

A dense bf16 model decodes 16 prompts greedily in one batch. The quantized model then reads the same tokens
(teacher forcing: one divergence does not cascade): a prefill of the prompt and most of the run, then the last
tokens as batched decode steps of all 16 requests (the 9-64 row GEMM; prefill covers the large-M path).
Thresholds from the issue: Q4_1 >= 90%, Q8_0 and int8 >= 97%.
    Q4_1       the bundled file's blocks   vs  bf16 of the file's dequantized weights (the default start's model)
    Q8_0       the gguf package's Q8_0 blocks of those weights  vs  bf16 of the Q8_0 blocks dequantized
    w8a8_int8  8-bit blocks quantized at load from the bf16 checkpoint  vs  that bf16 checkpoint
"""

import unittest

import numpy as np
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader import load_model, resolve_model_path
from sglang.srt.model_loader.gguf_converter import QUANTIZED_LINEAR_SUFFIXES
from sglang.srt.model_loader.loader import build_model
from sglang.srt.model_loader.model_path import gguf_source_path
from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_transformers_utils import apply_chat_template, get_tokenizer
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.paged_forward import PagedForwardDriver

register_cpu_ci(est_time=30, suite="cpu")

PROMPTS = [
    "Tell me a joke about cats.", "Write a haiku about the ocean.", "List three uses of a paperclip.",
    "Explain photosynthesis in one sentence.", "What is 17 plus 25?", "Translate 'good morning' into Spanish.",
    "Give me a name for a pet turtle.", "Why is the sky blue?", "Write a short story about a robot who paints.",
    "Describe a sunset over the mountains.", "How do airplanes stay in the air?", "Summarize the water cycle.",
    "What should I cook for dinner tonight?", "Explain recursion to a child.", "Write a limerick about a frog.",
    "Give three tips for learning a new language.",
]
NEW_TOKENS = 64
DECODE_TAIL = 8  # the last tokens of each run go through batched decode steps


def q8_0_weights(model_dir, dense: bool):
    """The dense checkpoint with every linear weight turned into GGUF Q8_0 blocks by the gguf package: as staging
    blocks for the quantized model, or dequantized by the gguf package (dense=True) for its bf16 reference."""
    import gguf.quants as gq

    from sglang.srt.layers.quantization import packing

    for name, w in safetensors_weights_iterator(model_dir):
        if name.endswith(QUANTIZED_LINEAR_SUFFIXES):
            raw = gq.quantize(w.float().numpy(), packing.GGUF_Q8_0)
            if dense:
                yield name, torch.from_numpy(gq.dequantize(raw, packing.GGUF_Q8_0).reshape(w.shape).copy())
            else:
                yield name, packing.staging_from_gguf(torch.from_numpy(np.ascontiguousarray(raw)), packing.GGUF_Q8_0)
        else:
            yield name, w


def built(config, quantization: str, weights):
    from sglang.srt.layers.linear import prepack_dense_linear_weights

    model = build_model(config, "cpu", quantization)
    model.load_weights(weights)
    prepack_dense_linear_weights(model)  # as load_model does
    return model.eval()


class TestQuantQuality(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        args = ServerArgs()
        cls.model_dir = resolve_model_path(args)
        cls.gguf = gguf_source_path(args)
        cls.config = ModelConfig.from_pretrained(cls.model_dir, dtype="bfloat16")
        tok = get_tokenizer(cls.model_dir)
        cls.prompts = [apply_chat_template(tok, [{"role": "user", "content": p}], tokenize=True) for p in PROMPTS]
        cls.runs = cls.greedy_runs(load_model(cls.config, "cpu"))

    @classmethod
    def greedy_runs(cls, dense):
        driver = PagedForwardDriver(dense, cls.config, max_reqs=len(PROMPTS) + 1, max_tokens=4096)
        rows = [driver.new_request() for _ in PROMPTS]
        runs = [[int(t)] for t in (driver.extend([r], [p])[0].argmax() for r, p in zip(rows, cls.prompts))]
        for _ in range(NEW_TOKENS - 1):  # one batched decode step for all 16 requests
            logits = driver.extend(rows, [[run[-1]] for run in runs])
            for run, row_logits in zip(runs, logits):
                run.append(int(row_logits.argmax()))
        return runs

    def agreement(self, model, runs=None) -> float:
        runs = runs or self.runs
        driver = PagedForwardDriver(model, self.config, max_reqs=len(PROMPTS) + 1, max_tokens=4096)
        rows = [driver.new_request() for _ in PROMPTS]
        cut = NEW_TOKENS - DECODE_TAIL
        top1 = []
        for row, ids, run in zip(rows, self.prompts, runs):
            positions = torch.arange(len(ids) - 1, len(ids) + cut - 1)
            top1.append(driver.extend([row], [ids + run[: cut - 1]], logits_indices=positions).argmax(-1).tolist())
        for step in range(cut - 1, NEW_TOKENS - 1):
            logits = driver.extend(rows, [[run[step]] for run in runs])
            for t, row_logits in zip(top1, logits):
                t.append(int(row_logits.argmax()))
        agree = sum(a == b for t, run in zip(top1, runs) for a, b in zip(t, run))
        return agree / (len(PROMPTS) * NEW_TOKENS)

    def test_q4_1_blocks_of_the_bundled_file(self):
        model = load_model(self.config, "cpu", "gguf", self.gguf)
        # the linear layers' Q4_1 blocks, and the tied embedding / lm_head table's Q8_0 blocks (test_quant_lm_head.py)
        bits = {name: m.quant_bits for name, m in model.named_modules() if getattr(m, "quant_method", None)}
        self.assertEqual(bits.pop("model.embed_tokens"), 8)
        self.assertTrue(bits and all(b == 4 for b in bits.values()))
        rate = self.agreement(model)
        print(f"Q4_1 vs bf16 top-1 agreement: {rate:.3f}")
        self.assertGreaterEqual(rate, 0.90)

    def test_q8_0_blocks(self):
        runs = self.greedy_runs(built(self.config, "none", q8_0_weights(self.model_dir, dense=True)))
        model = built(self.config, "gguf", q8_0_weights(self.model_dir, dense=False))
        self.assertTrue(all(m.quant_bits == 8 for m in model.modules() if getattr(m, "quant_method", None)))
        rate = self.agreement(model, runs)
        print(f"Q8_0 vs bf16 top-1 agreement: {rate:.3f}")
        self.assertGreaterEqual(rate, 0.97)

    def test_int8_weight_only(self):
        rate = self.agreement(load_model(self.config, "cpu", "w8a8_int8"))
        print(f"w8a8_int8 vs bf16 top-1 agreement: {rate:.3f}")
        # measured 0.976 (0.966 with a symmetric scale max|w| / 127 per block). The checkpoint is the bundled Q4_1
        # file dequantized to fp32, so its 32-blocks sit on 16 levels that the fitted step and offset nearly
        # reproduce (0.05% weight error, below the reference's own bf16 rounding of 0.1%); on continuous weights
        # (the same file plus one Q4_1 step of uniform noise) the fit cuts the weight error by 19% but measured
        # 0.955 against the symmetric 0.957: there this measure's noise (about 0.5 points) hides the difference
        self.assertGreaterEqual(rate, 0.97)


if __name__ == "__main__":
    unittest.main()
