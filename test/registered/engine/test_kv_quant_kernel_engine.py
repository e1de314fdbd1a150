"""The CPU attention kernel over quantized KV codes (extend_attention_quant) through sglang.Engine, the default model:
for --kv-cache-dtype int8, int4, int2_hadamard, fp8_e4m3 and fp8_e5m2 the torch_native backend really takes the
kernels (a prefill without a cached prefix attends to its fresh K/V through extend_attention, as the torch path does;
every later chunk and every decode step reads the cached tokens' codes through extend_attention_quant and the new
tokens' own K/V as computed, as the torch path does), and what it computes is as close to the bf16-KV model as the
torch gather path (the pool's own dequantization rounded to bf16 + SDPA) on the same engine, pool and weights.

The comparison is teacher-forced, so it does not hinge on argmax near-ties (which split either way with the CPU's
rounding: greedy tokens compared token by token failed on an AMD Zen 4). One fixed token sequence per prompt (the
prompt and the bf16-KV model's greedy continuation) is prefilled in chunks of CHUNK tokens, so every chunk after the
first attends the earlier ones through their codes, and each position's logprob of its next token is taken
(input_token_logprobs) three ways: the kernel (K), the torch gather path (T), the bf16-KV model (B, the reference).
K and T read the same codes; T additionally rounds each dequantized element to bf16 (relative error <= 2^-9), far
below every format's own code step (int8 2^-7 of a row's range, fp8 2^-4 / 2^-3 relative, int4 2^-4, int2 ~2^-1).
So the kernel's mean distance to B must be the gather path's within what rounding noise alone moves a mean over
these positions: mean|K - B| <= RATIO x mean|T - B| + NOISE_NATS. A wrong scale moves the kernel's logprobs by far
more (checked by breaking it: every format's key scale doubled (int2's log-scale code + 12) puts mean|K - B| at
0.39-1.50 against bounds of 0.13-0.33; int2's value scale doubled, 0.40 > 0.33; int8's key scale 10% high, 0.167 >
0.134). Smaller errors hide in the rounding noise here, since the bf16 sink and recent-window tokens take most of
the attention weight; the kernel's own accuracy is tested against fp64 in test_cpu_quant_attention.py. At level
avx512_vnni (no BF16: --dtype auto serves fp32, and the kernel reads the codes with fp32 queries)
test_kv_quant_kernel_levels.py runs this file too; the reference is computed at the same level.
"""

import unittest

from sglang import Engine
from sglang.jit_kernel.cpu_ops import kv_quant_kernels_expected
from sglang.srt.mem_plan.backends import declare
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, shutdown

register_cpu_ci(est_time=30, suite="cpu")

# int2_hadamard (and int4) keep a request's last 16 tokens in bf16 (the recent window): short prompts would leave
# almost every key in the ring. A shared ~90-token context before them puts most keys of the later chunks in codes.
CONTEXT = ("Rivers shape the land they cross. Over thousands of years a river carves a valley, carries sand and silt "
           "downstream, and builds a delta where it meets the sea. Farmers settled along rivers because the floods "
           "left fertile soil behind, and towns grew at the places where a river could be crossed or where boats "
           "could stop. Many of the great cities of the world stand on a river for that reason. ")
PROMPTS = [CONTEXT + p for p in ("The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
                                 "Once upon a time, in a small village,")]
NEW_TOKENS = 16
CHUNK = 16  # chunked_prefill_size: 6-7 chunks a sequence, each after the first reading the codes of the ones before
# Rounding alone (bf16 activations, or at avx512_vnni fp32 activations on int8-quantized GEMM inputs) moves a
# teacher-forced logprob by ~0.1 nat on average between two equivalent computations (measured: mean|K - T| 0.11 for
# int2_hadamard on an Intel Xeon with AMX); these bounds leave that noise room and nothing a wrong scale needs.
RATIO = 1.25
NOISE_NATS = 0.05


def engine_for(kv_cache_dtype: str) -> Engine:
    # 1.5 GB: at level avx512_vnni the model runs in fp32, and with fp8_e5m2's ring 1 GB does not fit
    return Engine(max_total_memory_gb=1.5, kv_cache_dtype=kv_cache_dtype, disable_radix_cache=True,
                  chunked_prefill_size=CHUNK, log_level="warning")


def forced_logprobs(engine, seqs):
    """Each sequence's logprob of its token i + 1 after its first i + 1 tokens, for i >= CHUNK (positions whose
    chunk reads earlier chunks' codes), prefilled in chunks of CHUNK tokens."""
    outs = engine.generate(input_ids=seqs, sampling_params={"temperature": 0, "max_new_tokens": 1},
                           return_logprob=True, logprob_start_len=0)
    return [[lp for lp, *_ in o["meta_info"]["input_token_logprobs"]][CHUNK + 1:] for o in outs]


def mean_distance(a, b) -> float:
    pairs = [(x, y) for xs, ys in zip(a, b) for x, y in zip(xs, ys)]
    return sum(abs(x - y) for x, y in pairs) / len(pairs)


@unittest.skipUnless(kv_quant_kernels_expected(), "the quantized-KV CPU kernels do not run at this CPU level")
class TestQuantKernelEngine(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        engine = engine_for("auto")  # the reference: bf16 KV (fp32 at avx512_vnni), nothing quantized
        try:
            outs = engine.generate(PROMPTS, {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True})
            prompt_ids = engine.generate(PROMPTS, {"max_new_tokens": 1}, return_logprob=True, logprob_start_len=0)
            cls.seqs = [[t for _, t, *_ in p["meta_info"]["input_token_logprobs"]] + o["output_ids"]
                        for p, o in zip(prompt_ids, outs)]
            cls.reference = forced_logprobs(engine, cls.seqs)
        finally:
            shutdown(engine)

    def run_format(self, fmt):
        engine = engine_for(fmt)
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
            engine.generate(PROMPTS, {"temperature": 0, "max_new_tokens": 2, "ignore_eos": True})
            self.assertIn(("codes", len(PROMPTS)), calls, "no batched decode step read the codes through the kernel")
            self.assertIn(("fresh", CHUNK), calls, "no first chunk took the kernel")
            self.assertIn(("codes", CHUNK), calls, "no later chunk read the codes through the kernel")
            kernel = forced_logprobs(engine, self.seqs)
            backend.cpu_quant_ops = None  # the torch gather path, same engine and pool
            torch_path = forced_logprobs(engine, self.seqs)
            assert_idle_and_intact(engine)
        finally:
            shutdown(engine)
        to_ref, torch_to_ref = mean_distance(kernel, self.reference), mean_distance(torch_path, self.reference)
        between = mean_distance(kernel, torch_path)
        print(f"\n{fmt}: mean |logprob diff| kernel-bf16 {to_ref:.4f}, torch-bf16 {torch_to_ref:.4f}, "
              f"kernel-torch {between:.4f} over {sum(map(len, kernel))} positions")
        self.assertLessEqual(to_ref, RATIO * torch_to_ref + NOISE_NATS, f"{fmt}: the kernel is farther from the "
                             f"bf16-KV model than the torch gather path reading the same codes")

    def test_int8(self):
        self.run_format("int8")

    def test_int4(self):
        self.run_format("int4")

    def test_int2_hadamard(self):
        self.run_format("int2_hadamard")

    def test_fp8_e4m3(self):
        self.run_format("fp8_e4m3")

    def test_fp8_e5m2(self):
        self.run_format("fp8_e5m2")


if __name__ == "__main__":
    unittest.main()
