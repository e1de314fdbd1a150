"""The Triton decode and extend kernels reading a quantized KV pool in place (fp8_e4m3, fp8_e5m2 with per-(layer,
head) scales; int8 per token; int4 and int2_hadamard with their rotation), under the Triton interpreter on CPU,
against a float64 attention over the pool's own dequantized K/V (QuantizedKVPool.gather_kv, unrotated, so the host's
turn of the query and of the output is checked too): GQA, ragged lengths, page sizes 1 and 16, extend with and
without a cached prefix (a request with one reads its new tokens back from the pool, as torch_native does), fp32
and fp16 queries, the interpreter and GPU tile sets. A pool whose V scales are 1.5x off (fp8: the per-head scale;
int8 / int4: the per-token scale; int2_hadamard: its log-scale byte, 2x) is far outside the tolerance. Cases:
kv_quant_triton_cases.py; child process: interpreted_run.py."""

import unittest

import torch
from interpreted_run import run_in_interpreter
from kv_quant_triton_cases import FORMATS, QUANT_TOL

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=45, suite="cpu")

DTYPES = {str(d): d for d in QUANT_TOL}


class TestTritonKVQuantInterpreted(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.errors = run_in_interpreter("kv_quant_kernels")

    def test_every_format_within_tolerance(self):
        cases = {k: v for k, v in self.errors.items() if not k.startswith("sensitivity")}
        # per format: 2 dtypes x 2 page sizes x (decode, extend) + the GPU tiles' decode and extend
        self.assertEqual(len(cases), len(FORMATS) * (2 * 2 * 2 + 2))
        for key, err in cases.items():
            kind, tiles, dtype, page_size, fmt = key.split("|")
            with self.subTest(kind=kind, tiles=tiles, dtype=dtype, page_size=page_size, fmt=fmt):
                self.assertLessEqual(err, QUANT_TOL[DTYPES[dtype]], f"{key}: max abs error {err:.3g}")
        for fmt in FORMATS:
            print("%-14s max abs error fp32 %.2e, fp16 %.2e" % (
                fmt, max(v for k, v in cases.items() if k.endswith(fmt) and "float32" in k),
                max(v for k, v in cases.items() if k.endswith(fmt) and "float16" in k)))

    def test_a_wrong_scale_fails(self):
        for fmt in FORMATS:
            for kind in ("decode", "extend"):
                with self.subTest(fmt=fmt, kind=kind):
                    self.assertGreater(self.errors[f"sensitivity|{kind}|{fmt}"], 5e-2)


if __name__ == "__main__":
    unittest.main()
