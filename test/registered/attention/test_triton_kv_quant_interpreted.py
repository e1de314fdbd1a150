"""The Triton decode and extend kernels reading a quantized KV pool in place (fp8_e4m3, fp8_e5m2 with per-(layer,
head) scales; int8 per token; int4 and int2_hadamard with their rotation), under the Triton interpreter on CPU,
against a float64 attention over the cached tokens' dequantized K/V (QuantizedKVPool.gather_kv, unrotated, so the
host's turn of the query, of the fresh K/V and of the output is checked too) and the new tokens' K/V exactly as
written (a forward attends its own new tokens as computed: an extend's, a decode's current token -- though the pool
holds their codes too): GQA, ragged lengths (a one-token decode), page sizes 1 and 16, extend with and without a
cached prefix, fp32 and fp16 queries, the interpreter and GPU tile sets. A pool whose V scales are 1.5x off (fp8: the
per-head scale; int8 / int4: the per-token scale; int2_hadamard: its log-scale byte, 2x) is far outside the
tolerance, and so is a reference that reads the new tokens through their codes (a kernel reading them back from the
pool fails). The formats with a recent window (int4, int2_hadamard, fp8) again with a ring: each request's last w
cached tokens (none, all, a full wrapping ring, a partial one) read from the ring's bf16 rows in the stored basis,
every other ring entry noise (no sink entries: the kernels' SINKS=0 path); a reference reading those tokens through
their codes is far off. And with attention sinks (S = kv_quant.SINK_TOKENS entries per ring row after the W recent
ones): each request's first s cached tokens read from its sink entries (all S valid, some (2), none, a request with
fewer cached tokens than S: all of them sinks), mixed with the recent window (sinks and ring meeting: no codes read;
codes between them, in one or two decode splits with the GPU tiles), the reference built from the written K/V (sink
rows for [0, s), ring rows for [P - w, P)); a reference reading the sinks through their codes is far off (a kernel
ignoring the sinks fails), and a NaN (a decode merge reading a split its split kernel skipped) counts as inf. Cases:
kv_quant_triton_cases.py; child process: interpreted_run.py (it sets TRITON_INTERPRET=1), so plain `python -m pytest
test/registered/attention/test_triton_kv_quant_interpreted.py` runs it."""

import unittest

import torch
from interpreted_run import run_in_interpreter
from kv_quant_triton_cases import FORMATS, QUANT_TOL, WINDOW_FORMATS

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="cpu")

DTYPES = {str(d): d for d in QUANT_TOL}


class TestTritonKVQuantInterpreted(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.errors = run_in_interpreter("kv_quant_kernels")

    def test_every_format_within_tolerance(self):
        cases = {k: v for k, v in self.errors.items() if k.split("|")[0] in ("decode", "extend")}
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

    def assert_window_family_within_tolerance(self, family):
        """Every case of a windowed family ('ring', 'sinks'): 2 kinds x 2 dtypes x 2 page sizes + the GPU tiles."""
        cases = {k: v for k, v in self.errors.items() if k.startswith(family + "|")}
        self.assertEqual(len(cases), len(WINDOW_FORMATS) * (2 * 2 * 2 + 2))
        for key, err in cases.items():
            _, kind, tiles, dtype, page_size, fmt = key.split("|")
            with self.subTest(family=family, kind=kind, tiles=tiles, dtype=dtype, page_size=page_size, fmt=fmt):
                self.assertLessEqual(err, QUANT_TOL[DTYPES[dtype]], f"{key}: max abs error {err:.3g}")

    def test_ring_within_tolerance(self):
        self.assert_window_family_within_tolerance("ring")

    def test_sinks_within_tolerance(self):
        self.assert_window_family_within_tolerance("sinks")

    def test_sink_tokens_are_not_read_from_codes(self):
        """Far from an attention that reads the sinks through their codes (the ring's recent rows still read): a kernel
        ignoring the sinks, reading codes from position 0, fails."""
        for fmt in WINDOW_FORMATS:
            for kind in ("decode", "extend"):
                with self.subTest(fmt=fmt, kind=kind):
                    self.assertGreater(self.errors[f"sink_codes_reference|{kind}|{fmt}"], 20 * QUANT_TOL[torch.float32])

    def test_ring_tokens_are_not_read_from_codes(self):
        """Far from an attention that reads the ring's tokens through their codes: a kernel ignoring the ring fails."""
        for fmt in WINDOW_FORMATS:
            for kind in ("decode", "extend"):
                with self.subTest(fmt=fmt, kind=kind):
                    self.assertGreater(self.errors[f"ring_codes_reference|{kind}|{fmt}"], 20 * QUANT_TOL[torch.float32])

    def test_a_wrong_scale_fails(self):
        for fmt in FORMATS:
            for kind in ("decode", "extend"):
                with self.subTest(fmt=fmt, kind=kind):
                    self.assertGreater(self.errors[f"sensitivity|{kind}|{fmt}"], 5e-2)

    def test_new_tokens_are_not_read_from_codes(self):
        """The kernels' output is far from an attention that reads the forward's new tokens through their codes, so a
        kernel doing that would be far from the reference above (the codes' error is >> the fp32 tolerance)."""
        for fmt in FORMATS:
            for kind in ("decode", "extend"):
                with self.subTest(fmt=fmt, kind=kind):
                    self.assertGreater(self.errors[f"codes_reference|{kind}|{fmt}"], 20 * QUANT_TOL[torch.float32])


if __name__ == "__main__":
    unittest.main()
