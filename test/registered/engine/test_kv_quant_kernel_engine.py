"""The CPU attention kernel over quantized KV codes (extend_attention_quant) through sglang.Engine, the default model:
for --kv-cache-dtype int8, int4, int2_hadamard, fp8_e4m3 and fp8_e5m2 the torch_native backend really takes the
kernels (a prefill without a cached prefix attends to its fresh K/V through extend_attention, as the torch path does;
every decode step reads the cached tokens' codes through extend_attention_quant and the new token's own K/V as
computed, as the torch path does), and its greedy tokens follow those of the torch gather path (the pool's own
dequantization rounded to bf16 + SDPA) on the same engine, pool and weights. The two read the same codes and differ
only in rounding (the kernel keeps the dequantized values in fp32, the gather path rounds them to bf16), so every
prompt's first 8 tokens must be equal (the tolerance of test_kv_quant_engine.py against bf16 KV; measured: the first
10 of 16 or more, later near-ties flip either way; int4, whose 4-bit rows leave more near-ties: 3); a wrong scale,
code conversion or turn breaks them at once. int2_hadamard's 2-bit / ternary rows leave near-ties everywhere, so its
tokens are compared up to the first that differs, which must be a tie to the logits' bf16 resolution in both runs
(TIE_TOLERANCE). The radix cache is off so that both runs prefill from scratch. At level avx512_vnni (no BF16:
--dtype auto serves fp32, and the kernel reads the codes with fp32 queries) test_kv_quant_kernel_levels.py runs this
file too. (The kernel against an fp64
reference: test/registered/jit_kernel/test_cpu_quant_attention.py.)
"""

import unittest

import torch

from sglang import Engine
from sglang.jit_kernel.cpu_ops import kv_quant_kernels_expected
from sglang.srt.mem_plan.backends import declare
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, shutdown

register_cpu_ci(est_time=150, suite="cpu")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "Once upon a time, in a small village,"]
NEW_TOKENS = 16
# int4's 4-bit rows leave more near-ties for the two roundings to split (measured: the first 5, 3, 12 and 16 tokens;
# at "def fibonacci(n):"'s 4th token the gather path's two best tokens are tied to bf16's resolution, -0.958 both,
# and the kernel's fp32 sums put them 0.25 apart)
AGREED_PREFIX = {"int4": 3}
# int2_hadamard: measured (with CONTEXT) the first 10, 7, 5 and 16 tokens agree, and where they part each run's two best
# tokens are 0, 0.063 or 0.125 apart in logprob (one step of a bf16 logit near 16 is 0.125; the other run's choice is
# its second best): a fixed agreed prefix would be 5. Instead, at the first differing token each run's choice may lead
# the other run's by at most TIE_TOLERANCE (three such steps: on an Intel Xeon with avx512_fp16 the two runs already
# part at the first token, which the prefill's fresh-K/V attention gives -- the kernel's bf16 sums against SDPA's over
# the ~95-token prompt, no code read -- 0.3125 apart); a wrong level, trit, scale or turn moves logits by far more.
TIE_TOLERANCE = {"int2_hadamard": 0.375}
# Below level avx512_bf16 --dtype auto serves fp32 with the GGUF blocks' GEMM on int8-quantized activations
# (quant_gemm.h): the two attention paths' fp32 roundings can move an activation across an int8 step, so near-ties
# split for every format there (measured at avx512_vnni, int8 KV: the first prompt's 6th token, whose two best tokens
# are 0.24 and 0.05 apart in logprob in the two runs, each run's choice the other's second best; with the weights
# dequantized instead, --dtype float32, the two paths agree on all 16 tokens of every prompt). The tie rule then.
INT8_ACTIVATION_TIE_TOLERANCE = 0.375
# int2_hadamard (and int4) keep a request's last 16 tokens in bf16 (the recent window): the prompts above would leave
# almost every key in the ring. A shared ~90-token context before them puts most of each decode step's keys in codes.
CONTEXT = ("Rivers shape the land they cross. Over thousands of years a river carves a valley, carries sand and silt "
           "downstream, and builds a delta where it meets the sea. Farmers settled along rivers because the floods "
           "left fertile soil behind, and towns grew at the places where a river could be crossed or where boats "
           "could stop. Many of the great cities of the world stand on a river for that reason. ")


def greedy(engine, prompts=PROMPTS, top=0):
    """Each prompt's greedy tokens, and (top > 0) each position's top logprobs [(logprob, token, text), ...]."""
    outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True},
                           return_logprob=top > 0, top_logprobs_num=top)
    return [o["output_ids"] for o in outs], [o["meta_info"]["output_top_logprobs"] if top else None for o in outs]


@unittest.skipUnless(kv_quant_kernels_expected(), "the quantized-KV CPU kernels do not run at this CPU level")
class TestQuantKernelEngine(unittest.TestCase):
    def run_format(self, fmt, prompts=PROMPTS):
        # 1.5 GB: at level avx512_vnni the model runs in fp32, and with fp8_e5m2's ring (56 + 4 bf16 tokens a slot,
        # 0.33 GiB for the default 256 slots) 1 GB does not fit
        engine = Engine(max_total_memory_gb=1.5, kv_cache_dtype=fmt, disable_radix_cache=True, log_level="warning")
        try:
            backend = engine.scheduler.model_runner.attn_backend
            self.assertIsNotNone(backend.cpu_quant_ops, f"{fmt}: the backend did not take the quantized-KV kernel")
            # the plan knew: the kernels' extend workspace, no gather transient
            self.assertTrue(backend.inputs.fused_cpu_decode)
            self.assertEqual([d.name for d in declare("torch_native", backend.inputs)], ["extend_attention"])
            self.assertGreaterEqual(backend.inputs.shape.kv_rotated_parts, 1)
            calls = []
            ops = backend.cpu_quant_ops

            class Counting:  # counts the kernel's calls, so a silent fallback to the torch path fails the test
                def __getattr__(self, name):
                    return getattr(ops, name)

                def extend_attention_quant(self, q, *args):
                    calls.append(("codes", q.shape[0]))
                    return ops.extend_attention_quant(q, *args)

                def extend_attention(self, q, *args):
                    calls.append(("fresh", q.shape[0]))
                    return ops.extend_attention(q, *args)

            backend.cpu_quant_ops = Counting()
            tie = TIE_TOLERANCE.get(fmt)
            if engine.scheduler.model_runner.model_config.dtype == torch.float32:
                tie = tie or INT8_ACTIVATION_TIE_TOLERANCE
            kernel, kernel_top = greedy(engine, prompts, 5 if tie else 0)
            self.assertIn(("codes", len(PROMPTS)), calls, "no batched decode step read the codes through the kernel")
            self.assertTrue(any(k == "fresh" and n > len(PROMPTS) for k, n in calls), "no prefill took the kernel")
            backend.cpu_quant_ops = None  # the torch gather path, same engine and pool
            torch_path, torch_top = greedy(engine, prompts, 5 if tie else 0)
            print(f"\n{fmt}: kernel {kernel}\n{fmt}: torch  {torch_path}")
            if tie:
                for a, b, top_a, top_b in zip(kernel, torch_path, kernel_top, torch_top):
                    self.assert_tie(a, b, top_a, top_b, tie)
            else:
                n = AGREED_PREFIX.get(fmt, 8)
                for a, b in zip(kernel, torch_path):
                    self.assertEqual(a[:n], b[:n], (kernel, torch_path))
            assert_idle_and_intact(engine)
        finally:
            shutdown(engine)

    def assert_tie(self, a, b, top_a, top_b, tie):
        """Tokens a and b agree up to their first difference i, where each run's choice leads the other's by <= tie."""
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if i is None:
            return
        for own, other, top in ((a[i], b[i], top_a[i]), (b[i], a[i], top_b[i])):
            lp = {tok: logprob for logprob, tok, *_ in top}
            self.assertIn(other, lp, f"token {i}: {other} not among the other run's top {len(top)}: {top} ({a} / {b})")
            self.assertLessEqual(lp[own] - lp[other], tie, f"token {i}: no tie, {top} ({a} / {b})")

    def test_int8(self):
        self.run_format("int8")

    def test_int4(self):
        self.run_format("int4")

    def test_int2_hadamard(self):
        self.run_format("int2_hadamard", [CONTEXT + p for p in PROMPTS])

    def test_fp8_e4m3(self):
        self.run_format("fp8_e4m3")

    def test_fp8_e5m2(self):
        self.run_format("fp8_e5m2")


if __name__ == "__main__":
    unittest.main()
